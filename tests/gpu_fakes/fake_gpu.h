/* What the fake libcuda and the fake libnvidia-ml share: the node, the processes, the log.
 *
 * The node: TORPOR_FAKE_GPU_DIR names a directory; its node.conf lists the node's GPUs and
 * driver (key=value lines, written by tests/gpu_fakes/__init__.py):
 *
 *     driver_version=580.65.06          cuda_driver_version=13000
 *     gpu.0.uuid=GPU-...                gpu.0.name=NVIDIA H200       gpu.0.architecture=9
 *     gpu.0.cc=9.0                      gpu.0.memory_total=BYTES     gpu.0.memory_used=BYTES
 *     gpu.0.pci_bus_id=00000000:19:00.0 gpu.0.pci_device_id=0x233510DE
 *     gpu.0.mig=0 (1 on, -1 unsupported) gpu.0.persistence=1         gpu.0.minor=0
 *     gpu.0.lost=1 (optional: NVML answers NVML_ERROR_GPU_IS_LOST about this GPU's memory)
 *     restore_tid_error=304 (optional: every cuCheckpointProcessGetRestoreThreadId fails so)
 *     block_cap_ms=120000 (optional: how long a call that blocks may block before the fake
 *                          aborts its caller; the real driver has no such limit)
 *
 * A CUDA process: one whose environment holds FAKE_CUDA_TOKEN=<token> and
 * FAKE_CUDA_STATE=<slot>, optionally FAKE_CUDA_MEM=<bytes on its 1st GPU>[,<2nd>...] and
 * FAKE_CUDA_MPS=1 (a client of an MPS server). The slot is the driver's per-process state,
 * kept where the real driver keeps it: in the process's own memory. It is the value of
 * FAKE_CUDA_STATE inside the process's environment block, read through /proc/PID/environ and
 * rewritten in place through /proc/PID/mem:
 *
 *     slot[0]      R running, L locked, C checkpointed, F failed
 *     slot[1]      1 once a restore ran out of GPU memory (every restore then fails), else 0
 *     slot[2..]    the UUIDs ("GPU-" + 36 characters) of the GPUs the process can see, comma
 *                  separated: the GPUs the driver checkpoints for it. It holds FAKE_CUDA_MEM
 *                  bytes on each; one it holds nothing on is seen but not listed by NVML
 *
 * So the state survives across separate callers and across a CRIU dump and restore (a
 * restored copy of a process checkpointed with --leave-running is CHECKPOINTED, whatever the
 * original did since), and the process can watch its own state (getenv). After each change
 * the fake also writes <dir>/<token>.state, for people reading along.
 *
 * The driver's restore thread: the thread of the process named "cuda-restore" (gpuworker
 * starts one; a process without one uses its main thread). The driver does its work on it, so
 * state queries, checkpoint, restore and unlock wait while that thread cannot run (its cgroup
 * is frozen, or it is stopped by a signal or a tracer). A process whose every other thread is
 * stopped or frozen is logged as app=stopped.
 *
 * Failures are injected with <dir>/<token>.fail or <dir>/pid-<pid>.fail, one line per
 * operation, `op=RESULT[MODIFIERS]`; op is lock, checkpoint, restore, unlock, state or
 * restore_tid; RESULT is a CUresult, or `hang` (the call blocks, as a hung driver does).
 * Modifiers: `*N` the next N calls only; `!` the process becomes FAILED; `+` the operation
 * takes effect and still returns RESULT (`hang+`: takes effect, then never returns).
 * <dir>/<token>.busy makes a lock wait (and time out) as if CUDA work never finished.
 * Every call is appended to <dir>/calls.log:
 *
 *     REALTIME_NS MONOTONIC_NS OP pid=PID token=TOKEN result=CODE before=STATE after=STATE
 *         frozen=0|1 app=running|stopped [timeout_ms=N] [pairs=OLD>NEW,...] [note=...]
 */
#ifndef TORPOR_FAKE_GPU_H
#define TORPOR_FAKE_GPU_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FAKE_MAX_GPUS 16
#define FAKE_UUID_LEN 40
#define FAKE_PROC_GPUS 8
#define FAKE_SLOT_MAX (2 + FAKE_PROC_GPUS * (FAKE_UUID_LEN + 1))
#define FAKE_TOKEN_MAX 128
#define FAKE_BLOCK_CAP_MS 120000

