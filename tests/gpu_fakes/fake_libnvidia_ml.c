/* A fake libnvidia-ml.so.1 for torpor's tests: the NVML calls nvidia-ml-py (pynvml) makes on
 * torpor's paths, with NVML's C signatures and return codes.
 *
 * The node's GPUs and driver come from <TORPOR_FAKE_GPU_DIR>/node.conf, read again on every
 * call so a test can change the node between a checkpoint and a restore. Without the directory
 * or the file, nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED, as on a node without a driver.
 * Running compute processes are the fake CUDA processes (see fake_gpu.h) that are running or
 * locked and hold memory on a GPU, one entry per GPU they hold memory on; a checkpointed
 * process has released its GPU memory and is not listed ("After it, nvidia-smi no longer lists
 * the PID", cuda-checkpoint README). MPS clients (FAKE_CUDA_MPS=1) are listed by
 * nvmlDeviceGetMPSComputeRunningProcesses instead, as NVML lists the clients of an MPS server.
 * A GPU's used memory is its node.conf memory_used plus what those processes hold.
 */
#define _GNU_SOURCE
#include "fake_gpu.h"

enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_MEMORY_V2 0x02000028u
#define NVML_VALUE_NOT_AVAILABLE 0xFFFFFFFFu

typedef struct fake_handle { int index; } *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

static struct fake_handle handles[FAKE_MAX_GPUS];
static int initialized;
static struct fake_node node;

static const struct { int code; const char *text; } ERRORS[] = {
    {NVML_SUCCESS, "Success"},
    {NVML_ERROR_UNINITIALIZED, "Uninitialized"},
    {NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument"},
    {NVML_ERROR_NOT_SUPPORTED, "Not Supported"},
    {NVML_ERROR_INSUFFICIENT_SIZE, "Insufficient Size"},
    {NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"},
    {NVML_ERROR_GPU_IS_LOST, "GPU is lost"},
    {NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "Argument version mismatch"},
    {NVML_ERROR_UNKNOWN, "Unknown Error"},
};

static void log_call(const char *op, int result) {
    char line[256];
    snprintf(line, sizeof line, "%lld %lld nvml.%s result=%d\n", fake_now_ns(CLOCK_REALTIME),
             fake_now_ns(CLOCK_MONOTONIC), op, result);
    fake_append("calls.log", line);
}

/* The device behind a handle, with node.conf read afresh; NULL when the handle is not ours. */
static struct fake_gpu *gpu_of(nvmlDevice_t h, int *result) {
    *result = NVML_SUCCESS;
    if (!initialized) *result = NVML_ERROR_UNINITIALIZED;
    else if (h < handles || h >= handles + FAKE_MAX_GPUS) *result = NVML_ERROR_INVALID_ARGUMENT;
    else if (fake_load_node(&node)) *result = NVML_ERROR_DRIVER_NOT_LOADED;
    else if (h->index >= node.count) *result = NVML_ERROR_INVALID_ARGUMENT;
    return *result ? NULL : &node.gpus[h->index];
}

static int copy_string(char *out, unsigned int length, const char *value) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return NVML_SUCCESS;
}

int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    int r = fake_load_node(&node) ? NVML_ERROR_DRIVER_NOT_LOADED : NVML_SUCCESS;
    if (!r) {
        for (int i = 0; i < FAKE_MAX_GPUS; i++) handles[i].index = i;
        initialized++;
    }
    log_call("init", r);
    return r;
}

int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlInit(void) { return nvmlInitWithFlags(0); }

int nvmlShutdown(void) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    initialized--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(int result) {
    for (size_t i = 0; i < sizeof ERRORS / sizeof *ERRORS; i++)
        if (ERRORS[i].code == result) return ERRORS[i].text;
    return "Unknown Error";
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (fake_load_node(&node)) return NVML_ERROR_DRIVER_NOT_LOADED;
    return copy_string(version, length, node.driver_version);
}

int nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    char text[96];
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (fake_load_node(&node)) return NVML_ERROR_DRIVER_NOT_LOADED;
    snprintf(text, sizeof text, "%d.%s", node.cuda_driver_version / 1000, node.driver_version);
    return copy_string(version, length, text);
}

int nvmlSystemGetCudaDriverVersion_v2(int *version) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (fake_load_node(&node)) return NVML_ERROR_DRIVER_NOT_LOADED;
    *version = node.cuda_driver_version;
    return NVML_SUCCESS;
}

int nvmlSystemGetCudaDriverVersion(int *version) { return nvmlSystemGetCudaDriverVersion_v2(version); }

int nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (fake_load_node(&node)) return NVML_ERROR_DRIVER_NOT_LOADED;
    *count = (unsigned int)node.count;
    return NVML_SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (fake_load_node(&node)) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (index >= (unsigned int)node.count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &handles[index];
    return NVML_SUCCESS;
}

int nvmlDeviceGetIndex(nvmlDevice_t h, unsigned int *index) {
    int r;
    if (!gpu_of(h, &r)) return r;
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)h->index;
    return NVML_SUCCESS;
}

