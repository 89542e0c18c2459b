/*
 * torpor-runc's front end: on every runtime call containerd makes, decide between torpor and
 * runc without starting Python.
 *
 * `checkpoint` and `restore` go to torpor-runc's Python program (TORPOR_SCRIPT, run by
 * TORPOR_PYTHON), and, where the config's `[restore] on_create` is other than "off", a `create`
 * whose bundle's config.json names the checkpoint mark (TORPOR_CHECKPOINT=) and the `start` of a
 * container torpor-runc restored at create (its mark in runc's state directory of it: one stat);
 * `-h`/`--help` and every other subcommand are execve'd to the low-level runtime, so argv, stdio, inherited fds, signals and the exit status stay runc's. The runtime is
 * `[runtime] path` of the torpor config (TORPOR_CONFIG, else /etc/torpor/config.toml; "runc"
 * without one), found on PATH but never this program itself. Anything this file cannot decide
 * plainly (a config line it does not understand, a runtime it cannot find, one that leads back
 * here) goes to the Python program, which decides the same way and reports errors in runc's log
 * format. torpor.runtime_config.launchers compiles this file with the paths defined.
 *
 * `checkpoint` and `restore --detach` go to torpord first, where `[service] socket` answers
 * (torpord's wire, torpor/handoff.py, spoken here): torpord's child runs torpor-runc's Python
 * program with this process's argv, environment, directory and fds 0-2, and its exit status
 * becomes this one's; a restore's `runc restore` runs here, below containerd's shim, when that
 * child asks (run_for_service). No
 * socket, a refusal, TORPOR_NO_SERVICE=1 or anything this file cannot say plainly (a config
 * beyond its reading, bytes that are not UTF-8) and the Python program runs here, as before.
 *
 * Called as `torpor` (the same binary under that name, TORPOR_CLI naming the CLI's Python
 * launcher), it is the CLI's entry: every command goes to torpord the same way (program
 * "torpor"), else to the Python CLI, which runs it in its own process.
 *
 * Called as containerd-shim-torpor-v2 (the same binary under that name), it is the shim
 * launcher instead: containerd runs it for the runtime io.containerd.torpor.v2, and it runs
 * containerd's runc v2 shim (the one on containerd's PATH, else TORPOR_SHIM) with TORPOR_RUNC_DIR,
 * whose `runc` is torpor-runc, first on PATH.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef TORPOR_PYTHON
#error "TORPOR_PYTHON must name the Python interpreter"
#endif
#ifndef TORPOR_SCRIPT
#error "TORPOR_SCRIPT must name torpor-runc's Python program"
#endif
#ifndef TORPOR_RUNC_DIR
#define TORPOR_RUNC_DIR ""
#endif
#ifndef TORPOR_SHIM
#define TORPOR_SHIM ""
#endif
#ifndef TORPOR_CLI
#define TORPOR_CLI ""  /* the CLI's Python launcher; "" where this binary is not installed as it */
#endif
#ifndef TORPOR_HOOK
#define TORPOR_HOOK ""  /* torpor-hook's Python launcher; "" where not installed as torpor-hook */
#endif
#define SHIM_NAME "containerd-shim-torpor-v2"
#define CLI_NAME "torpor"
#define HOOK_NAME "torpor-hook"
/* = torpor/oci_hooks/main.py's DEFAULT_STATE_DIR, torpor/formats/names.py's RECORDS_DIR and
 * RESTORE_PLAN, and what torpor.capture.netns.write_restore_plan writes for a plan that only
 * brings lo up (tests/unit/test_frontend_hook.py holds them equal) */
#define HOOK_STATE_DIR "/run/torpor"
#define RECORDS_DIR "containers"
#define RESTORE_PLAN "restore-net.json"
#define LO_ONLY_PLAN "{\"up\": [\"lo\"], \"addresses\": [], \"routes\": []}"
#define DEFAULT_SOCKET "/run/torpor/torpord.sock"  /* = torpor/config.py's [service] socket */
#define RUNC_SHIM "containerd-shim-runc-v2"

#define MARKER "TORPOR_RUNC_LOWLEVEL"  /* set for runc: seeing it means runc led back here */
#define SELF_ENV "TORPOR_RUNC_PATH"    /* tells the Python program where torpor-runc is */
#define CLI_SELF_ENV "TORPOR_CLI_PATH"  /* ... and the CLI's where `torpor` is (cli/handoff.py) */
#ifndef DEFAULT_CONFIG  /* a prefix install's own (packaging/install.sh) */
#define DEFAULT_CONFIG "/etc/torpor/config.toml"
#else
#define OWN_CONFIG 1  /* the Python launchers set TORPOR_CONFIG to it: so does the hand-off */
#endif
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

static const char *const INTERCEPTED[] = {"checkpoint", "restore", NULL};
/* = torpor/shim/on_create_check.py's SPEC_MARK and RESTORED_MARK, RUNC_ROOT */
#define SPEC_MARK "\"TORPOR_CHECKPOINT="
#define RESTORED_MARK "torpor-restored-on-create"
#define RUNC_ROOT "/run/runc"
static const char *const GLOBAL_VALUE_FLAGS[] = {"root", "log", "log-format", "criu", "rootless",
                                                 NULL};
static char self[PATH_MAX];

static int listed(const char *word, const char *const *list) {
    for (; *list; list++)
        if (strcmp(word, *list) == 0)
            return 1;
    return 0;
}

/* The subcommand's index in argv, stepping over global flags and their values; 0 if none. */
static int subcommand(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--") == 0)
            return i + 1 < argc ? i + 1 : 0;
        if (arg[0] != '-' || strcmp(arg, "-") == 0)
            return i;
        const char *name = arg + (arg[1] == '-' ? 2 : 1);
        if (!strchr(arg, '=') && listed(name, GLOBAL_VALUE_FLAGS))
            i++;
    }
    return 0;
}

/* Whether the subcommand's arguments (up to a "--") hold one of `flags` as they are. */
static int given(int argc, char **argv, int command, const char *const *flags) {
    for (int i = command + 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            return 0;
        if (listed(argv[i], flags))
            return 1;
    }
    return 0;
}

static int asks_for_help(int argc, char **argv, int command) {
    static const char *const HELP[] = {"-h", "--help", "-help", NULL};
    return given(argc, argv, command, HELP);
}

/* `restore --detach`: runc returns once CRIU is done (containerd's shim, Podman and CRI-O
 * restore so); a restore in the foreground lives as long as its container, and runs here. */
