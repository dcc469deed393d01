/* main.c — the awqd binary: a table of subcommands. Only main exits. */
#include "server/cmd.h"

#include <stdio.h>
#include <string.h>

struct subcommand {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
};

static const struct subcommand COMMANDS[] = {
    {"serve", cmd_serve, "serve a model over the OpenAI-compatible HTTP API"},
    {"generate", cmd_generate, "generate tokens for one prompt (and dump logits)"},
    {"inspect", cmd_inspect, "describe a checkpoint: family, shapes, quantization, bytes"},
    {"tokenize", cmd_tokenize, "text -> token ids with a model's tokenizer"},
    {"detokenize", cmd_detokenize, "token ids -> text"},
    {"mkmodel", cmd_mkmodel, "write a synthetic AWQ checkpoint (tiny, qwen3-8b, ...)"},
    {"quantize", cmd_quantize, "quantize an fp16/bf16 checkpoint to AWQ INT4"},
    {"bench", cmd_bench, "benchmarks: kernels, e2e, tokenizer"},
};
#define N_COMMANDS (int)(sizeof COMMANDS / sizeof COMMANDS[0])

static void usage(FILE *f) {
    fprintf(f,
            "awqd %s — serve AWQ INT4 language models over an OpenAI-compatible API\n\n"
            "usage: awqd SUBCOMMAND [options]     (awqd SUBCOMMAND --help for its options)\n\n"
            "subcommands:\n",
            AWQD_VERSION);
    for (int i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-11s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fprintf(f, "\n  --help      this text\n  --version   print the version\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("awqd %s\n", AWQD_VERSION);
        return 0;
    }
    for (int i = 0; i < N_COMMANDS; i++)
        if (strcmp(argv[1], COMMANDS[i].name) == 0) return COMMANDS[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "awqd: unknown subcommand \"%s\"\n\n", argv[1]);
    usage(stderr);
    return 2;
}