int nvmlDeviceGetUUID(nvmlDevice_t h, char *uuid, unsigned int length) {
    int r;
    struct fake_gpu *g = gpu_of(h, &r);
    return g ? copy_string(uuid, length, g->uuid) : r;
}

int nvmlDeviceGetName(nvmlDevice_t h, char *name, unsigned int length) {
    int r;
    struct fake_gpu *g = gpu_of(h, &r);
    return g ? copy_string(name, length, g->name) : r;
}

int nvmlDeviceGetArchitecture(nvmlDevice_t h, unsigned int *arch) {
    int r;
    struct fake_gpu *g = gpu_of(h, &r);
    if (!g) return r;
    if (!arch) return NVML_ERROR_INVALID_ARGUMENT;
    *arch = g->architecture;
    return NVML_SUCCESS;
}

int nvmlDeviceGetCudaComputeCapability(nvmlDevice_t h, int *major, int *minor) {
    int r;
    struct fake_gpu *g = gpu_of(h, &r);
    if (!g) return r;
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

static void memory_of(const struct fake_gpu *g, unsigned long long *free_bytes,
                      unsigned long long *used) {
    *used = g->memory_used + fake_used_by_processes(g->uuid, 0);
    *free_bytes = g->memory_total > *used ? g->memory_total - *used : 0;
}

int nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *memory) {
    int r;
    struct fake_gpu *g = gpu_of(h, &r);
    if (!g) return r;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->lost) return NVML_ERROR_GPU_IS_LOST;
    memory->total = g->memory_total;
    memory_of(g, &memory->free, &memory->used);
    return NVML_SUCCESS;
}

int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *memory) {
    int r;
    struct fake_gpu *g = gpu_of(h, &r);
    if (!g) return r;
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (g->lost) return NVML_ERROR_GPU_IS_LOST;
    memory->total = g->memory_total;
    memory->reserved = 0;
    memory_of(g, &memory->free, &memory->used);
    return NVML_SUCCESS;
}

int nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, nvmlPciInfo_t *pci) {
    int r;
    struct fake_gpu *g = gpu_of(h, &r);
    if (!g) return r;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    sscanf(g->pci_bus_id, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    pci->pciDeviceId = g->pci_device_id;
    snprintf(pci->busId, sizeof pci->busId, "%s", g->pci_bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.0", pci->domain, pci->bus,
             pci->device);
    return NVML_SUCCESS;
}

int nvmlDeviceGetMigMode(nvmlDevice_t h, unsigned int *current, unsigned int *pending) {
    int r;
    struct fake_gpu *g = gpu_of(h, &r);
    if (!g) return r;
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->mig < 0) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned int)g->mig;
    return NVML_SUCCESS;
}

int nvmlDeviceGetPersistenceMode(nvmlDevice_t h, unsigned int *mode) {
    int r;
    struct fake_gpu *g = gpu_of(h, &r);
    if (!g) return r;
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    *mode = (unsigned int)g->persistence;
    return NVML_SUCCESS;
}

int nvmlDeviceGetMinorNumber(nvmlDevice_t h, unsigned int *minor) {
    int r;
    struct fake_gpu *g = gpu_of(h, &r);
    if (!g) return r;
    if (!minor) return NVML_ERROR_INVALID_ARGUMENT;
    *minor = g->minor;
    return NVML_SUCCESS;
}

/* The compute processes on a GPU: plain ones, or the clients of an MPS server (`mps`). */
static int running_processes(nvmlDevice_t h, unsigned int *count, nvmlProcessInfo_t *infos,
                             int mps) {
    int r;
    struct fake_gpu *g = gpu_of(h, &r);
    if (!g) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int found = 0;
    DIR *d = opendir("/proc");
    struct dirent *de;
    while (d && (de = readdir(d))) {
        int pid = atoi(de->d_name);
        struct fake_proc p;
        if (pid <= 0 || !fake_find_proc(pid, &p) || p.mps != mps) continue;
        if (p.slot[0] != 'R' && p.slot[0] != 'L') continue;
        for (int i = 0; i < p.ngpus; i++) {
            if (strncmp(p.gpus[i], g->uuid, FAKE_UUID_LEN) || !p.mem[i]) continue;
            if (infos && found < *count) {
                infos[found].pid = (unsigned int)pid;
                infos[found].usedGpuMemory = p.mem[i];
                infos[found].gpuInstanceId = infos[found].computeInstanceId =
                    NVML_VALUE_NOT_AVAILABLE;
            }
            found++;
        }
    }
    if (d) closedir(d);
    int fits = infos && found <= *count;
    *count = found;
    if (!found) return NVML_SUCCESS;
    return fits ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
}

int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *count,
                                            nvmlProcessInfo_t *infos) {
    return running_processes(h, count, infos, 0);
}

int nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *count,
                                               nvmlProcessInfo_t *infos) {
    return running_processes(h, count, infos, 1);
}