static int detached(int argc, char **argv, int command) {
    static const char *const DETACH[] = {"--detach", "-d", "-detach", NULL};
    return given(argc, argv, command, DETACH);
}

/* Run `script` (a Python launcher) with this process's arguments. */
static void run_python(const char *script, const char *program, int argc, char **argv) {
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!args)
        _exit(127);
    args[0] = TORPOR_PYTHON;
    args[1] = "-S";
    args[2] = (char *)script;
    for (int i = 1; i < argc; i++)
        args[i + 2] = argv[i];
    execv(TORPOR_PYTHON, args);
    fprintf(stderr, "%s: cannot run %s: ", program, TORPOR_PYTHON);
    perror(NULL);
    _exit(127);
}

static void to_python(int argc, char **argv) {
    setenv(SELF_ENV, self, 1);
    run_python(TORPOR_SCRIPT, "torpor-runc", argc, argv);
}

/*
 * The config file, read as TOML only as far as a plain file goes, so that this reading and
 * Python's (tomllib) never differ: every line is blank, a comment, a table header `[a]` or
 * `[a.b]` of bare keys, or `key = value` with a bare key and a value that is a basic string
 * without escapes, a literal string, true, false, a decimal integer or a one-line array of
 * those, each line ending in an optional comment. Only ASCII, no control character but tab, LF
 * or CRLF line ends. A table defined twice, a key given twice, a key that is also a table: all
 * errors to tomllib. Anything else (dotted or quoted keys, quoted table names, inline tables,
 * multi-line strings or arrays, escapes, floats, dates) goes to the Python program, which
 * reads the file with tomllib. tests/unit/test_frontend_config.py holds the two side by side.
 */
#define CONFIG_MAX (64 * 1024)
#define NAMES_MAX 256
#define NAME_LEN 256

struct names {
    char name[NAMES_MAX][NAME_LEN];
    char is_table[NAMES_MAX];
    int count;
};

static int bare_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-';
}

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\t')
        p++;
    return p;
}

/* A bare key at p, appended to out (of `size` bytes); where it ends, or NULL. */
static const char *bare_key(const char *p, char *out, size_t size) {
    size_t n = strlen(out);
    const char *start = p;
    while (bare_char(*p)) {
        if (n + 1 >= size)
            return NULL;
        out[n++] = *p++;
    }
    out[n] = '\0';
    return p > start ? p : NULL;
}

/* What may follow a value: a space, a comment, an array's comma or end, the line's end. */
static int value_ends(char c) {
    return c == ' ' || c == '\t' || c == '#' || c == ',' || c == ']' || c == '\0';
}

/* A string, boolean or integer at p; where it ends, or NULL. A string's text goes to text. */
static const char *scalar(const char *p, char *text, size_t size, int *is_string) {
    *is_string = 0;
    if (*p == '"' || *p == '\'') {
        char quote = *p++;
        const char *end = strchr(p, quote);
        if (!end || (quote == '"' && memchr(p, '\\', (size_t)(end - p))))
            return NULL;
        if (end == p && end[1] == quote)
            return NULL;  /* three quotes: a multi-line string */
        if ((size_t)(end - p) >= size || !value_ends(end[1]))
            return NULL;
        memcpy(text, p, (size_t)(end - p));
        text[end - p] = '\0';
        *is_string = 1;
        return end + 1;
    }
    const char *q = p;
    if (strncmp(q, "true", 4) == 0) {
        q += 4;
    } else if (strncmp(q, "false", 5) == 0) {
        q += 5;
    } else {
        if (*q == '+' || *q == '-')
            q++;
        if (*q == '0')
            q++;
        else if (*q >= '1' && *q <= '9')
            while (*q >= '0' && *q <= '9')
                q++;
        else
            return NULL;
    }
    return value_ends(*q) ? q : NULL;
}

/* A scalar or a one-line array of scalars at p; where it ends, or NULL. */
static const char *value_at(const char *p, char *text, size_t size, int *is_string) {
    if (*p != '[')
        return scalar(p, text, size, is_string);
    *is_string = 0;
    p = skip_ws(p + 1);
    while (*p != ']') {
        char item[PATH_MAX];
        int string;
        if (!(p = scalar(p, item, sizeof item, &string)))
            return NULL;
        p = skip_ws(p);
        if (*p == ',')
            p = skip_ws(p + 1);
        else if (*p != ']')
            return NULL;
    }
    return p + 1;
}

static int comment_or_end(const char *p) {
    p = skip_ws(p);
    return *p == '\0' || *p == '#';
}

/* Note `name` (a table when is_table); 0 where TOML forbids it beside what came before. */
static int define(struct names *seen, const char *name, int is_table) {
    size_t len = strlen(name);
    for (int i = 0; i < seen->count; i++) {
        const char *other = seen->name[i];
        size_t olen = strlen(other);
        if (strcmp(other, name) == 0)
            return 0;  /* a table or a key twice, or a key that is also a table */
        if (!seen->is_table[i] && olen < len && strncmp(other, name, olen) == 0 &&
            name[olen] == '.')
            return 0;  /* a table under a key */
        if (!is_table && len < olen && strncmp(other, name, len) == 0 && other[len] == '.')
            return 0;  /* a key where a table already is */
    }
    if (seen->count == NAMES_MAX || len >= NAME_LEN)
        return 0;
    snprintf(seen->name[seen->count], NAME_LEN, "%s", name);
    seen->is_table[seen->count++] = (char)is_table;
    return 1;
}

/* What this file reads of the config: `[runtime] path`, whether `[restore] on_create` is other
 * than "off", and `[service] socket` ("" for none; not `plain` where it is not an absolute path
 * or "": the Python program says what is wrong). */
struct frontend_config {
    char runtime[PATH_MAX];
    int on_create;
    char socket[sizeof ((struct sockaddr_un *)0)->sun_path];
    int socket_plain;
};

static void config_defaults(struct frontend_config *cfg) {
    snprintf(cfg->runtime, sizeof cfg->runtime, "runc");
    cfg->on_create = 0;
    snprintf(cfg->socket, sizeof cfg->socket, "%s", DEFAULT_SOCKET);
    cfg->socket_plain = 1;
}

