/* bench_e2e.c — `awqd bench e2e`. Placeholder until the GPU model lands. */
#include "engine/bench.h"
#include "server/cmd.h"

int bench_e2e(int argc, char **argv) { return cmd_not_built("bench e2e", "the whole model on the GPU"); }
