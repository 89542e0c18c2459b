/* memhog: holds N MiB of dirty, incompressible memory and reports its own longest stall.
 *
 *   memhog MIB [GAPFILE]
 *
 * Fills MIB mebibytes with xorshift output, then ticks every millisecond, keeping the longest
 * gap between two ticks (what a checkpoint's freeze looks like from inside) and writing it, in
 * microseconds, to GAPFILE. Deleting GAPFILE resets the maximum. A checksum of the memory is
 * printed at start; `memhog` answers SIGUSR1 by printing it again, so a restore can be checked.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t report;
static void on_usr1(int sig) { (void)sig; report = 1; }

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static uint64_t checksum(const uint64_t *mem, size_t words) {
    uint64_t sum = 0;
    for (size_t i = 0; i < words; i++) sum = sum * 31 + mem[i];
    return sum;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: memhog MIB [GAPFILE]\n"); return 2; }
    size_t words = (size_t)atol(argv[1]) * 1024 * 1024 / 8;
    const char *gapfile = argc > 2 ? argv[2] : NULL;
    uint64_t *mem = malloc(words * 8 + 8);
    if (!mem) { perror("malloc"); return 1; }
    uint64_t x = 88172645463325252ULL;
    for (size_t i = 0; i < words; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        mem[i] = x;
    }
    signal(SIGUSR1, on_usr1);
    printf("memhog %s MiB checksum %llx\n", argv[1], (unsigned long long)checksum(mem, words));
    fflush(stdout);
    uint64_t last = now_us(), max = 0;
    for (unsigned long tick = 0;; tick++) {
        usleep(1000);
        uint64_t t = now_us();
        if (t - last > max) max = t - last;
        last = t;
        if (gapfile && tick % 50 == 0) {
            if (access(gapfile, F_OK) != 0) max = 0;
            int fd = open(gapfile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) { dprintf(fd, "%llu\n", (unsigned long long)max); close(fd); }
        }
        if (report) {
            report = 0;
            printf("memhog checksum %llx\n", (unsigned long long)checksum(mem, words));
            fflush(stdout);
        }
    }
}
