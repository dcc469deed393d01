/* cmd_inspect.c — `awqd inspect`. Placeholder until the checkpoint loader lands. */
#include "server/cmd.h"

#include <stdio.h>

int cmd_inspect(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: awqd inspect DIR [--json] [--tp N]\n\nNot built yet: the checkpoint loader.\n");
        return 0;
    }
    return cmd_not_built("inspect", "the checkpoint loader");
}