/* A plain config (text) into cfg; 0 when the file needs the real parser. */
static int config_runtime(char *text, struct frontend_config *cfg) {
    static struct names seen;
    char table[NAME_LEN] = "";
    seen.count = 0;
    config_defaults(cfg);
    for (char *line = text, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r')
            line[--len] = '\0';
        for (const char *c = line; *c; c++)
            if ((unsigned char)*c >= 0x7f || ((unsigned char)*c < 0x20 && *c != '\t'))
                return 0;  /* not ASCII, or a control character (a lone CR among them) */
        const char *p = skip_ws(line);
        if (comment_or_end(p))
            continue;
        if (*p == '[') {
            table[0] = '\0';
            p = skip_ws(p + 1);
            while ((p = bare_key(p, table, sizeof table)) && *(p = skip_ws(p)) == '.') {
                if (strlen(table) + 1 >= sizeof table)
                    return 0;
                strcat(table, ".");
                p = skip_ws(p + 1);
            }
            if (!p || *p != ']' || !comment_or_end(p + 1) || !define(&seen, table, 1))
                return 0;
            continue;
        }
        char key[NAME_LEN] = "", value[PATH_MAX];
        int is_string;
        if (!(p = bare_key(p, key, sizeof key)) || *(p = skip_ws(p)) != '=')
            return 0;  /* a dotted or quoted key, or no value */
        p = value_at(skip_ws(p + 1), value, sizeof value, &is_string);
        if (!p || !comment_or_end(p))
            return 0;
        char full[2 * NAME_LEN];
        snprintf(full, sizeof full, "%s%s%s", table, table[0] ? "." : "", key);
        if (!define(&seen, full, 0) || strcmp(full, "runtime") == 0)
            return 0;  /* (`runtime` not a table: the Python program says so) */
        if (strcmp(full, "runtime.path") == 0) {
            if (!is_string || strlen(value) >= sizeof cfg->runtime)
                return 0;  /* not a string: the Python program says so */
            snprintf(cfg->runtime, sizeof cfg->runtime, "%s", value);
        }
        if (strcmp(full, "restore.on_create") == 0) {
            if (!is_string)
                return 0;  /* the Python program says what is wrong */
            cfg->on_create = strcmp(value, "off") != 0;
        }
        if (strcmp(full, "service.socket") == 0) {
            cfg->socket_plain = is_string && (value[0] == '/' || value[0] == '\0') &&
                                strlen(value) < sizeof cfg->socket;
            snprintf(cfg->socket, sizeof cfg->socket, "%s", cfg->socket_plain ? value : "");
        }
    }
    return 1;
}

/* The value of a flag of the subcommand (`--name V`, `--name=V`, `-name V`, `-name=V`); the
 * last one given wins, as in runc. */
static const char *flag_value(int argc, char **argv, int command, const char *name) {
    size_t len = strlen(name);
    const char *found = NULL;
    for (int i = command + 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--") == 0 || arg[0] != '-')
            continue;
        const char *body = arg + (arg[1] == '-' ? 2 : 1);
        if (strncmp(body, name, len) != 0)
            continue;
        if (body[len] == '=')
            found = body + len + 1;
        else if (body[len] == '\0' && i + 1 < argc)
            found = argv[++i];
    }
    return found;
}

/* Whether the file holds `needle` (read whole, up to 16 MiB). */
static int file_holds(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t cap = 64 * 1024, n = 0;
    char *text = malloc(cap + 1);
    while (text) {
        n += fread(text + n, 1, cap - n, f);
        if (n < cap || cap >= (16 << 20))
            break;
        char *bigger = realloc(text, cap * 2 + 1);
        if (!bigger) {
            free(text);
            text = NULL;
            break;
        }
        text = bigger;
        cap *= 2;
    }
    fclose(f);
    if (!text)
        return 1;  /* cannot tell: the Python program looks */
    int found = memmem(text, n, needle, strlen(needle)) != NULL;
    free(text);
    return found;
}

/* Restore on create: a `create` of a checkpoint image's container, a `start` of one restored. */
static int on_create_call(int argc, char **argv, int command) {
    char path[PATH_MAX];
    if (strcmp(argv[command], "create") == 0) {
        const char *bundle = flag_value(argc, argv, command, "bundle");
        if (!bundle)
            bundle = flag_value(argc, argv, command, "b");
        if (snprintf(path, sizeof path, "%s/config.json", bundle ? bundle : ".") >=
            (int)sizeof path)
            return 1;
        return file_holds(path, SPEC_MARK);
    }
    if (strcmp(argv[command], "start") == 0 && command + 1 < argc) {
        const char *id = argv[argc - 1];
        const char *root = RUNC_ROOT;
        for (int i = 1; i < command; i++) {
            const char *arg = argv[i];
            if (arg[0] != '-')
                continue;
            const char *body = arg + (arg[1] == '-' ? 2 : 1);
            if (strncmp(body, "root", 4) == 0) {
                if (body[4] == '=')
                    root = body + 5;
                else if (body[4] == '\0' && i + 1 < command)
                    root = argv[i + 1];
            }
        }
        if (id[0] == '-' || strchr(id, '/') ||
            snprintf(path, sizeof path, "%s/%s/" RESTORED_MARK, root, id) >= (int)sizeof path)
            return 0;
        return access(path, F_OK) == 0;
    }
    return 0;
}

/* The whole file, NUL-terminated; NULL when it cannot be read plainly (too big, a NUL). */
static char *read_config(FILE *f) {
    char *text = malloc(CONFIG_MAX + 1);
    if (!text)
        return NULL;
    size_t n = fread(text, 1, CONFIG_MAX + 1, f);
    if (ferror(f) || n > CONFIG_MAX || memchr(text, '\0', n)) {
        free(text);
        return NULL;
    }
    text[n] = '\0';
    return text;
}

static int usable(const char *path) {
    struct stat st;
    return access(path, X_OK) == 0 && stat(path, &st) == 0 && !S_ISDIR(st.st_mode);
}

static int is_self(const char *path) {
    char real[PATH_MAX];
    return realpath(path, real) && strcmp(real, self) == 0;
}

static void exec_runtime(const char *runtime, int argc, char **argv) {
    argv[0] = (char *)runtime;
    setenv(MARKER, runtime, 1);
    execv(runtime, argv);
    (void)argc;
}

/*
 * torpord's wire (torpor/handoff.py, docs/service.md): the request, one line of JSON
 * {"program", "argv", "env", "cwd", "umask"}, with fds 0, 1 and 2 attached (SCM_RIGHTS); then
 * lines back: {"accepted":true} or {"refused":...}, {"pid":N}, {"exit":N}. Nothing has run
 * before "accepted": until then, any failure means the command runs here.
 */
struct buf {
    char *data;
    size_t len, cap;
    int bad;  /* out of memory, or text that JSON cannot carry as it is (not UTF-8) */
};

