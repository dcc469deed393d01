/* cmd_quantize.c — `awqd quantize`. Placeholder until the checkpoint writer lands. */
#include "server/cmd.h"

#include <stdio.h>

int cmd_quantize(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: awqd quantize IN OUT\n\nNot built yet: the checkpoint writer.\n");
        return 0;
    }
    return cmd_not_built("quantize", "the checkpoint writer");
}
