/* A fake libcuda.so.1 for torpor's tests: the CUDA driver's process checkpoint API.
 *
 * It follows cuda.h (CUDA 12.8 and 13.0) and what NVIDIA documents of the driver:
 *
 *   lock        RUNNING -> LOCKED        waits while the process is frozen or busy; after
 *                                        timeoutMs (0: none) CUDA_ERROR_NOT_READY, still RUNNING
 *   checkpoint  LOCKED -> CHECKPOINTED   GPU memory moves to the host: the GPU is free again
 *   restore     CHECKPOINTED -> LOCKED   needs that memory free on the target GPU, else
 *                                        CUDA_ERROR_OUT_OF_MEMORY, after which every restore
 *                                        fails with CUDA_ERROR_OPERATING_SYSTEM (driver 580)
 *   unlock      LOCKED -> RUNNING
 *
 * Any other starting state is CUDA_ERROR_ILLEGAL_STATE. The 64-byte argument structs must
 * have their reserved bytes zeroed (CUDA_ERROR_INVALID_VALUE otherwise); GPU UUID pairs exist
 * only from CUDA 13.0 (driver 580), must name the process's GPU and GPUs of this node.
 * A process the driver does not know gets CUDA_ERROR_INVALID_VALUE. The driver's own
 * restore thread cannot run in a frozen process, so checkpoint, restore and unlock wait until
 * it is thawed (at most 30 s, then CUDA_ERROR_TIMEOUT). See fake_gpu.h for the node, the
 * processes, failure injection and calls.log.
 */
#define _GNU_SOURCE
#include "fake_gpu.h"

#include <stdint.h>

enum {
    SUCCESS = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3,
    INVALID_DEVICE = 101, OPERATING_SYSTEM = 304, ILLEGAL_STATE = 401, NOT_FOUND = 500,
    NOT_READY = 600, NOT_PERMITTED = 800, NOT_SUPPORTED = 801, TIMEOUT = 909, UNKNOWN = 999,
};

