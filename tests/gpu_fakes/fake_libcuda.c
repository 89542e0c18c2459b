/* A fake libcuda.so.1 for torpor's tests: the CUDA driver's process checkpoint API.
 *
 * Each behaviour below is the real driver's, with where it is documented. "Reference" is
 * NVIDIA's CUDA Driver API reference, group CUDA_CHECKPOINT (cuCheckpointProcess*), whose text
 * is also in cuda.h (12.8 and 13.0); "CRIU" is checkpoint-restore/criu plugins/cuda/
 * (cuda_plugin.c, and cuda_plugin_driver.c, its driver-API backend, PR 3076); issue numbers
 * are NVIDIA/cuda-checkpoint's unless named otherwise.
 *
 * The state machine (reference, cuda.h CUprocessState):
 *   lock        RUNNING -> LOCKED        "If timeoutMs is reached the process will be left in
 *                                        the RUNNING state": CUDA_ERROR_NOT_READY, the result
 *                                        the reference adds for lock only; timeoutMs 0 is "no
 *                                        timeout": it waits for ever. It waits while the
 *                                        process's threads cannot run: "cuda-checkpoint is not
 *                                        able to perform a 'lock' action on frozen threads"
 *                                        (CRIU commit 4196268ee), or while CUDA work does not
 *                                        finish (the README: lock waits for submitted work)
 *   checkpoint  LOCKED -> CHECKPOINTED   GPU memory moves to the host: the GPU is free again
 *   restore     CHECKPOINTED -> LOCKED
 *   unlock      LOCKED -> RUNNING
 * Any other starting state is CUDA_ERROR_ILLEGAL_STATE. The 64-byte argument structs must have
 * their reserved bytes zeroed ("Reserved for future use, must be zeroed": INVALID_VALUE).
 *
 * The restore thread. The driver works on a thread inside the process (the README; CRIU
 * "PTRACE_CONT"s only that thread for checkpoint and for restore + unlock, while every other
 * thread stays stopped). So checkpoint, restore, unlock and state queries wait while that
 * thread cannot run: "State queries can block while the CUDA restore thread is frozen. Query
 * only after resuming it" (CRIU, resume_device). cuCheckpointProcessGetRestoreThreadId does
 * not: CRIU asks it of tasks it holds stopped. Only the lock takes a timeout (cuda.h: only
 * CUcheckpointLockArgs has timeoutMs), so a call that waits waits for ever; the fake gives up
 * after block_cap_ms (node.conf) by aborting its caller: a test reaching it found a call torpor
 * did not bound.
 *
 * Not a CUDA process: CUDA_ERROR_INVALID_VALUE, which CRIU and NVIDIA's cuda-checkpoint-helper
 * (ai-dynamo/snapshot) read, with NOT_INITIALIZED, as "no CUDA restore thread". Some setups
 * answer every restore-thread or state query with CUDA_ERROR_OPERATING_SYSTEM, "OS call failed
 * or operation not supported on this OS" (issues 6 and 37; kaito-project/grit issue 9, under
 * CRIU's plugin): node.conf restore_tid_error=304.
 *
 * Restore:
 *   - "requires persistence mode to be enabled or cuInit to have been called before execution"
 *     (reference); CRIU calls cuInit(0) in the calling process before its first restore. The
 *     fake needs persistence mode on every GPU restored onto, or cuInit in the caller, and
 *     answers CUDA_ERROR_NOT_INITIALIZED (a result the reference lists for restore) otherwise.
 *   - GPU UUID pairs (CUDA 13.0, driver 580; in CUDA 12.x the whole struct is reserved):
 *     "If an array of GPU UUID pairs is specified, it must contain every checkpointed GPU"
 *     (reference): the GPUs in the process's slot, those it holds no memory on included. A
 *     list that misses one, or names a GPU not on this node: CUDA_ERROR_INVALID_VALUE (issue
 *     35, "invalid argument").
 *   - without pairs, onto a GPU this node does not have: CUDA_ERROR_NOT_SUPPORTED (a restore
 *     onto a GPU the process cannot reach, ai-dynamo/snapshot issue 379; "operation not
 *     supported" in issue 27).
 *   - "The GPU to restore onto needs to have enough memory" (reference): else
 *     CUDA_ERROR_OUT_OF_MEMORY, after which every restore fails with
 *     CUDA_ERROR_OPERATING_SYSTEM and unlock with ILLEGAL_STATE (issue 44, driver 580.95.05).
 *
 * What the driver does not support (CRIU plugins/cuda/README.md: "NVIDIA UVM Managed Memory,
 * MIG (Multi Instance GPU), and MPS (Multi-Process Service) are currently not supported for
 * checkpointing"): checkpoint answers CUDA_ERROR_NOT_SUPPORTED for a process on a GPU with MIG
 * on, for an MPS client (FAKE_CUDA_MPS=1), and for a process with UVM managed memory: a
 * mapping of /dev/nvidia-uvm other than the CUDA runtime's own 2 MiB window, which every CUDA
 * process maps (both seen on an H200 with driver 580.159.04: PyTorch and CuPy map the window
 * and checkpoint; 1 GiB of CuPy managed memory adds a 1 GiB mapping, and its checkpoint answers
 * CUDA_ERROR_NOT_SUPPORTED, leaving the process LOCKED, from where unlock resumes it whole).
 *
 * Driver 570 up to 575.57.08, partial GPU passthrough (a process seeing fewer GPUs than the
 * node has): checkpoint and restore answer CUDA_ERROR_NOT_PERMITTED, "operation not
 * permitted" (issue 24, on CHECKPOINT_DEVICES; issue 18, reproduced on 570.86.10; issue 12 for
 * restore; the fix is reported in 575.57.08's release notes, issue 24).
 *
 * A failure can take effect anyway: after a failed lock CRIU asks the state again and unlocks
 * a process that is locked ("CUDA lock failed but pid %d is locked; unlocking it"), and it
 * re-reads the state after failed checkpoints and restores too. Injected with `op=code+`.
 * CU_PROCESS_STATE_FAILED: "Application entered an uncorrectable error during the
 * checkpoint/restore process" (cuda.h); every operation on it is ILLEGAL_STATE. Injected with
 * `op=code!`. See fake_gpu.h for the node, the processes, failure injection and calls.log.
 */