struct fake_gpu {
    char uuid[FAKE_UUID_LEN + 1];
    char name[96];
    char pci_bus_id[32];
    unsigned architecture, pci_device_id, minor;
    int cc_major, cc_minor, mig, persistence, lost;
    unsigned long long memory_total, memory_used;
};

struct fake_node {
    char driver_version[80];
    int cuda_driver_version;
    int restore_tid_error;
    long block_cap_ms;
    int count;
    struct fake_gpu gpus[FAKE_MAX_GPUS];
};

struct fake_proc {
    int pid;
    char token[FAKE_TOKEN_MAX];
    char slot[FAKE_SLOT_MAX + 1];
    int slot_len;
    unsigned long long slot_addr; /* where slot[0] lives in the process */
    int ngpus;
    char gpus[FAKE_PROC_GPUS][FAKE_UUID_LEN + 1]; /* parsed from slot[2..] */
    unsigned long long mem[FAKE_PROC_GPUS];       /* bytes held on each while running or locked */
    int mps;
};

__attribute__((unused)) static const char *fake_dir(void) {
    const char *dir = getenv("TORPOR_FAKE_GPU_DIR");
    return dir && *dir ? dir : NULL;
}

__attribute__((unused)) static int fake_path(char *out, size_t size, const char *fmt, const char *a) {
    const char *dir = fake_dir();
    if (!dir) return -1;
    int n = snprintf(out, size, "%s/", dir);
    n += snprintf(out + n, size - n, fmt, a);
    return n < (int)size ? 0 : -1;
}

/* The whole of a small file, NUL-terminated; NULL when absent. */
__attribute__((unused)) static char *fake_read_file(const char *path, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        n += got;
    }
    close(fd);
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

__attribute__((unused)) static void fake_copy(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src);
}

/* node.conf -> node; -1 when there is no directory or no file (no driver on this node). */
__attribute__((unused)) static int fake_load_node(struct fake_node *node) {
    char path[4096];
    memset(node, 0, sizeof *node);
    node->block_cap_ms = FAKE_BLOCK_CAP_MS;
    if (fake_path(path, sizeof path, "%s", "node.conf")) return -1;
    char *text = fake_read_file(path, NULL);
    if (!text) return -1;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(line, '=');
        if (!eq || line[0] == '#') continue;
        *eq = 0;
        const char *key = line, *val = eq + 1;
        if (!strcmp(key, "driver_version")) fake_copy(node->driver_version, 80, val);
        else if (!strcmp(key, "cuda_driver_version")) node->cuda_driver_version = atoi(val);
        else if (!strcmp(key, "restore_tid_error")) node->restore_tid_error = atoi(val);
        else if (!strcmp(key, "block_cap_ms")) node->block_cap_ms = atol(val);
        else if (!strncmp(key, "gpu.", 4)) {
            char *dot;
            long i = strtol(key + 4, &dot, 10);
            if (*dot != '.' || i < 0 || i >= FAKE_MAX_GPUS) continue;
            struct fake_gpu *g = &node->gpus[i];
            const char *f = dot + 1;
            if (i + 1 > node->count) node->count = i + 1;
            if (!strcmp(f, "uuid")) fake_copy(g->uuid, sizeof g->uuid, val);
            else if (!strcmp(f, "name")) fake_copy(g->name, sizeof g->name, val);
            else if (!strcmp(f, "pci_bus_id")) fake_copy(g->pci_bus_id, sizeof g->pci_bus_id, val);
            else if (!strcmp(f, "architecture")) g->architecture = strtoul(val, NULL, 0);
            else if (!strcmp(f, "pci_device_id")) g->pci_device_id = strtoul(val, NULL, 0);
            else if (!strcmp(f, "minor")) g->minor = strtoul(val, NULL, 0);
            else if (!strcmp(f, "cc")) sscanf(val, "%d.%d", &g->cc_major, &g->cc_minor);
            else if (!strcmp(f, "mig")) g->mig = atoi(val);
            else if (!strcmp(f, "persistence")) g->persistence = atoi(val);
            else if (!strcmp(f, "lost")) g->lost = atoi(val);
            else if (!strcmp(f, "memory_total")) g->memory_total = strtoull(val, NULL, 0);
            else if (!strcmp(f, "memory_used")) g->memory_used = strtoull(val, NULL, 0);
        }
    }
    free(text);
    return 0;
}

