/* gpuworker: a stand-in for a CUDA workload, for the fake driver (see fake_gpu.h).
 *
 *   gpuworker [--children N] [--uring] [--uvm DIR] [--managed DIR]
 *
 * Its CUDA state is the FAKE_CUDA_STATE slot in its own environment, which the fake driver
 * rewrites in place. Like a CUDA program whose calls block while the driver holds it locked
 * or checkpointed, it only makes progress while the slot says RUNNING: every 10 ms it adds one
 * to a counter and writes "<counter> <state letter>\n" to /tmp/counter.<FAKE_CUDA_TOKEN>.
 * A counter that stops after a checkpoint or restore is a process left locked.
 *
 * Like a CUDA process, it has a thread of the driver's own, named cuda-restore, on which the
 * fake driver does its checkpoint and restore work (it only sleeps here).
 *
 * --children N starts N more workers (tokens <token>-1 .. <token>-N, each with its own slot).
 * --uring holds an io_uring instance, which CRIU cannot dump: a checkpoint fails in CRIU.
 * --uvm DIR maps 2 MiB of DIR/nvidia-uvm (a file it creates), as every CUDA process maps the
 * CUDA runtime's own window of /dev/nvidia-uvm (PyTorch and CuPy on an H200, driver 580).
 * --managed DIR does that and maps 64 MiB more of it, as a cudaMallocManaged allocation adds a
 * mapping of /dev/nvidia-uvm of its own size: UVM managed memory.
 * --sleeper starts a child that is no CUDA process and only sleeps (/tmp/sleeper.<token> holds
 * its pid).
 */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static void start_child(const char *self, const char *token, int n) {
    char token_var[256], state_var[512];
    const char *slot = getenv("FAKE_CUDA_STATE");
    snprintf(token_var, sizeof token_var, "FAKE_CUDA_TOKEN=%s-%d", token, n);
    snprintf(state_var, sizeof state_var, "FAKE_CUDA_STATE=R0%s", slot + 2);
    int count = 0;
    while (environ[count]) count++;
    char **env = calloc(count + 1, sizeof *env);
    for (int i = 0; i < count; i++) {
        if (!strncmp(environ[i], "FAKE_CUDA_TOKEN=", 16)) env[i] = token_var;
        else if (!strncmp(environ[i], "FAKE_CUDA_STATE=", 16)) env[i] = state_var;
        else env[i] = environ[i];
    }
    if (fork() == 0) {
        char *argv[] = {(char *)self, NULL};
        execve("/proc/self/exe", argv, env);
        _exit(127);
    }
    free(env);
}

static void start_sleeper(const char *token) {
    pid_t pid = fork();
    if (pid == 0) {
        unsetenv("FAKE_CUDA_TOKEN");
        unsetenv("FAKE_CUDA_STATE");
        char *argv[] = {"sleeper", NULL};
        execve("/proc/self/exe", argv, environ);
        _exit(127);
    }
    char path[512], text[32];
    snprintf(path, sizeof path, "/tmp/sleeper.%s", token);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int n = snprintf(text, sizeof text, "%d\n", (int)pid);
    if (fd >= 0 && write(fd, text, n) < 0) perror("gpuworker: --sleeper");
    if (fd >= 0) close(fd);
}

static volatile int restore_thread_named;

static void *restore_thread(void *unused) {
    (void)unused;
    prctl(PR_SET_NAME, "cuda-restore", 0, 0, 0);
    restore_thread_named = 1;
    for (;;) pause();
    return NULL;
}

static void map_uvm(const char *dir, size_t managed) {
    char path[512];
    snprintf(path, sizeof path, "%s/nvidia-uvm", dir);
    size_t window = 1 << 21;
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, window + managed) < 0 ||
        mmap(NULL, window, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED ||
        (managed && mmap(NULL, managed, PROT_READ | PROT_WRITE, MAP_SHARED, fd, window)
                        == MAP_FAILED))
        perror("gpuworker: --uvm/--managed");
    if (fd >= 0) close(fd);
}

int main(int argc, char **argv) {
    const char *token = getenv("FAKE_CUDA_TOKEN");
    volatile const char *slot = getenv("FAKE_CUDA_STATE");
    if (argc == 1 && !strcmp(argv[0], "sleeper"))
        for (;;) pause();
    if (!token || !slot || strlen((const char *)slot) < 42) {
        fprintf(stderr, "gpuworker: FAKE_CUDA_TOKEN and FAKE_CUDA_STATE are needed\n");
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--children") && i + 1 < argc) {
            int n = atoi(argv[++i]);
            for (int c = 1; c <= n; c++) start_child(argv[0], token, c);
        } else if (!strcmp(argv[i], "--uring")) {
            unsigned char params[120] = {0};
            if (syscall(SYS_io_uring_setup, 4, params) < 0) perror("gpuworker: io_uring_setup");
        } else if (!strcmp(argv[i], "--uvm") && i + 1 < argc) {
            map_uvm(argv[++i], 0);
        } else if (!strcmp(argv[i], "--managed") && i + 1 < argc) {
            map_uvm(argv[++i], 64 << 20);
        } else if (!strcmp(argv[i], "--sleeper")) {
            start_sleeper(token);
        }
    }
    signal(SIGCHLD, SIG_IGN);
    pthread_t thread;
    pthread_create(&thread, NULL, restore_thread, NULL);
    /* the driver's restore thread exists once cuInit has returned: only then is this process
       ready (its counter file appears), as a CUDA process is once it initialised CUDA */
    while (!restore_thread_named) {
        struct timespec tick = {0, 100000L};
        nanosleep(&tick, NULL);
    }
    char path[512], line[64];
    snprintf(path, sizeof path, "/tmp/counter.%s", token);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    long counter = 0;
    for (;;) {
        char state = slot[0];
        if (state == 'R') counter++;
        int n = snprintf(line, sizeof line, "%020ld %c\n", counter, state);
        if (pwrite(fd, line, n, 0) < 0) return 1;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}
