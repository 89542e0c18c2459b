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
 * Called as containerd-shim-torpor-v2 (the same binary under that name), it is the shim
 * launcher instead: containerd runs it for the runtime io.containerd.torpor.v2, and it runs
 * containerd's runc v2 shim (the one on containerd's PATH, else TORPOR_SHIM) with TORPOR_RUNC_DIR,
 * whose `runc` is torpor-runc, first on PATH.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
#define SHIM_NAME "containerd-shim-torpor-v2"
#define RUNC_SHIM "containerd-shim-runc-v2"

#define MARKER "TORPOR_RUNC_LOWLEVEL"  /* set for runc: seeing it means runc led back here */
#define SELF_ENV "TORPOR_RUNC_PATH"    /* tells the Python program where torpor-runc is */
#ifndef DEFAULT_CONFIG  /* a prefix install's own (packaging/install.sh) */
#define DEFAULT_CONFIG "/etc/torpor/config.toml"
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

static int asks_for_help(int argc, char **argv, int command) {
    for (int i = command + 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            return 0;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0 ||
            strcmp(argv[i], "-help") == 0)
            return 1;
    }
    return 0;
}

static void to_python(int argc, char **argv) {
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!args)
        _exit(127);
    args[0] = TORPOR_PYTHON;
    args[1] = "-S";
    args[2] = TORPOR_SCRIPT;
    for (int i = 1; i < argc; i++)
        args[i + 2] = argv[i];
    setenv(SELF_ENV, self, 1);
    execv(TORPOR_PYTHON, args);
    fprintf(stderr, "torpor-runc: cannot run %s: ", TORPOR_PYTHON);
    perror(NULL);
    _exit(127);
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

/* `[runtime] path` of a plain config (text) into out, and whether `[restore] on_create` is
 * other than "off"; 0 when the file needs the real parser. */
static int config_runtime(char *text, char *out, size_t size, int *on_create) {
    static struct names seen;
    char table[NAME_LEN] = "";
    seen.count = 0;
    *on_create = 0;
    snprintf(out, size, "runc");
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
            if (!is_string || strlen(value) >= size)
                return 0;  /* not a string: the Python program says so */
            snprintf(out, size, "%s", value);
        }
        if (strcmp(full, "restore.on_create") == 0) {
            if (!is_string)
                return 0;  /* the Python program says what is wrong */
            *on_create = strcmp(value, "off") != 0;
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
    if (strcmp(name ? name + 1 : argv[0], SHIM_NAME) == 0)
        return shim_launcher(argc, argv);
    if (!realpath("/proc/self/exe", self))
        self[0] = '\0';
    int command = subcommand(argc, argv);
    if (command && listed(argv[command], INTERCEPTED) && !asks_for_help(argc, argv, command))
        to_python(argc, argv);

    const char *explicit = getenv("TORPOR_CONFIG");
    char runtime[PATH_MAX];
    int on_create = 0;
    FILE *f = fopen(explicit && *explicit ? explicit : DEFAULT_CONFIG, "r");
    if (!f) {
        if (explicit && *explicit)
            to_python(argc, argv);  /* it says which file is missing */
        snprintf(runtime, sizeof runtime, "runc");
    } else {
        char *text = read_config(f);
        fclose(f);
        if (!text || !config_runtime(text, runtime, sizeof runtime, &on_create))
            to_python(argc, argv);
        free(text);
    }
    if (on_create && command && !asks_for_help(argc, argv, command) &&
        on_create_call(argc, argv, command))
        to_python(argc, argv);
    if (getenv(MARKER))
        to_python(argc, argv);  /* runc led back to torpor-runc: said in words there */

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
