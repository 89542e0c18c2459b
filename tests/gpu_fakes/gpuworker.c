/* gpuworker: a stand-in for a CUDA workload, for the fake driver (see fake_gpu.h).
 *
 *   gpuworker [--children N] [--uring]
 *
 * Its CUDA state is the FAKE_CUDA_STATE slot in its own environment, which the fake driver
 * rewrites in place. Like a CUDA program whose calls block while the driver holds it locked
 * or checkpointed, it only makes progress while the slot says RUNNING: every 10 ms it adds one
 * to a counter and writes "<counter> <state letter>\n" to /tmp/counter.<FAKE_CUDA_TOKEN>.
 * A counter that stops after a checkpoint or restore is a process left locked.
 *
 * --children N starts N more workers (tokens <token>-1 .. <token>-N, each with its own slot).
 * --uring holds an io_uring instance, which CRIU cannot dump: a checkpoint fails in CRIU.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static void start_child(const char *self, const char *token, int n) {
    char token_var[256], state_var[256];
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

int main(int argc, char **argv) {
    const char *token = getenv("FAKE_CUDA_TOKEN");
    volatile const char *slot = getenv("FAKE_CUDA_STATE");
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
        }
    }
    signal(SIGCHLD, SIG_IGN);
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