static void put(struct buf *b, const char *text, size_t n) {
    if (b->bad)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 16384;
        while (b->len + n > cap)
            cap *= 2;
        char *bigger = realloc(b->data, cap);
        if (!bigger) {
            b->bad = 1;
            return;
        }
        b->data = bigger;
        b->cap = cap;
    }
    memcpy(b->data + b->len, text, n);
    b->len += n;
}

static void put_text(struct buf *b, const char *text) {
    put(b, text, strlen(text));
}

/* The length of the UTF-8 sequence at p; 0 where there is none (a stray or truncated byte, an
 * overlong form, a surrogate, past U+10FFFF): Python reads the request strictly. */
static size_t utf8_length(const unsigned char *p) {
    unsigned int cp, min;
    size_t n;
    if (p[0] < 0x80)
        return 1;
    if ((p[0] & 0xE0) == 0xC0)
        n = 2, cp = p[0] & 0x1Fu, min = 0x80;
    else if ((p[0] & 0xF0) == 0xE0)
        n = 3, cp = p[0] & 0x0Fu, min = 0x800;
    else if ((p[0] & 0xF8) == 0xF0)
        n = 4, cp = p[0] & 0x07u, min = 0x10000;
    else
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;  /* the string's end (NUL) included */
        cp = (cp << 6) | (p[i] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

/* text as a JSON string, `len` bytes of it (or up to its NUL where len is (size_t)-1) */
static void put_string(struct buf *b, const char *text, size_t len) {
    const unsigned char *p = (const unsigned char *)text;
    const unsigned char *end = len == (size_t)-1 ? p + strlen(text) : p + len;
    put(b, "\"", 1);
    while (p < end) {
        size_t n = utf8_length(p);
        if (!n || p + n > end) {
            b->bad = 1;
            return;
        }
        if (*p == '"' || *p == '\\') {
            char escaped[2] = {'\\', (char)*p};
            put(b, escaped, 2);
        } else if (*p < 0x20) {
            char escaped[8];
            snprintf(escaped, sizeof escaped, "\\u%04x", *p);
            put(b, escaped, 6);
        } else {
            put(b, (const char *)p, n);
        }
        p += n;
    }
    put(b, "\"", 1);
}

extern char **environ;

static int named(const char *entry, size_t key, const char *name) {
    return key == strlen(name) && strncmp(entry, name, key) == 0;
}

/* The request for `program` with this process's argv (argv[0] as given), environment,
 * directory and umask; 0 where it cannot be said (then the command runs here). */
static int request(struct buf *b, const char *program, int argc, char **argv,
                   const char *argv0) {
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        return 0;
    mode_t mask = umask(022);
    umask(mask);
    put_text(b, "{\"program\":");
    put_string(b, program, (size_t)-1);
    put_text(b, ",\"argv\":[");
    for (int i = 0; i < argc; i++) {
        if (i)
            put(b, ",", 1);
        put_string(b, i ? argv[i] : argv0, (size_t)-1);
    }
    put_text(b, "],\"env\":{");
    int first = 1;
#ifdef OWN_CONFIG
    if (!getenv("TORPOR_CONFIG")) {  /* as the Python launchers set it */
        put_text(b, "\"TORPOR_CONFIG\":");
        put_string(b, DEFAULT_CONFIG, (size_t)-1);
        first = 0;
    }
#endif
    for (char **entry = environ; *entry; entry++) {
        const char *eq = strchr(*entry, '=');
        size_t key = eq ? (size_t)(eq - *entry) : 0;
        if (!key || named(*entry, key, SELF_ENV) || named(*entry, key, CLI_SELF_ENV))
            continue;  /* no name; the front end's own notes to the Python programs */
        int again = 0;  /* a name given twice: the first counts, as getenv and Python read it */
        for (char **before = environ; before < entry && !again; before++)
            again = strncmp(*before, *entry, key + 1) == 0;
        if (again)
            continue;
        if (!first)
            put(b, ",", 1);
        first = 0;
        put_string(b, *entry, key);
        put(b, ":", 1);
        put_string(b, eq + 1, (size_t)-1);
    }
    put_text(b, "},\"cwd\":");
    put_string(b, cwd, (size_t)-1);
    char tail[64];
    snprintf(tail, sizeof tail, ",\"umask\":%u}\n", (unsigned)mask);
    put_text(b, tail);
    return !b->bad;
}

/* The request, fds 0, 1 and 2 (and `channel`, where there is one) riding on its first bytes. */
static int send_request(int sock, const struct buf *b, int channel) {
    int fds[4] = {0, 1, 2, channel};
    size_t nfds = channel >= 0 ? 4 : 3;
    union {
        char bytes[CMSG_SPACE(sizeof fds)];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct iovec iov = {.iov_base = b->data, .iov_len = b->len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.bytes,
                         .msg_controllen = CMSG_SPACE(nfds * sizeof *fds)};
    struct cmsghdr *header = CMSG_FIRSTHDR(&msg);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(nfds * sizeof *fds);
    memcpy(CMSG_DATA(header), fds, nfds * sizeof *fds);
    ssize_t n;
    do
        n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return 0;
    for (size_t sent = (size_t)n; sent < b->len; sent += (size_t)n) {
        do
            n = send(sock, b->data + sent, b->len - sent, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        if (n <= 0)
            return 0;
    }
    return 1;
}

struct lines {
    int sock;
    size_t len;
    char data[65536];
};

/* A whole line already received, without its newline (cut to `size`): 1, else 0. */
static int take_line(struct lines *in, char *out, size_t size) {
    char *newline = memchr(in->data, '\n', in->len);
    if (!newline)
        return 0;
    size_t n = (size_t)(newline - in->data);
    snprintf(out, size, "%.*s", (int)n, in->data);
    in->len -= n + 1;
    memmove(in->data, newline + 1, in->len);
    return 1;
}

/* More of the service's lines: 1, or 0 at the end of the stream, on an error, or for a line
 * longer than the buffer; -1 for a signal. */
static int receive_more(struct lines *in) {
    if (in->len == sizeof in->data)
        return 0;
    ssize_t got = recv(in->sock, in->data + in->len, sizeof in->data - in->len, 0);
    if (got < 0 && errno == EINTR)
        return -1;
    if (got <= 0)
        return 0;
    in->len += (size_t)got;
    return 1;
}

/* The next line from the service (see take_line); 0 at the end of the stream or an error. */
static int next_line(struct lines *in, char *out, size_t size) {
    while (!take_line(in, out, size)) {
        if (!receive_more(in))
            return 0;
    }
    return 1;
}

static const int FORWARDED[] = {SIGINT, SIGTERM, SIGHUP};  /* = handoff.FORWARDED_SIGNALS */
static volatile sig_atomic_t service_child;  /* the pid of torpord's child running the command */
static volatile sig_atomic_t runtime_child;  /* the runc this process runs for that child */
static volatile sig_atomic_t terminating;    /* a forwarded signal came: start nothing more */

static void forward(int signum) {
    int saved = errno;
    terminating = 1;
    if (service_child > 0)
        kill((pid_t)service_child, signum);
    if (runtime_child > 0)  /* as PR_SET_PDEATHSIG would, were this process ended by it */
        kill((pid_t)runtime_child, SIGKILL);
    errno = saved;
}

/*
 * torpor-runc's restore in torpord: the child there does all of torpor's work, but `runc
 * restore` must run below containerd's shim (the restored init is reparented to it), so the
 * child asks this process to run it, on a channel (a SOCK_SEQPACKET pair) handed over with fds
 * 0-2. torpor/shim/served.py is the other end. Packets, NUL-separated fields:
 *   child -> here: "run" ARGC ARGV... ENVC KEY=VALUE...   run it (die with this process)
 *   here -> child: "pid" N, then "ran" CODE once it ended (its exit status; -SIGNAL if killed),
 *                  the process left unreaped (a zombie) so that its pid names it until
 *   child -> here: "done"   (the child may have killed its tree meanwhile, past a deadline)
 */
static int send_packet(int channel, const char *kind, long value) {
    char packet[64];
    int n = snprintf(packet, sizeof packet, "%s%c%ld", kind, '\0', value);
    return send(channel, packet, (size_t)n, MSG_NOSIGNAL) == n;
}

/* The fields of a packet: count and list (NULL-terminated) from `fields`, at `*at`. */
static char **field_list(char *packet, size_t len, size_t *at) {
    char *end = packet + len, *p = packet + *at, *after;
    size_t count = 0;
    if (p >= end || !memchr(p, '\0', (size_t)(end - p)))
        return NULL;
    errno = 0;
    unsigned long n = strtoul(p, &after, 10);
    if (errno || after == p || *after || n > 65536)
        return NULL;
    p = after + 1;
    char **list = calloc(n + 1, sizeof *list);
    if (!list)
        return NULL;
    for (; count < n; count++) {
        char *nul = p < end ? memchr(p, '\0', (size_t)(end - p)) : NULL;
        if (!nul) {
            free(list);
            return NULL;
        }
        list[count] = p;
        p = nul + 1;
    }
    *at = (size_t)(p - packet);
    return list;
}

/* Whether the other end of `fd` hung up (or the socket failed). */
static int hung_up(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL));
}

/* Until `pid` (this process's child) ends, left unreaped; SIGKILL for it when the channel's
 * other end goes away first (the supervisor of this runc is gone: as its PR_SET_PDEATHSIG
 * would, were it that process's child). Its exit status; -SIGNAL for a signal. */
static long wait_supervised(pid_t pid, int channel) {
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    int killed = 0;
    siginfo_t info;
    for (;;) {
        if (!killed && (terminating || hung_up(channel))) {
            kill(pid, SIGKILL);
            killed = 1;
        }
        if (pidfd >= 0) {  /* the runtime's end, or (until it is killed) the channel's */
            struct pollfd ready[2] = {{.fd = pidfd, .events = POLLIN},
                                      {.fd = channel, .events = POLLRDHUP}};
            if (poll(ready, killed ? 1 : 2, -1) < 0 || !ready[0].revents)
                continue;
        }
        memset(&info, 0, sizeof info);
        if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT) == 0)
            break;
        if (errno != EINTR) {  /* (SIGCHLD ignored by whoever ran this: reset in handoff) */
            info.si_code = CLD_EXITED;
            info.si_status = 255;
            break;
        }
    }
    if (pidfd >= 0)
        close(pidfd);
    return info.si_code == CLD_EXITED ? info.si_status : -info.si_status;
}

