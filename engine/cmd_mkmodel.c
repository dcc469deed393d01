/* cmd_mkmodel.c — `awqd mkmodel`. Placeholder until the checkpoint writer lands. */
#include "server/cmd.h"

#include <stdio.h>

int cmd_mkmodel(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: awqd mkmodel PRESET OUTDIR [--seed N]\n\nNot built yet: the checkpoint writer.\n");
        return 0;
    }
    return cmd_not_built("mkmodel", "the checkpoint writer");
}
