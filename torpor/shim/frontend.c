/*
 * torpor-runc's front end: on every runtime call containerd makes, decide between torpor and
 * runc without starting Python.
 *
 * `checkpoint` and `restore` go to torpor-runc's Python program (TORPOR_SCRIPT, run by
 * TORPOR_PYTHON); `-h`/`--help` and every other subcommand are execve'd to the low-level
 * runtime, so argv, stdio, inherited fds, signals and the exit status stay runc's. The runtime is
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
#define DEFAULT_CONFIG "/etc/torpor/config.toml"
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

static const char *const INTERCEPTED[] = {"checkpoint", "restore", NULL};
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

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t')
        s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r'))
        *--end = '\0';
    return s;
}

/* `[runtime] path` of a plain config file into out; 0 when the file needs the real parser. */
static int config_runtime(FILE *f, char *out, size_t size) {
    char line[4096];
    int in_runtime = 0;
    snprintf(out, size, "runc");
    while (fgets(line, sizeof line, f)) {
        if (!strchr(line, '\n') && !feof(f))
            return 0;  /* a line longer than we read: not plain */
        char *text = trim(line);
        if (*text == '\0' || *text == '#')
            continue;
        size_t len = strlen(text);
        if (text[0] == '[') {
            if (text[1] == '[' || text[len - 1] != ']')
                return 0;
            text[len - 1] = '\0';
            in_runtime = strcmp(trim(text + 1), "runtime") == 0;
            continue;
        }
        char *eq = strchr(text, '=');
        if (!eq)
            return 0;
        *eq = '\0';
        char *key = trim(text), *value = trim(eq + 1);
        if (!in_runtime || strcmp(key, "path") != 0)
            continue;  /* other keys: the Python program checks them where it reads them */
        size_t vlen = strlen(value);
        char quote = value[0];
        if (vlen < 2 || (quote != '"' && quote != '\'') || value[vlen - 1] != quote)
            return 0;
        value[vlen - 1] = '\0';
        value++;
        if (strchr(value, quote) || (quote == '"' && strchr(value, '\\')) || strlen(value) >= size)
            return 0;
        snprintf(out, size, "%s", value);
    }
    return 1;
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
    FILE *f = fopen(explicit && *explicit ? explicit : DEFAULT_CONFIG, "r");
    if (!f) {
        if (explicit && *explicit)
            to_python(argc, argv);  /* it says which file is missing */
        snprintf(runtime, sizeof runtime, "runc");
    } else {
        int plain = config_runtime(f, runtime, sizeof runtime);
        fclose(f);
        if (!plain)
            to_python(argc, argv);
    }
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
