/* cmd_bench.c — `awqd bench WHAT`: dispatches to the benchmark of each part.
 * Each benchmark lives with the code it measures and is declared in bench.h. */
#include "engine/bench.h"
#include "server/cmd.h"

#include <stdio.h>
#include <string.h>

struct bench {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
};

static const struct bench BENCHES[] = {
    {"kernels", bench_kernels, "W4A16 GEMV/GEMM vs cuBLAS FP16 and the copy rate (GPU)"},
    {"chain", bench_chain, "o -> norm -> gate|up -> down at batch 1: three kernels vs one persistent (GPU)"},
    {"e2e", bench_e2e, "decode tokens/s and TTFT of a whole model"},
    {"tokenizer", bench_tokenizer, "encode/decode MB/s vs the JS reference"},
};
#define N_BENCHES (int)(sizeof BENCHES / sizeof BENCHES[0])

int cmd_bench(int argc, char **argv) {
    if (argc < 2 || cmd_wants_help(argc, argv)) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: awqd bench WHAT [options]   (awqd bench WHAT --help)\n\n");
        for (int i = 0; i < N_BENCHES; i++)
            fprintf(f, "  %-10s %s\n", BENCHES[i].name, BENCHES[i].summary);
        fprintf(f, "  %-10s every one of them in turn\n", "all");
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "all") == 0) {
        int worst = 0;
        for (int i = 0; i < N_BENCHES; i++) {
            char *sub[] = {(char *)BENCHES[i].name, NULL};
            int rc = BENCHES[i].fn(1, sub);
            if (rc > worst) worst = rc;
        }
        return worst;
    }
    for (int i = 0; i < N_BENCHES; i++)
        if (strcmp(argv[1], BENCHES[i].name) == 0) return BENCHES[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "awqd bench: unknown benchmark \"%s\" (kernels, chain, e2e, tokenizer, all)\n", argv[1]);
    return 2;
}