__attribute__((unused)) static int fake_gpu_index(const struct fake_node *node, const char *uuid) {
    for (int i = 0; i < node->count; i++)
        if (!strncmp(node->gpus[i].uuid, uuid, FAKE_UUID_LEN)) return i;
    return -1;
}

/* env_start of a process (field 50 of /proc/PID/stat), 0 when unknown. */
__attribute__((unused)) static unsigned long long fake_env_start(int pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    char *text = fake_read_file(path, NULL);
    if (!text) return 0;
    char *p = strrchr(text, ')'); /* the command name may hold spaces */
    unsigned long long value = 0;
    if (p) {
        int field = 2;
        char *save = NULL;
        for (char *tok = strtok_r(p + 1, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
            if (++field == 50) {
                value = strtoull(tok, NULL, 10);
                break;
            }
    }
    free(text);
    return value;
}

/* slot[2..] -> proc->gpus; FAKE_CUDA_MEM's list -> proc->mem. */
__attribute__((unused)) static void fake_parse_gpus(struct fake_proc *proc, const char *mem) {
    proc->ngpus = 0;
    for (int off = 2; off + FAKE_UUID_LEN <= proc->slot_len && proc->ngpus < FAKE_PROC_GPUS;
         off += FAKE_UUID_LEN + 1) {
        memcpy(proc->gpus[proc->ngpus], proc->slot + off, FAKE_UUID_LEN);
        proc->gpus[proc->ngpus++][FAKE_UUID_LEN] = 0;
    }
    for (int i = 0; i < FAKE_PROC_GPUS; i++) proc->mem[i] = 0;
    for (int i = 0; mem && *mem && i < proc->ngpus; i++) {
        char *end;
        proc->mem[i] = strtoull(mem, &end, 10);
        mem = *end == ',' ? end + 1 : "";
    }
}

/* Is `pid` a CUDA process? Fills `proc` from its environment: 1 yes, 0 no. */
__attribute__((unused)) static int fake_find_proc(int pid, struct fake_proc *proc) {
    char path[64];
    size_t len;
    memset(proc, 0, sizeof *proc);
    proc->pid = pid;
    snprintf(path, sizeof path, "/proc/%d/environ", pid);
    char *env = fake_read_file(path, &len);
    if (!env) return 0;
    long slot_offset = -1;
    char mem[512] = "";
    for (size_t off = 0; off < len; off += strlen(env + off) + 1) {
        const char *var = env + off;
        if (!strncmp(var, "FAKE_CUDA_TOKEN=", 16)) fake_copy(proc->token, FAKE_TOKEN_MAX, var + 16);
        else if (!strncmp(var, "FAKE_CUDA_MEM=", 14)) fake_copy(mem, sizeof mem, var + 14);
        else if (!strncmp(var, "FAKE_CUDA_MPS=1", 15)) proc->mps = 1;
        else if (!strncmp(var, "FAKE_CUDA_STATE=", 16) && strlen(var + 16) >= 2 + FAKE_UUID_LEN
                 && strlen(var + 16) <= FAKE_SLOT_MAX) {
            slot_offset = (long)off + 16;
            proc->slot_len = (int)strlen(var + 16);
            memcpy(proc->slot, var + 16, proc->slot_len);
        }
    }
    free(env);
    if (!proc->token[0] || slot_offset < 0) return 0;
    unsigned long long start = fake_env_start(pid);
    if (!start) return 0;
    proc->slot_addr = start + slot_offset;
    fake_parse_gpus(proc, mem);
    return 1;
}

/* Write the slot (state, wedged flag, GPUs) back into the process's memory. */
__attribute__((unused)) static int fake_store_slot(struct fake_proc *proc) {
    char path[64];
    for (int i = 0; i < proc->ngpus; i++)
        memcpy(proc->slot + 2 + i * (FAKE_UUID_LEN + 1), proc->gpus[i], FAKE_UUID_LEN);
    snprintf(path, sizeof path, "/proc/%d/mem", proc->pid);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = pwrite(fd, proc->slot, proc->slot_len, (off_t)proc->slot_addr);
    close(fd);
    return n == proc->slot_len ? 0 : -1;
}

__attribute__((unused)) static const char *fake_state_word(char c) {
    switch (c) {
    case 'R': return "RUNNING";
    case 'L': return "LOCKED";
    case 'C': return "CHECKPOINTED";
    case 'F': return "FAILED";
    default: return "-";
    }
}

/* Is the process's freezer cgroup frozen (v1 freezer.state, v2 cgroup.events)? */
__attribute__((unused)) static int fake_frozen(int pid) {
    char path[4096];
    snprintf(path, sizeof path, "/proc/%d/cgroup", pid);
    char *text = fake_read_file(path, NULL);
    if (!text) return 0;
    int frozen = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = 0;
        const char *controllers = c1 + 1, *cg = c2 + 1;
        char *state = NULL;
        if (strstr(controllers, "freezer")) {
            snprintf(path, sizeof path, "/sys/fs/cgroup/freezer%s/freezer.state", cg);
            state = fake_read_file(path, NULL);
            frozen = state && (!strncmp(state, "FROZEN", 6) || !strncmp(state, "FREEZING", 8));
        } else if (!strcmp(line, "0") && !*controllers) {
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/cgroup.events", cg);
            state = fake_read_file(path, NULL);
            frozen = state && strstr(state, "frozen 1") != NULL;
        }
        free(state);
        if (frozen) break;
    }
    free(text);
    return frozen;
}

/* The scheduler state letter of one thread (R, S, D, T stopped, t traced...); 0 if gone. */
__attribute__((unused)) static char fake_thread_state(int pid, int tid) {
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/task/%d/stat", pid, tid);
    char *text = fake_read_file(path, NULL);
    if (!text) return 0;
    char *p = strrchr(text, ')');
    char state = p && p[1] == ' ' ? p[2] : 0;
    free(text);
    return state;
}

__attribute__((unused)) static int fake_thread_stopped(int pid, int tid) {
    char s = fake_thread_state(pid, tid);
    return s == 'T' || s == 't';
}

/* The driver's restore thread: the thread named cuda-restore, else the main thread. */
__attribute__((unused)) static int fake_restore_tid(int pid) {
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    int found = pid;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        int tid = atoi(de->d_name);
        if (tid <= 0) continue;
        snprintf(path, sizeof path, "/proc/%d/task/%d/comm", pid, tid);
        char *comm = fake_read_file(path, NULL);
        int match = comm && !strncmp(comm, "cuda-restore", 12);
        free(comm);
        if (match) {
            found = tid;
            break;
        }
    }
    if (d) closedir(d);
    return found;
}