static const struct { int code; const char *name, *text; } RESULTS[] = {
    {SUCCESS, "CUDA_SUCCESS", "no error"},
    {INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM",
     "OS call failed or operation not supported on this OS"},
    {ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
     "the operation cannot be performed in the present state"},
    {NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {TIMEOUT, "CUDA_ERROR_TIMEOUT", "timeout reached"},
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
#define LOCK_NO_TIMEOUT_CAP_MS 120000 /* a fake must not hang a test run for ever */
#define FROZEN_CAP_MS 30000

struct call {
    const char *op;
    struct fake_node node;
    struct fake_proc proc;
    int cuda;
    char before;
    char extra[1024];
};

static int zeroed(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

static void sleep_ms(int ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

static int busy(const struct call *c) {
    char path[4096];
    if (fake_path(path, sizeof path, "%s.busy", c->proc.token)) return 0;
    return access(path, F_OK) == 0;
}

/* An injected failure for this call: its code (0: none); `fail` set when it ends in FAILED. */
static int injected_in(const char *file, const char *op, int *fail) {
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
            char *end;
            code = (int)strtol(line + oplen + 1, &end, 10);
            long times = -1;
            if (*end == '*') times = strtol(end + 1, &end, 10);
            *fail = *end == '!';
            if (times > 0) {
                changed = 1;
                if (times > 1)
                    snprintf(rewritten + strlen(rewritten), cap - strlen(rewritten),
                             "%s=%d*%ld%s\n", op, code, times - 1, *fail ? "!" : "");
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

static int injected(struct call *c, const char *op, int *fail) {
    char name[FAKE_TOKEN_MAX + 16];
    int code = 0;
    *fail = 0;
    if (c->cuda) {
        snprintf(name, sizeof name, "%s.fail", c->proc.token);
        code = injected_in(name, op, fail);
    }
    if (!code) {
        snprintf(name, sizeof name, "pid-%d.fail", c->proc.pid);
        code = injected_in(name, op, fail);
    }
    return code;
}

static void mirror_state(const struct call *c) {
    char path[4096], line[256];
    if (fake_path(path, sizeof path, "%s.state", c->proc.token)) return;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    snprintf(line, sizeof line, "state=%s pid=%d gpu=%.40s wedged=%c\n",
             fake_state_word(c->proc.slot[0]), c->proc.pid, c->proc.slot + 2, c->proc.slot[1]);
    ssize_t ignored = write(fd, line, strlen(line));
    (void)ignored;
    close(fd);
}

static int finish(struct call *c, int result) {
    char line[2048];
    snprintf(line, sizeof line,
             "%lld %lld %s pid=%d token=%s result=%d before=%s after=%s frozen=%d%s\n",
             fake_now_ns(CLOCK_REALTIME), fake_now_ns(CLOCK_MONOTONIC), c->op, c->proc.pid,
             c->cuda ? c->proc.token : "-", result, c->cuda ? fake_state_word(c->before) : "-",
             c->cuda ? fake_state_word(c->proc.slot[0]) : "-", fake_frozen(c->proc.pid), c->extra);
    fake_append("calls.log", line);
    if (c->cuda && c->proc.slot[0] != c->before) mirror_state(c);
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
    int fail;
    int code = injected(c, op, &fail);
    if (code && fail) {
        c->proc.slot[0] = 'F';
        fake_store_slot(&c->proc);
    }
    return code;
}

static int set_state(struct call *c, char state) {
    c->proc.slot[0] = state;
    return fake_store_slot(&c->proc) ? UNKNOWN : SUCCESS;
}

/* The driver's restore thread must run: wait while the process is frozen. */
static int wait_thawed(struct call *c) {
    for (int waited = 0; fake_frozen(c->proc.pid); waited += 5) {
        if (waited >= FROZEN_CAP_MS) {
            snprintf(c->extra, sizeof c->extra, " note=restore-thread-frozen");
            return TIMEOUT;
        }
        sleep_ms(5);
    }
    return SUCCESS;
}

static void uuid_text(const unsigned char *b, char *out) {
    sprintf(out, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
            b[13], b[14], b[15]);
}

/* The API ------------------------------------------------------------------------------------ */

int cuInit(unsigned int flags) {
    (void)flags;
    struct fake_node node;
    return fake_load_node(&node) ? NOT_INITIALIZED : SUCCESS;
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
    if (!r && !tid) r = INVALID_VALUE;
    if (!r) *tid = pid;
    return finish(&c, r);
}

int cuCheckpointProcessGetState(int pid, int *state) {
    struct call c;
    int r = begin(&c, "state", pid);
    if (!r && !state) r = INVALID_VALUE;
    if (!r) *state = STATE_CODE(c.proc.slot[0]);
    return finish(&c, r);
}

int cuCheckpointProcessLock(int pid, LockArgs *args) {
    struct call c;
    int r = begin(&c, "lock", pid);
    if (r) return finish(&c, r);
    unsigned timeout = args ? args->timeoutMs : 0;
    snprintf(c.extra, sizeof c.extra, " timeout_ms=%u", timeout);
    if (args && (args->reserved0 || !zeroed(args->reserved1, sizeof args->reserved1)))
        return finish(&c, INVALID_VALUE);
    if (c.proc.slot[0] != 'R') return finish(&c, ILLEGAL_STATE);
    long long limit = timeout ? timeout : LOCK_NO_TIMEOUT_CAP_MS;
    long long start = fake_now_ns(CLOCK_MONOTONIC);
    while (fake_frozen(pid) || busy(&c)) {
        if (fake_now_ns(CLOCK_MONOTONIC) - start >= limit * 1000000LL) return finish(&c, NOT_READY);
        sleep_ms(5);
    }
    return finish(&c, set_state(&c, 'L'));
}

int cuCheckpointProcessCheckpoint(int pid, PlainArgs *args) {
    struct call c;
    int r = begin(&c, "checkpoint", pid);
    if (r) return finish(&c, r);
    if (args && !zeroed(args, sizeof *args)) return finish(&c, INVALID_VALUE);
    if (c.proc.slot[0] != 'L') return finish(&c, ILLEGAL_STATE);
    if ((r = wait_thawed(&c))) return finish(&c, r);
    return finish(&c, set_state(&c, 'C'));
}

int cuCheckpointProcessRestore(int pid, RestoreArgs *args) {
    struct call c;
    int r = begin(&c, "restore", pid);
    if (r) return finish(&c, r);
    if (c.proc.slot[1] == '1') return finish(&c, OPERATING_SYSTEM);
    if (c.proc.slot[0] != 'C') return finish(&c, ILLEGAL_STATE);
    char target[FAKE_UUID_LEN + 1];
    memcpy(target, c.proc.slot + 2, FAKE_UUID_LEN);
    target[FAKE_UUID_LEN] = 0;
    unsigned count = args ? args->gpuPairsCount : 0;
    if (args && c.node.cuda_driver_version < 13000 && !zeroed(args, sizeof *args))
        return finish(&c, INVALID_VALUE); /* CUDA 12.x: the whole struct is reserved */
    if (args && !zeroed(args->reserved, sizeof args->reserved + sizeof args->reserved1))
        return finish(&c, INVALID_VALUE);
    if (count && !args->gpuPairs) return finish(&c, INVALID_VALUE);
    int mapped = 0;
    size_t used = strlen(c.extra);
    used += snprintf(c.extra + used, sizeof c.extra - used, "%s", count ? " pairs=" : "");
    for (unsigned i = 0; i < count; i++) {
        char old_text[48], new_text[48];
        uuid_text(args->gpuPairs[i].oldUuid.bytes, old_text);
        uuid_text(args->gpuPairs[i].newUuid.bytes, new_text);
        if (used < sizeof c.extra)
            used += snprintf(c.extra + used, sizeof c.extra - used, "%s%s>%s", i ? "," : "",
                             old_text, new_text);
        if (fake_gpu_index(&c.node, new_text) < 0) return finish(&c, INVALID_VALUE);
        if (!strcmp(old_text, target) && !mapped) {
            memcpy(target, new_text, FAKE_UUID_LEN);
            mapped = 1;
        }
    }
    if (count && !mapped) return finish(&c, INVALID_VALUE); /* pairs must cover every GPU */
    int gpu = fake_gpu_index(&c.node, target);
    if (gpu < 0) return finish(&c, INVALID_DEVICE);
    if ((r = wait_thawed(&c))) return finish(&c, r);
    const struct fake_gpu *g = &c.node.gpus[gpu];
    unsigned long long taken = g->memory_used + fake_used_by_processes(target, pid);
    unsigned long long free_bytes = g->memory_total > taken ? g->memory_total - taken : 0;
    if (c.proc.mem > free_bytes) {
        c.proc.slot[1] = '1';
        fake_store_slot(&c.proc);
        return finish(&c, OUT_OF_MEMORY);
    }
    memcpy(c.proc.slot + 2, target, FAKE_UUID_LEN);
    return finish(&c, set_state(&c, 'L'));
}

int cuCheckpointProcessUnlock(int pid, PlainArgs *args) {
    struct call c;
    int r = begin(&c, "unlock", pid);
    if (r) return finish(&c, r);
    if (args && !zeroed(args, sizeof *args)) return finish(&c, INVALID_VALUE);
    if (c.proc.slot[0] != 'L') return finish(&c, ILLEGAL_STATE);
    if ((r = wait_thawed(&c))) return finish(&c, r);
    return finish(&c, set_state(&c, 'R'));
}