/* One request from the channel, run and reported: 1, or 0 when the channel ended. Never once
 * the other end is gone or a signal came: nobody would supervise the runtime. */
static int run_for_service(int channel) {
    ssize_t size;
    if (terminating || hung_up(channel))
        return 0;
    do
        size = recv(channel, NULL, 0, MSG_PEEK | MSG_TRUNC);
    while (size < 0 && errno == EINTR);
    if (size <= 0)
        return 0;
    char *packet = malloc((size_t)size + 1);
    if (!packet)
        return 0;
    ssize_t n;
    do
        n = recv(channel, packet, (size_t)size, 0);
    while (n < 0 && errno == EINTR);
    char **args = NULL, **env = NULL;
    size_t at = 4;
    if (n != size || n < 4 || memcmp(packet, "run", 4) != 0 ||
        !(args = field_list(packet, (size_t)n, &at)) || !args[0] ||
        !(env = field_list(packet, (size_t)n, &at))) {
        free(args);
        free(packet);
        return 0;  /* not what the other end sends: the channel is done */
    }
    /* no forwarded signal between the fork and runtime_child: forward() kills what it names */
    sigset_t forwarded, before;
    sigemptyset(&forwarded);
    for (size_t i = 0; i < sizeof FORWARDED / sizeof *FORWARDED; i++)
        sigaddset(&forwarded, FORWARDED[i]);
    sigprocmask(SIG_BLOCK, &forwarded, &before);
    pid_t parent = getpid();
    pid_t pid = terminating ? -1 : fork();
    if (pid == 0) {
        for (size_t i = 0; i < sizeof FORWARDED / sizeof *FORWARDED; i++)
            signal(FORWARDED[i], SIG_DFL);
        sigprocmask(SIG_SETMASK, &before, NULL);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(137);  /* this process ended before the line above */
        execve(args[0], args, env);
        fprintf(stderr, "torpor-runc: cannot run %s: %s\n", args[0], strerror(errno));
        _exit(127);
    }
    if (pid > 0)
        runtime_child = pid;
    sigprocmask(SIG_SETMASK, &before, NULL);
    free(args);
    free(env);
    free(packet);
    long code = 127;  /* it could not be started: said as an exit status, with no pid */
    if (pid > 0) {
        send_packet(channel, "pid", pid);
        code = wait_supervised(pid, channel);
        runtime_child = 0;
    }
    char done[8];
    if (send_packet(channel, "ran", code)) {
        do
            n = recv(channel, done, sizeof done, 0);  /* "done", or the channel's end */
        while (n < 0 && errno == EINTR);
    }
    while (pid > 0 && waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
    return 1;
}

/* The command's exit status, from the service's lines, running what the channel asks (after
 * the lines already there: an exit among them ends it, and nothing more runs). */
static int follow(struct lines *in, int channel, const char *program) {
    char line[256];
    for (;;) {
        while (take_line(in, line, sizeof line)) {
            long value;
            if (sscanf(line, "{\"pid\":%ld", &value) == 1)
                service_child = (sig_atomic_t)value;
            else if (sscanf(line, "{\"exit\":%ld", &value) == 1)
                return (int)(value & 0xFF);
        }
        struct pollfd ready[2] = {{.fd = in->sock, .events = POLLIN},
                                  {.fd = channel, .events = POLLIN}};
        if (poll(ready, channel >= 0 ? 2 : 1, -1) < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "%s: error: waiting for torpord: %s\n", program, strerror(errno));
            return 1;
        }
        if (ready[0].revents) {
            if (receive_more(in) == 0) {
                fprintf(stderr, "%s: error: torpord closed the connection while the command "
                                "ran (pid %d); its output above is all there is\n",
                        program, (int)service_child);
                return 1;
            }
            continue;  /* its lines first */
        }
        if (channel >= 0 && ready[1].revents && !run_for_service(channel)) {
            close(channel);
            channel = -1;
        }
    }
}

