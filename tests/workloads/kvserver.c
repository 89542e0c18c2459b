/* kvserver: an in-memory key/value server for torpor's tests.
 *
 *   kvserver PORT [ADDR]
 *
 * One line per request on any number of TCP connections:
 *   SET key value -> OK      GET key -> value | NIL      INCR key -> n
 *   PING -> PONG             SERVED -> requests served since start (all connections)
 * Everything lives in this process's memory: a restored process answers with the state it had.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_CONN 64
#define MAX_KEYS 1024

static char *keys[MAX_KEYS], *vals[MAX_KEYS];
static int nkeys;
static long served;

static char **lookup(const char *k, int create) {
    for (int i = 0; i < nkeys; i++)
        if (strcmp(keys[i], k) == 0) return &vals[i];
    if (!create || nkeys == MAX_KEYS) return NULL;
    keys[nkeys] = strdup(k);
    vals[nkeys] = strdup("");
    return &vals[nkeys++];
}

static void reply(int fd, const char *s) {
    char buf[1100];
    int n = snprintf(buf, sizeof buf, "%s\n", s);
    if (write(fd, buf, n) < 0) perror("write");
}

static void handle(int fd, char *line) {
    char *cmd = strtok(line, " \r"), *k = strtok(NULL, " \r"), *v = strtok(NULL, "\r");
    char out[1024];
    served++;
    if (!cmd) return reply(fd, "ERR empty");
    if (!strcmp(cmd, "PING")) return reply(fd, "PONG");
    if (!strcmp(cmd, "SERVED")) { snprintf(out, sizeof out, "%ld", served); return reply(fd, out); }
    if (!k) return reply(fd, "ERR no key");
    if (!strcmp(cmd, "SET") && v) {
        char **slot = lookup(k, 1);
        if (!slot) return reply(fd, "ERR full");
        free(*slot); *slot = strdup(v);
        return reply(fd, "OK");
    }
    if (!strcmp(cmd, "GET")) { char **slot = lookup(k, 0); return reply(fd, slot ? *slot : "NIL"); }
    if (!strcmp(cmd, "INCR")) {
        char **slot = lookup(k, 1);
        if (!slot) return reply(fd, "ERR full");
        snprintf(out, sizeof out, "%ld", atol(*slot) + 1);
        free(*slot); *slot = strdup(out);
        return reply(fd, out);
    }
    reply(fd, "ERR unknown");
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: kvserver PORT [ADDR]\n"); return 2; }
    int one = 1, ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    sa.sin_addr.s_addr = argc > 2 ? inet_addr(argv[2]) : htonl(INADDR_ANY);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 16)) { perror("listen"); return 1; }
    printf("kvserver listening on %s\n", argv[1]);
    fflush(stdout);
    struct pollfd pfd[MAX_CONN + 1] = {{.fd = ls, .events = POLLIN}};
    char bufs[MAX_CONN + 1][2048];
    int lens[MAX_CONN + 1] = {0}, n = 1;
    for (;;) {
        if (poll(pfd, n, -1) < 0) { if (errno == EINTR) continue; perror("poll"); return 1; }
        if ((pfd[0].revents & POLLIN) && n <= MAX_CONN) {
            int c = accept(ls, NULL, NULL);
            if (c >= 0) { pfd[n] = (struct pollfd){.fd = c, .events = POLLIN}; lens[n++] = 0; }
        }
        for (int i = 1; i < n; i++) {
            if (!(pfd[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            int r = read(pfd[i].fd, bufs[i] + lens[i], sizeof bufs[i] - 1 - lens[i]);
            if (r <= 0) {
                close(pfd[i].fd);
                pfd[i] = pfd[n - 1]; lens[i] = lens[n - 1];
                memcpy(bufs[i], bufs[n - 1], lens[i]);
                n--; i--;
                continue;
            }
            lens[i] += r;
            bufs[i][lens[i]] = 0;
            char *nl;
            while ((nl = strchr(bufs[i], '\n'))) {
                *nl = 0;
                handle(pfd[i].fd, bufs[i]);
                lens[i] -= nl + 1 - bufs[i];
                memmove(bufs[i], nl + 1, lens[i] + 1);
            }
        }
    }
}