/* Can the restore thread run (not frozen, not stopped)? */
__attribute__((unused)) static int fake_restore_thread_runs(int pid) {
    return !fake_frozen(pid) && !fake_thread_stopped(pid, fake_restore_tid(pid));
}

/* Are all the process's threads but the restore thread stopped or frozen (its application
 * code cannot run)? */
__attribute__((unused)) static int fake_app_stopped(int pid) {
    if (fake_frozen(pid)) return 1;
    char path[96];
    int restore = fake_restore_tid(pid), stopped = 1, others = 0;
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        int tid = atoi(de->d_name);
        if (tid <= 0 || tid == restore) continue;
        others++;
        if (!fake_thread_stopped(pid, tid)) stopped = 0;
    }
    if (d) closedir(d);
    return others ? stopped : fake_thread_stopped(pid, pid);
}

/* Bytes that other running or locked CUDA processes hold on the GPU `uuid`, skipping `pid`. */
__attribute__((unused)) static unsigned long long fake_used_by_processes(const char *uuid, int skip_pid) {
    unsigned long long used = 0;
    DIR *d = opendir("/proc");
    if (!d) return 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int pid = atoi(de->d_name);
        struct fake_proc p;
        if (pid <= 0 || pid == skip_pid || !fake_find_proc(pid, &p)) continue;
        if (p.slot[0] != 'R' && p.slot[0] != 'L') continue;
        for (int i = 0; i < p.ngpus; i++)
            if (!strncmp(p.gpus[i], uuid, FAKE_UUID_LEN)) used += p.mem[i];
    }
    closedir(d);
    return used;
}

__attribute__((unused)) static void fake_append(const char *name, const char *line) {
    char path[4096];
    if (fake_path(path, sizeof path, "%s", name)) return;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    ssize_t ignored = write(fd, line, strlen(line));
    (void)ignored;
    close(fd);
}

__attribute__((unused)) static long long fake_now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

__attribute__((unused)) static void fake_sleep_ms(int ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

#endif