/* The command's exit status from torpord; -1 where it ran nothing (run it here). `served`: a
 * runc restore, which the service's child runs through a channel to this process. */
static int handoff(const struct frontend_config *cfg, const char *program, int argc,
                   char **argv, const char *argv0, int served) {
    static struct lines in;
    const char *off = getenv("TORPOR_NO_SERVICE");
    if ((off && strcmp(off, "1") == 0) || !cfg->socket_plain || !cfg->socket[0])
        return -1;
    struct buf b = {0};
    if (!request(&b, program, argc, argv, argv0)) {
        free(b.data);
        return -1;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", cfg->socket);
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int pair[2] = {-1, -1};
    if (sock < 0 || connect(sock, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        (served && socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0)) {
        if (sock >= 0)
            close(sock);  /* none there, none listening, not ours to use */
        free(b.data);
        return -1;
    }
    int sent = send_request(sock, &b, pair[1]);
    free(b.data);
    if (pair[1] >= 0)
        close(pair[1]);
    char line[256];
    in.sock = sock;
    in.len = 0;
    if (!sent || !next_line(&in, line, sizeof line) || strcmp(line, "{\"accepted\":true}")) {
        close(sock);
        if (pair[0] >= 0)
            close(pair[0]);
        return -1;
    }
    struct sigaction action = {.sa_handler = forward};  /* no SA_RESTART: recv sees EINTR */
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < sizeof FORWARDED / sizeof *FORWARDED; i++)
        sigaction(FORWARDED[i], &action, NULL);
    if (served)
        signal(SIGCHLD, SIG_DFL);  /* runc's status is waited for (an inherited SIG_IGN) */
    return follow(&in, pair[0], program);
}

/* The config into cfg: 1 where this file read it (or there is none), 0 where the Python program
 * must read it. */
static int read_frontend_config(struct frontend_config *cfg) {
    const char *explicit = getenv("TORPOR_CONFIG");
    config_defaults(cfg);
    FILE *f = fopen(explicit && *explicit ? explicit : DEFAULT_CONFIG, "r");
    if (!f)
        return !(explicit && *explicit);  /* a named file that is missing: said there */
    char *text = read_config(f);
    fclose(f);
    int plain = text && config_runtime(text, cfg);
    free(text);
    return plain;
}

/* `torpor`: the command to torpord, else the Python CLI (which tries torpord itself where this
 * file could not read the config). */
static int cli(int argc, char **argv) {
    struct frontend_config cfg;
    /* argv[0] as a `#!` script's: a path, never a bare name that the command's directory
     * would complete (torpor finds torpor-runc beside itself) */
    if (!realpath("/proc/self/exe", self))
        snprintf(self, sizeof self, "%s", argv[0]);
    if (read_frontend_config(&cfg)) {
        int status = handoff(&cfg, CLI_NAME, argc, argv, self, 0);
        if (status >= 0)
            return status;
    }
    setenv(CLI_SELF_ENV, self, 1);
    run_python(TORPOR_CLI, CLI_NAME, argc, argv);
    return 127;
}

/*
 * torpor-hook's createRuntime, for what nearly every restore asks: runc runs it at CRIU's
 * setup-namespaces step, and where the plan torpor-runc left only brings lo up, this brings it
 * up (setns into the restored init's network namespace, one RTM_NEWLINK) without starting
 * Python. Everything else (other hooks, other plans, an OCI state this file does not read
 * plainly) goes to the Python hook (TORPOR_HOOK), with the state it read handed on as its stdin.
 */
struct oci_state {
    char id[256], bundle[PATH_MAX];
    long pid;
};

static const char *json_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

/* A string at p without escapes into out (NULL out: skipped, valid escapes allowed); after
 * it, or NULL. (The whole state is ASCII: read_oci_state leaves anything else to Python.) */
static const char *json_string(const char *p, char *out, size_t size) {
    if (*p++ != '"')
        return NULL;
    size_t n = 0;
    for (; *p != '"'; p++) {
        if (!*p || (unsigned char)*p < 0x20)
            return NULL;
        if (*p == '\\') {
            if (out)
                return NULL;  /* an escape in a value this file reads: Python reads it */
            p++;
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!p[i] || !strchr("0123456789abcdefABCDEF", p[i]))
                        return NULL;
                p += 4;
            } else if (!*p || !strchr("\"\\/bfnrt", *p)) {
                return NULL;
            }
            continue;
        }
        if (out) {
            if (n + 1 >= size)
                return NULL;
            out[n++] = *p;
        }
    }
    if (out)
        out[n] = '\0';
    return p + 1;
}

static const char *json_digits(const char *p) {
    const char *start = p;
    while (*p >= '0' && *p <= '9')
        p++;
    return p > start ? p : NULL;
}

/* A number at p, as JSON writes one; after it, or NULL. */
static const char *json_number(const char *p) {
    if (*p == '-')
        p++;
    if (*p == '0')
        p++;
    else if (!(p = *p >= '1' && *p <= '9' ? json_digits(p) : NULL))
        return NULL;
    if (*p == '.' && !(p = json_digits(p + 1)))
        return NULL;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!(p = json_digits(p)))
            return NULL;
    }
    return p;
}

