/* cmd.c — helpers shared by the subcommands (see cmd.h). */
#include "server/cmd.h"

#include <stdio.h>
#include <string.h>

int cmd_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return 1;
    return 0;
}

int cmd_not_built(const char *name, const char *what) {
    fprintf(stderr, "awqd %s: not built yet (%s)\n", name, what);
    return 2;
}
