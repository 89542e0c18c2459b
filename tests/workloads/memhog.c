/* memhog: holds N MiB of dirty, incompressible memory and reports its own longest stall.
 *
 *   memhog MIB [GAPFILE] [-r PERCENT] [-s STATUSFILE] [-c WORKFILE] [-x SEED]
 *
 * Fills MIB mebibytes with xorshift output, then ticks every millisecond, keeping the longest
 * gap between two ticks (what a checkpoint's freeze looks like from inside) and writing it, in
 * microseconds, to GAPFILE. Deleting GAPFILE resets the maximum. A checksum of the memory is
 * printed at start; `memhog` answers SIGUSR1 by printing it again, so a restore can be checked.
 *
 * SIGUSR2 rewrites PERCENT (default 10) of the memory as one region with new random bytes, the
 * next region each time, then writes "rewrites N checksum X" to STATUSFILE: what a workload
 * that changed part of its memory between two checkpoints looks like.
 *
 * -c: CPU-bound instead of ticking: hashes a small buffer in a loop and writes the number of
 * rounds done so far, a hash and its longest stall so far (microseconds) to WORKFILE about
 * every 100 ms (its throughput and what a checkpoint's freeze looked like from inside).
 *
 * -x: fill with another seed, so that two memhogs do not hold the same bytes (packs of the
 * same bytes are shared by content, wherever they come from).
 */
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t report, rewrite;
static void on_usr1(int sig) { (void)sig; report = 1; }
static void on_usr2(int sig) { (void)sig; rewrite = 1; }

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

static void fill(uint64_t *mem, size_t words, uint64_t x) {
    for (size_t i = 0; i < words; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        mem[i] = x;
    }
}

static void write_file(const char *path, const char *text) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    if (write(fd, text, strlen(text)) < 0) { close(fd); return; }
    close(fd);
    rename(tmp, path);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: memhog MIB [GAPFILE] [-r PERCENT] [-s STATUSFILE] [-c WORKFILE] "
                "[-x SEED]\n");
        return 2;
    }
    size_t words = (size_t)atol(argv[1]) * 1024 * 1024 / 8;
    const char *gapfile = NULL, *statusfile = NULL, *workfile = NULL;
    long percent = 10;
    uint64_t seed = 88172645463325252ULL;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc) percent = atol(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) statusfile = argv[++i];
        else if (!strcmp(argv[i], "-c") && i + 1 < argc) workfile = argv[++i];
        else if (!strcmp(argv[i], "-x") && i + 1 < argc) seed ^= strtoull(argv[++i], NULL, 0) << 1;
        else gapfile = argv[i];
    }
    uint64_t *mem = malloc(words * 8 + 8);
    if (!mem) { perror("malloc"); return 1; }
    fill(mem, words, seed);
    signal(SIGUSR1, on_usr1);
    signal(SIGUSR2, on_usr2);
    printf("memhog %s MiB checksum %llx\n", argv[1], (unsigned long long)checksum(mem, words));
    fflush(stdout);
    uint64_t last = now_us(), max = 0, rounds = 0, written = last;
    unsigned long rewrites = 0;
    uint64_t work[8192] = {1};
    for (unsigned long tick = 0;; tick++) {
        if (workfile) {
            for (int n = 0; n < 64; n++, rounds++)
                for (size_t i = 1; i < sizeof work / sizeof *work; i++)
                    work[i] = work[i] * 6364136223846793005ULL + work[i - 1] + rounds;
            uint64_t t = now_us();
            if (t - last > max) max = t - last;  /* the longest stall between two batches */
            last = t;
            if (t - written >= 100000) {
                char line[96];  /* the hash is printed too, so the work cannot be optimised away */
                snprintf(line, sizeof line, "%llu %llx %llu\n", (unsigned long long)rounds,
                         (unsigned long long)work[sizeof work / sizeof *work - 1],
                         (unsigned long long)max);
                write_file(workfile, line);
                written = t;
            }
        } else {
            usleep(1000);
            uint64_t t = now_us();
            if (t - last > max) max = t - last;
            last = t;
            if (gapfile && tick % 50 == 0) {
                if (access(gapfile, F_OK) != 0) max = 0;
                int fd = open(gapfile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
                if (fd >= 0) { dprintf(fd, "%llu\n", (unsigned long long)max); close(fd); }
            }
        }
        if (report) {
            report = 0;
            printf("memhog checksum %llx\n", (unsigned long long)checksum(mem, words));
            fflush(stdout);
        }
        if (rewrite) {
            rewrite = 0;
            size_t region = words / 100 * (size_t)percent;
            size_t start = region ? (rewrites * region) % (words - region + 1) : 0;
            fill(mem + start, region, 0x9E3779B97F4A7C15ULL * (rewrites + 2));
            rewrites++;
            if (statusfile) {
                char line[128];
                snprintf(line, sizeof line, "rewrites %lu checksum %llx\n", rewrites,
                         (unsigned long long)checksum(mem, words));
                write_file(statusfile, line);
            }
        }
    }
}