/* Any JSON value at p, skipped; after it, or NULL. */
static const char *json_skip(const char *p, int depth) {
    p = json_ws(p);
    if (*p == '"')
        return json_string(p, NULL, 0);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        if (depth > 64)
            return NULL;
        p = json_ws(p + 1);
        if (*p == close)
            return p + 1;
        for (;;) {
            if (close == '}') {
                if (!(p = json_string(json_ws(p), NULL, 0)) || *(p = json_ws(p)) != ':')
                    return NULL;
                p++;
            }
            if (!(p = json_skip(p, depth + 1)))
                return NULL;
            p = json_ws(p);
            if (*p == close)
                return p + 1;
            if (*p++ != ',')
                return NULL;
        }
    }
    for (const char *const *word = (const char *const[]){"true", "false", "null", NULL}; *word;
         word++)
        if (strncmp(p, *word, strlen(*word)) == 0)
            return p + strlen(*word);
    return json_number(p);
}

/* The OCI state's id, bundle and pid; 0 where they are not plainly there. */
static int read_oci_state(const char *text, struct oci_state *state) {
    int found = 0;
    state->pid = -1;
    for (const char *c = text; *c; c++)
        if ((unsigned char)*c >= 0x80)
            return 0;  /* UTF-8 (or not): Python reads it */
    const char *p = json_ws(text);
    if (*p++ != '{')
        return 0;
    for (p = json_ws(p); *p != '}';) {
        char key[64];
        if (!(p = json_string(p, key, sizeof key)) || *(p = json_ws(p)) != ':')
            return 0;
        p = json_ws(p + 1);
        if (strcmp(key, "id") == 0) {
            if (!(p = json_string(p, state->id, sizeof state->id)))
                return 0;
            found |= 1;
        } else if (strcmp(key, "bundle") == 0) {
            if (!(p = json_string(p, state->bundle, sizeof state->bundle)))
                return 0;
            found |= 2;
        } else if (strcmp(key, "pid") == 0) {
            const char *end = json_digits(p);
            if (!end || (*p == '0' && end - p > 1) || end - p > 9)
                return 0;  /* plain digits only, as JSON and a pid have them */
            state->pid = strtol(p, NULL, 10);
            p = end;
            found |= 4;
        } else if (!(p = json_skip(p, 0))) {
            return 0;
        }
        p = json_ws(p);
        if (*p == ',') {
            p = json_ws(p + 1);
            if (*p != '"')
                return 0;  /* a trailing comma */
        } else if (*p != '}') {
            return 0;
        }
    }
    return found == 7 && *json_ws(p + 1) == '\0';
}

/* A path as os.path.normpath leaves it: absolute, no empty, "." or ".." part, no final "/". */
static int normal_path(const char *path) {
    if (path[0] != '/' || path[1] == '/' || (path[1] && path[strlen(path) - 1] == '/'))
        return 0;
    for (const char *part = path + 1; *part; ) {
        const char *end = strchrnul(part, '/');
        size_t len = (size_t)(end - part);
        if (len == 0 || (len == 1 && part[0] == '.') || (len == 2 && !strncmp(part, "..", 2)))
            return 0;
        part = *end ? end + 1 : end;
    }
    return 1;
}

static unsigned long crc32_of(const char *text) {  /* = zlib.crc32 */
    unsigned long crc = 0xFFFFFFFFul;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        crc ^= *p;
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0xEDB88320ul & (0ul - (crc & 1)));
    }
    return crc ^ 0xFFFFFFFFul;
}

/* The plan's path (torpor.capture.records.record_dir, the bundle's real path); 0 where the
 * bundle cannot be resolved or is not plain. */
static int plan_path(const char *state_dir, struct oci_state *state, char *out, size_t size) {
    char real[PATH_MAX];
    if (!realpath(state->bundle, real) || strlen(real) >= sizeof state->bundle)
        return 0;  /* (Python's realpath resolves what exists of it) */
    snprintf(state->bundle, sizeof state->bundle, "%s", real);
    if (!normal_path(state->bundle) || !state->id[0] || strchr(state->id, '/'))
        return 0;
    const char *base = strrchr(state->bundle, '/') + 1;
    char ns[256] = "_";
    if (strcmp(base, state->id) == 0 && base - 1 > state->bundle) {
        const char *parent = base - 1, *start = parent;
        while (start > state->bundle && start[-1] != '/')
            start--;
        if ((size_t)(parent - start) >= sizeof ns)
            return 0;
        snprintf(ns, sizeof ns, "%.*s", (int)(parent - start), start);
    }
    return snprintf(out, size, "%s/" RECORDS_DIR "/%s/%s.%08lx/" RESTORE_PLAN, state_dir, ns,
                    state->id, crc32_of(state->bundle)) < (int)size;
}

/* lo up in pid's network namespace; 0 with errno set where it failed. */
static int lo_up(long pid) {
    char path[64];
    if (pid <= 0) {
        errno = ESRCH;
        return 0;
    }
    snprintf(path, sizeof path, "/proc/%ld/ns/net", pid);
    int ns = open(path, O_RDONLY | O_CLOEXEC);
    if (ns < 0)
        return 0;
    int entered = setns(ns, CLONE_NEWNET) == 0;
    int error = errno;
    close(ns);
    if (!entered) {
        errno = error;
        return 0;
    }
    int sock = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (sock < 0)
        return 0;
    struct {
        struct nlmsghdr header;
        struct ifinfomsg info;
    } request = {
        .header = {.nlmsg_len = sizeof request, .nlmsg_type = RTM_NEWLINK,
                   .nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK, .nlmsg_seq = 1},
        .info = {.ifi_family = AF_UNSPEC, .ifi_index = 1, .ifi_flags = IFF_UP,
                 .ifi_change = IFF_UP},  /* lo: index 1 in a new namespace */
    };
    char reply[4096];
    ssize_t got = -1;
    if (send(sock, &request, sizeof request, 0) == (ssize_t)sizeof request)
        got = recv(sock, reply, sizeof reply, 0);
    if (got < (ssize_t)(sizeof(struct nlmsghdr) + sizeof(int))) {
        if (got >= 0)
            errno = EPROTO;  /* a short answer */
        close(sock);
        return 0;
    }
    close(sock);
    struct nlmsghdr *answer = (struct nlmsghdr *)reply;
    if (answer->nlmsg_type == NLMSG_ERROR) {
        int error = ((struct nlmsgerr *)NLMSG_DATA(answer))->error;
        if (error) {
            errno = -error;
            return 0;
        }
    }
    return 1;
}

static int write_all(int fd, const char *data, size_t len) {
    while (len) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 0;
        data += n;
        len -= (size_t)n;
    }
    return 1;
}