#define _GNU_SOURCE
#include "fake_gpu.h"

#include <stdint.h>

enum {
    SUCCESS = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3,
    OPERATING_SYSTEM = 304, ILLEGAL_STATE = 401, NOT_FOUND = 500,
    NOT_READY = 600, NOT_PERMITTED = 800, NOT_SUPPORTED = 801, UNKNOWN = 999,
};
#define HANG (-1)

static const struct { int code; const char *name, *text; } RESULTS[] = {
    {SUCCESS, "CUDA_SUCCESS", "no error"},
    {INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM",
     "OS call failed or operation not supported on this OS"},
    {ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
     "the operation cannot be performed in the present state"},
    {NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

typedef struct { unsigned int timeoutMs, reserved0; uint64_t reserved1[7]; } LockArgs;
typedef struct { uint64_t reserved[8]; } PlainArgs; /* checkpoint and unlock */
typedef struct { unsigned char bytes[16]; } Uuid;
typedef struct { Uuid oldUuid, newUuid; } GpuPair;
typedef struct {
    GpuPair *gpuPairs;
    unsigned int gpuPairsCount;
    char reserved[52 - sizeof(GpuPair *)];
    uint64_t reserved1;
} RestoreArgs;

_Static_assert(sizeof(LockArgs) == 64, "CUcheckpointLockArgs is 64 bytes");
_Static_assert(sizeof(PlainArgs) == 64, "CUcheckpoint{Checkpoint,Unlock}Args are 64 bytes");
_Static_assert(sizeof(RestoreArgs) == 64, "CUcheckpointRestoreArgs is 64 bytes");
_Static_assert(sizeof(GpuPair) == 32, "CUcheckpointGpuPair is 32 bytes");

#define STATE_CODE(c) ((c) == 'R' ? 0 : (c) == 'L' ? 1 : (c) == 'C' ? 2 : 3)

static int cuinit_done; /* cuInit ran in this (the calling) process */

struct call {
    const char *op;
    struct fake_node node;
    struct fake_proc proc;
    int cuda;
    char before;
    int late;  /* an injected result returned after the operation took effect */
    int hang_after; /* the operation takes effect, then the call never returns */
    char extra[1024];
};

static int zeroed(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

static void note(struct call *c, const char *fmt, const char *value) {
    size_t used = strlen(c->extra);
    snprintf(c->extra + used, sizeof c->extra - used, fmt, value);
}

static int busy(const struct call *c) {
    char path[4096];
    if (fake_path(path, sizeof path, "%s.busy", c->proc.token)) return 0;
    return access(path, F_OK) == 0;
}

/* The driver has no limit here; a test must not hang for ever, so the caller dies instead. */
static void give_up(struct call *c, const char *what) {
    char line[512];
    snprintf(line, sizeof line, "%lld %lld %s pid=%d token=%s result=abort note=%s\n",
             fake_now_ns(CLOCK_REALTIME), fake_now_ns(CLOCK_MONOTONIC), c->op, c->proc.pid,
             c->cuda ? c->proc.token : "-", what);
    fake_append("calls.log", line);
    abort();
}

/* An injected failure for this call: its code (0: none, HANG: block); `mode` '!' (FAILED),
 * '+' (takes effect) or 0. */
static int injected_in(const char *file, const char *op, char *mode) {
    char path[4096];
    if (fake_path(path, sizeof path, "%s", file)) return 0;
    char *text = fake_read_file(path, NULL);
    if (!text) return 0;
    size_t oplen = strlen(op), cap = strlen(text) + 64;
    char *rewritten = calloc(1, cap);
    int code = 0, changed = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!code && !strncmp(line, op, oplen) && line[oplen] == '=') {
            char *end = line + oplen + 1;
            if (!strncmp(end, "hang", 4)) {
                code = HANG;
                end += 4;
            } else {
                code = (int)strtol(end, &end, 10);
            }
            long times = -1;
            *mode = 0;
            for (; *end; end++) {
                if (*end == '*') times = strtol(end + 1, &end, 10), end--;
                else if (*end == '!' || *end == '+') *mode = *end;
            }
            if (times > 0) {
                changed = 1;
                if (times > 1) {
                    size_t n = strlen(rewritten);
                    if (code == HANG) snprintf(rewritten + n, cap - n, "%s=hang", op);
                    else snprintf(rewritten + n, cap - n, "%s=%d", op, code);
                    n = strlen(rewritten);
                    snprintf(rewritten + n, cap - n, "*%ld%s\n", times - 1,
                             *mode == '!' ? "!" : *mode == '+' ? "+" : "");
                }
                continue;
            }
        }
        snprintf(rewritten + strlen(rewritten), cap - strlen(rewritten), "%s\n", line);
    }
    if (changed) {
        int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
        if (fd >= 0) {
            ssize_t ignored = write(fd, rewritten, strlen(rewritten));
            (void)ignored;
            close(fd);
        }
    }
    free(rewritten);
    free(text);
    return code;
}

static int injected(struct call *c, const char *op, char *mode) {
    char name[FAKE_TOKEN_MAX + 16];
    int code = 0;
    *mode = 0;
    if (c->cuda) {
        snprintf(name, sizeof name, "%s.fail", c->proc.token);
        code = injected_in(name, op, mode);
    }
    if (!code) {
        snprintf(name, sizeof name, "pid-%d.fail", c->proc.pid);
        code = injected_in(name, op, mode);
    }
    return code;
}

static void mirror_state(const struct call *c) {
    char path[4096], line[1024];
    if (fake_path(path, sizeof path, "%s.state", c->proc.token)) return;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    int n = snprintf(line, sizeof line, "state=%s pid=%d gpu=%.40s wedged=%c gpus=",
                     fake_state_word(c->proc.slot[0]), c->proc.pid, c->proc.gpus[0],
                     c->proc.slot[1]);
    for (int i = 0; i < c->proc.ngpus && n < (int)sizeof line - 48; i++)
        n += snprintf(line + n, sizeof line - n, "%s%s", i ? "," : "", c->proc.gpus[i]);
    snprintf(line + n, sizeof line - n, "\n");
    ssize_t ignored = write(fd, line, strlen(line));
    (void)ignored;
    close(fd);
}

static int finish(struct call *c, int result) {
    char line[2048];
    if (!result && c->late) result = c->late;
    if (c->hang_after) note(c, " note=%s", "hangs-after-taking-effect");
    snprintf(line, sizeof line,
             "%lld %lld %s pid=%d token=%s result=%d before=%s after=%s frozen=%d app=%s%s\n",
             fake_now_ns(CLOCK_REALTIME), fake_now_ns(CLOCK_MONOTONIC), c->op, c->proc.pid,
             c->cuda ? c->proc.token : "-", result, c->cuda ? fake_state_word(c->before) : "-",
             c->cuda ? fake_state_word(c->proc.slot[0]) : "-", fake_frozen(c->proc.pid),
             c->cuda && fake_app_stopped(c->proc.pid) ? "stopped" : "running", c->extra);
    fake_append("calls.log", line);
    if (c->cuda && c->proc.slot[0] != c->before) mirror_state(c);
    if (c->hang_after) {
        long long start = fake_now_ns(CLOCK_MONOTONIC);
        while (fake_now_ns(CLOCK_MONOTONIC) - start < c->node.block_cap_ms * 1000000LL)
            fake_sleep_ms(10);
        give_up(c, "injected-hang");
    }
    return result;
}

/* Start a call on `pid`: 0, or the result to finish with. */
static int begin(struct call *c, const char *op, int pid) {
    memset(c, 0, sizeof *c);
    c->op = op;
    c->proc.pid = pid;
    if (fake_load_node(&c->node)) return NOT_INITIALIZED;
    c->cuda = fake_find_proc(pid, &c->proc);
    c->proc.pid = pid;
    if (!c->cuda) return INVALID_VALUE;
    c->before = c->proc.slot[0];
    char mode;
    int code = injected(c, op, &mode);
    if (code == HANG && mode == '+') {
        c->hang_after = 1;
        return 0;
    }
    if (code == HANG) {
        long long start = fake_now_ns(CLOCK_MONOTONIC);
        while (fake_now_ns(CLOCK_MONOTONIC) - start < c->node.block_cap_ms * 1000000LL)
            fake_sleep_ms(10);
        give_up(c, "injected-hang");
    }
    if (code && mode == '!') {
        c->proc.slot[0] = 'F';
        fake_store_slot(&c->proc);
    }
    if (code && mode == '+') {
        c->late = code;
        return 0;
    }
    return code;
}

static int set_state(struct call *c, char state) {
    c->proc.slot[0] = state;
    return fake_store_slot(&c->proc) ? UNKNOWN : SUCCESS;
}

/* The driver's work runs on its restore thread: wait (for ever, as the driver does) while that
 * thread is frozen or stopped. */
static void wait_restore_thread(struct call *c) {
    long long start = fake_now_ns(CLOCK_MONOTONIC);
    int waited = 0;
    while (!fake_restore_thread_runs(c->proc.pid)) {
        waited = 1;
        if (fake_now_ns(CLOCK_MONOTONIC) - start >= c->node.block_cap_ms * 1000000LL)
            give_up(c, "restore-thread-never-ran");
        fake_sleep_ms(5);
    }
    if (waited) note(c, " note=%s", "waited-for-restore-thread");
}

static void uuid_text(const unsigned char *b, char *out) {
    sprintf(out, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
            b[13], b[14], b[15]);
}

/* Driver 570 up to 575.57.08 with a process that sees only some of the node's GPUs. */
static int partial_passthrough_broken(const struct call *c) {
    int major = 0, minor = 0, patch = 0;
    sscanf(c->node.driver_version, "%d.%d.%d", &major, &minor, &patch);
    long version = major * 1000000L + minor * 1000L + patch;
    return version >= 570000000L && version < 575057008L && c->proc.ngpus < c->node.count;
}

/* A mapping of /dev/nvidia-uvm in the process other than the runtime's 2 MiB window: UVM
   managed memory. */
static int uses_uvm(int pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/maps", pid);
    char *maps = fake_read_file(path, NULL);
    int found = 0;
    for (char *line = maps; line && *line && !found;) {
        char *end = strchr(line, '\n');
        if (end) *end = 0;
        unsigned long start = 0, stop = 0;
        size_t len = strlen(line);
        if (len >= 11 && !strcmp(line + len - 11, "/nvidia-uvm") &&
            sscanf(line, "%lx-%lx", &start, &stop) == 2 && stop - start != (1UL << 21))
            found = 1;
        line = end ? end + 1 : NULL;
    }
    free(maps);
    return found;
}

static int on_mig_gpu(const struct call *c) {
    for (int i = 0; i < c->proc.ngpus; i++) {
        int g = fake_gpu_index(&c->node, c->proc.gpus[i]);
        if (g >= 0 && c->node.gpus[g].mig == 1) return 1;
    }
    return 0;
}

/* The API ------------------------------------------------------------------------------------ */

int cuInit(unsigned int flags) {
    struct fake_node node;
    if (flags) return INVALID_VALUE; /* "Flags parameter should be 0" */
    if (fake_load_node(&node)) return NOT_INITIALIZED;
    cuinit_done = 1;
    fake_append("calls.log", "0 0 cuInit pid=0 token=- result=0\n");
    return SUCCESS;
}

int cuDriverGetVersion(int *version) {
    struct fake_node node;
    if (!version) return INVALID_VALUE;
    if (fake_load_node(&node)) return NOT_INITIALIZED;
    *version = node.cuda_driver_version;
    return SUCCESS;
}

int cuGetErrorName(int code, const char **name) {
    if (!name) return INVALID_VALUE;
    for (size_t i = 0; i < sizeof RESULTS / sizeof *RESULTS; i++)
        if (RESULTS[i].code == code) {
            *name = RESULTS[i].name;
            return SUCCESS;
        }
    *name = NULL;
    return INVALID_VALUE;
}

int cuGetErrorString(int code, const char **text) {
    if (!text) return INVALID_VALUE;
    for (size_t i = 0; i < sizeof RESULTS / sizeof *RESULTS; i++)
        if (RESULTS[i].code == code) {
            *text = RESULTS[i].text;
            return SUCCESS;
        }
    *text = NULL;
    return INVALID_VALUE;
}

int cuCheckpointProcessGetRestoreThreadId(int pid, int *tid) {
    struct call c;
    int r = begin(&c, "restore_tid", pid);
    if (c.node.restore_tid_error) return finish(&c, c.node.restore_tid_error);
    if (!r && !tid) r = INVALID_VALUE;
    if (!r) *tid = fake_restore_tid(pid);
    return finish(&c, r);
}

int cuCheckpointProcessGetState(int pid, int *state) {
    struct call c;
    int r = begin(&c, "state", pid);
    if (c.node.restore_tid_error) return finish(&c, c.node.restore_tid_error);
    if (!r && !state) r = INVALID_VALUE;
    if (r) return finish(&c, r);
    wait_restore_thread(&c);
    *state = STATE_CODE(c.proc.slot[0]);
    return finish(&c, r);
}

int cuCheckpointProcessLock(int pid, LockArgs *args) {
    struct call c;
    int r = begin(&c, "lock", pid);
    if (r) return finish(&c, r);
    unsigned timeout = args ? args->timeoutMs : 0;
    char text[32];
    snprintf(text, sizeof text, "%u", timeout);
    note(&c, " timeout_ms=%s", text);
    if (args && (args->reserved0 || !zeroed(args->reserved1, sizeof args->reserved1)))
        return finish(&c, INVALID_VALUE);
    if (c.proc.slot[0] != 'R') return finish(&c, ILLEGAL_STATE);
    long long limit = timeout ? timeout : c.node.block_cap_ms;
    long long start = fake_now_ns(CLOCK_MONOTONIC);
    while (fake_frozen(pid) || fake_app_stopped(pid) || busy(&c)) {
        if (fake_now_ns(CLOCK_MONOTONIC) - start >= limit * 1000000LL) {
            if (!timeout) give_up(&c, "lock-without-timeout-never-locked");
            return finish(&c, NOT_READY);
        }
        fake_sleep_ms(5);
    }
    return finish(&c, set_state(&c, 'L'));
}

int cuCheckpointProcessCheckpoint(int pid, PlainArgs *args) {
    struct call c;
    int r = begin(&c, "checkpoint", pid);
    if (r) return finish(&c, r);
    if (args && !zeroed(args, sizeof *args)) return finish(&c, INVALID_VALUE);
    if (c.proc.slot[0] != 'L') return finish(&c, ILLEGAL_STATE);
    if (on_mig_gpu(&c) || c.proc.mps) return finish(&c, NOT_SUPPORTED);
    if (uses_uvm(pid)) return finish(&c, NOT_SUPPORTED);
    if (partial_passthrough_broken(&c)) return finish(&c, NOT_PERMITTED);
    wait_restore_thread(&c);
    return finish(&c, set_state(&c, 'C'));
}

int cuCheckpointProcessRestore(int pid, RestoreArgs *args) {
    struct call c;
    int r = begin(&c, "restore", pid);
    if (r) return finish(&c, r);
    if (c.proc.slot[1] == '1') return finish(&c, OPERATING_SYSTEM);
    if (c.proc.slot[0] != 'C') return finish(&c, ILLEGAL_STATE);
    unsigned count = args ? args->gpuPairsCount : 0;
    if (args && c.node.cuda_driver_version < 13000 && !zeroed(args, sizeof *args))
        return finish(&c, INVALID_VALUE); /* CUDA 12.x: the whole struct is reserved */
    if (args && !zeroed(args->reserved, sizeof args->reserved + sizeof args->reserved1))
        return finish(&c, INVALID_VALUE);
    if (count && !args->gpuPairs) return finish(&c, INVALID_VALUE);
    char target[FAKE_PROC_GPUS][FAKE_UUID_LEN + 1];
    int mapped[FAKE_PROC_GPUS] = {0};
    for (int i = 0; i < c.proc.ngpus; i++) memcpy(target[i], c.proc.gpus[i], FAKE_UUID_LEN + 1);
    if (count) note(&c, "%s", " pairs=");
    for (unsigned p = 0; p < count; p++) {
        char old_text[48], new_text[48];
        uuid_text(args->gpuPairs[p].oldUuid.bytes, old_text);
        uuid_text(args->gpuPairs[p].newUuid.bytes, new_text);
        note(&c, p ? ",%s" : "%s", old_text);
        note(&c, ">%s", new_text);
        if (fake_gpu_index(&c.node, new_text) < 0) return finish(&c, INVALID_VALUE);
        for (int i = 0; i < c.proc.ngpus; i++)
            if (!strcmp(old_text, c.proc.gpus[i]) && !mapped[i]) {
                memcpy(target[i], new_text, FAKE_UUID_LEN + 1);
                mapped[i] = 1;
            }
    }
    for (int i = 0; count && i < c.proc.ngpus; i++)
        if (!mapped[i]) return finish(&c, INVALID_VALUE); /* must contain every GPU */
    int persistent = 1;
    for (int i = 0; i < c.proc.ngpus; i++) {
        int g = fake_gpu_index(&c.node, target[i]);
        if (g < 0) return finish(&c, NOT_SUPPORTED);
        persistent &= c.node.gpus[g].persistence == 1;
    }
    if (!persistent && !cuinit_done) return finish(&c, NOT_INITIALIZED);
    if (partial_passthrough_broken(&c)) return finish(&c, NOT_PERMITTED);
    wait_restore_thread(&c);
    for (int i = 0; i < c.proc.ngpus; i++) {
        const struct fake_gpu *g = &c.node.gpus[fake_gpu_index(&c.node, target[i])];
        unsigned long long taken = g->memory_used + fake_used_by_processes(target[i], pid);
        unsigned long long free_bytes = g->memory_total > taken ? g->memory_total - taken : 0;
        if (c.proc.mem[i] > free_bytes) {
            c.proc.slot[1] = '1';
            fake_store_slot(&c.proc);
            return finish(&c, OUT_OF_MEMORY);
        }
    }
    for (int i = 0; i < c.proc.ngpus; i++) memcpy(c.proc.gpus[i], target[i], FAKE_UUID_LEN + 1);
    return finish(&c, set_state(&c, 'L'));
}

int cuCheckpointProcessUnlock(int pid, PlainArgs *args) {
    struct call c;
    int r = begin(&c, "unlock", pid);
    if (r) return finish(&c, r);
    if (args && !zeroed(args, sizeof *args)) return finish(&c, INVALID_VALUE);
    if (c.proc.slot[0] != 'L') return finish(&c, ILLEGAL_STATE);
    wait_restore_thread(&c);
    return finish(&c, set_state(&c, 'R'));
}
