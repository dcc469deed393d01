/* cmd_tokenize.c — `awqd tokenize` / `awqd detokenize`. Placeholder until the
 * tokenizer lands. */
#include "server/cmd.h"

#include <stdio.h>

int cmd_tokenize(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: awqd tokenize --model DIR (--text T | --file F | --jsonl F) [--json] [--special]\n\n"
               "Not built yet: the tokenizer.\n");
        return 0;
    }
    return cmd_not_built("tokenize", "the tokenizer");
}

int cmd_detokenize(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: awqd detokenize --model DIR --ids 1,2,3\n\nNot built yet: the tokenizer.\n");
        return 0;
    }
    return cmd_not_built("detokenize", "the tokenizer");
}