/* The Python hook, its stdin what this process read of its own and whatever of it is still
 * unread (an anonymous file: all of it, whatever its size). */
static void python_hook(int argc, char **argv, const char *input, size_t len) {
    if (input) {
        int fd = (int)syscall(SYS_memfd_create, "torpor-hook-state", 0);
        int whole = fd >= 0 && write_all(fd, input, len);
        char more[65536];
        ssize_t n;
        while (whole && ((n = read(0, more, sizeof more)) > 0 || (n < 0 && errno == EINTR)))
            whole = n < 0 || write_all(fd, more, (size_t)n);
        if (!whole || lseek(fd, 0, SEEK_SET) != 0 || dup2(fd, 0) < 0) {
            fprintf(stderr, HOOK_NAME ": cannot hand the OCI state on: %s\n", strerror(errno));
            _exit(1);
        }
        if (fd != 0)
            close(fd);
    }
    run_python(TORPOR_HOOK, HOOK_NAME, argc, argv);
}

static int hook(int argc, char **argv) {
    const char *state_dir = HOOK_STATE_DIR;
    int at = 1;
    if (argc >= 3 && strcmp(argv[1], "--state-dir") == 0) {
        state_dir = argv[2];
        at = 3;
    }
    if (argc != at + 1 || strcmp(argv[at], "createRuntime") != 0 || state_dir[0] != '/')
        python_hook(argc, argv, NULL, 0);  /* poststop, the others, a usage error */
    static char input[1 << 20];
    size_t len = 0;
    ssize_t n;
    while (len < sizeof input - 1 &&
           ((n = read(0, input + len, sizeof input - 1 - len)) > 0 || (n < 0 && errno == EINTR)))
        len += n > 0 ? (size_t)n : 0;
    input[len] = '\0';
    struct oci_state state;
    char plan[PATH_MAX + 512], text[256];
    if (len == sizeof input - 1 || memchr(input, '\0', len) ||
        !read_oci_state(input, &state) || !plan_path(state_dir, &state, plan, sizeof plan))
        python_hook(argc, argv, input, len);
    int fd = open(plan, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        return 0;  /* not a restore: nothing to do */
    if (fd < 0)
        python_hook(argc, argv, input, len);
    n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n != (ssize_t)strlen(LO_ONLY_PLAN) || memcmp(text, LO_ONLY_PLAN, (size_t)n) != 0)
        python_hook(argc, argv, input, len);  /* addresses or routes too: pyroute2's work */
    int up = lo_up(state.pid);
    int error = errno;
    unlink(plan);  /* applied or not, as the Python hook does */
    if (!up) {
        fprintf(stderr, HOOK_NAME ": createRuntime failed: bringing lo up in the network "
                        "namespace of pid %ld: %s\n", state.pid, strerror(error));
        return 1;
    }
    return 0;
}

/* containerd-shim-torpor-v2: containerd's runc shim, with torpor-runc as its runc. */
static int shim_launcher(int argc, char **argv) {
    const char *search = getenv("PATH");
    char shim[PATH_MAX];
    snprintf(shim, sizeof shim, "%s", TORPOR_SHIM);
    char *dirs = strdup(search && *search ? search : DEFAULT_PATH);
    for (char *dir = strtok(dirs, ":"); dir; dir = strtok(NULL, ":")) {
        char candidate[PATH_MAX];
        if (dir[0] == '/' && snprintf(candidate, sizeof candidate, "%s/%s", dir, RUNC_SHIM) <
                                 (int)sizeof candidate && usable(candidate)) {
            snprintf(shim, sizeof shim, "%s", candidate);
            break;
        }
    }
    char path[8192];
    snprintf(path, sizeof path, "%s:%s", TORPOR_RUNC_DIR, search && *search ? search : DEFAULT_PATH);
    setenv("PATH", path, 1);
    argv[0] = shim;
    execv(shim, argv);
    fprintf(stderr, SHIM_NAME ": cannot run %s: ", shim[0] ? shim : RUNC_SHIM);
    perror(NULL);
    (void)argc;
    return 127;
}

int main(int argc, char **argv) {
    const char *name = strrchr(argv[0], '/');
    name = name ? name + 1 : argv[0];
    if (strcmp(name, SHIM_NAME) == 0)
        return shim_launcher(argc, argv);
    if (TORPOR_CLI[0] && strcmp(name, CLI_NAME) == 0)
        return cli(argc, argv);
    if (TORPOR_HOOK[0] && strcmp(name, HOOK_NAME) == 0)
        return hook(argc, argv);
    if (!realpath("/proc/self/exe", self))
        self[0] = '\0';
    int command = subcommand(argc, argv);
    struct frontend_config cfg;
    int plain = read_frontend_config(&cfg);
    if (command && listed(argv[command], INTERCEPTED) && !asks_for_help(argc, argv, command)) {
        /* = torpor/shim/main.py's SERVED; runc leading back here is said in words there */
        int restore = strcmp(argv[command], "restore") == 0;
        if (plain && !getenv(MARKER) && (!restore || detached(argc, argv, command))) {
            /* a restore is "torpor-runc-served", which a torpord older than the channel
             * refuses (it would run runc itself, below torpord) */
            int status = handoff(&cfg, restore ? "torpor-runc-served" : "torpor-runc", argc,
                                 argv, self[0] ? self : argv[0], restore);
            if (status >= 0)
                return status;
        }
        to_python(argc, argv);
    }
    if (!plain)
        to_python(argc, argv);
    if (cfg.on_create && command && !asks_for_help(argc, argv, command) &&
        on_create_call(argc, argv, command))
        to_python(argc, argv);
    if (getenv(MARKER))
        to_python(argc, argv);  /* runc led back to torpor-runc: said in words there */

    const char *runtime = cfg.runtime;
    if (strchr(runtime, '/')) {
        if (runtime[0] == '/' && usable(runtime) && !is_self(runtime))
            exec_runtime(runtime, argc, argv);
        to_python(argc, argv);
    }
    const char *search = getenv("PATH");
    char *dirs = strdup(search && *search ? search : DEFAULT_PATH);
    for (char *dir = strtok(dirs, ":"); dir; dir = strtok(NULL, ":")) {
        char candidate[PATH_MAX];
        if (dir[0] != '/' || snprintf(candidate, sizeof candidate, "%s/%s", dir, runtime) >=
                                 (int)sizeof candidate)
            continue;
        if (usable(candidate) && !is_self(candidate))
            exec_runtime(candidate, argc, argv);
    }
    to_python(argc, argv);  /* not found, or failed to start: reported there */
    return 127;
}
