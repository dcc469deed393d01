/* bench_tokenizer.c — `awqd bench tokenizer`. Placeholder until the tokenizer lands. */
#include "engine/bench.h"
#include "server/cmd.h"

int bench_tokenizer(int argc, char **argv) { return cmd_not_built("bench tokenizer", "the tokenizer"); }
