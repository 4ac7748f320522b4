/* repl.c - `tinyloop repl [MODEL]`: runs LuaJIT on lua/tinyloop/repl.lua of
 * the checkout this binary belongs to (<root>/bin/tinyloop), with
 * LUA_PATH pointing at <root>/lua and TINYLOOP_LIB at
 * <root>/build/libtinyloop.so, so it works without installing anything. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int tl_cli_repl(int argc, char **argv);

/* <root> from /proc/self/exe = <root>/bin/tinyloop. */
static int repo_root(char *out, size_t cap) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return -1;
    exe[n] = '\0';
    for (int i = 0; i < 2; i++) { /* strip "/tinyloop", then "/bin" */
        char *slash = strrchr(exe, '/');
        if (!slash) return -1;
        *slash = '\0';
    }
    if (snprintf(out, cap, "%s", exe[0] ? exe : "/") >= (int)cap) return -1;
    return 0;
}

int tl_cli_repl(int argc, char **argv) {
    char root[PATH_MAX], script[PATH_MAX + 64], lib[PATH_MAX + 64], path[3 * PATH_MAX];
    if (repo_root(root, sizeof root)) {
        fprintf(stderr, "tinyloop repl: cannot find the source tree from /proc/self/exe\n");
        return 1;
    }
    snprintf(script, sizeof script, "%s/lua/tinyloop/repl.lua", root);
    if (access(script, R_OK)) {
        fprintf(stderr, "tinyloop repl: %s: %s\n", script, strerror(errno));
        return 1;
    }
    const char *old = getenv("LUA_PATH");
    snprintf(path, sizeof path, "%s/lua/?.lua;%s/lua/?/init.lua;%s", root, root, old ? old : ";;");
    setenv("LUA_PATH", path, 1);
    snprintf(lib, sizeof lib, "%s/build/libtinyloop.so", root);
    if (!getenv("TINYLOOP_LIB") && access(lib, R_OK) == 0) setenv("TINYLOOP_LIB", lib, 1);

    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!args) return 1;
    args[0] = "luajit";
    args[1] = script;
    for (int i = 0; i < argc; i++) args[2 + i] = argv[i];
    execvp("luajit", args);
    fprintf(stderr, "tinyloop repl: cannot run luajit: %s (install the luajit2 package)\n", strerror(errno));
    free(args);
    return 127;
}
