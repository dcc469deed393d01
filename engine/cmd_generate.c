/* cmd_generate.c — `awqd generate`. Placeholder until the model forward pass lands. */
#include "server/cmd.h"

#include <stdio.h>

int cmd_generate(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: awqd generate --model DIR [--backend cpu|cuda] (--prompt-ids 1,2,3 | --prompt TEXT) [--max-tokens N] [--json] [--logits-out FILE]\n\nNot built yet: the model forward pass.\n");
        return 0;
    }
    return cmd_not_built("generate", "the model forward pass");
}
