/* cmd_mkmodel.c — `awqd mkmodel PRESET OUTDIR [--seed N] [--threads N]
 * [--tokenizer DIR] [--fp16]`: writes a synthetic HF AWQ checkpoint
 * (engine/mkmodel.h). */
#include "engine/mkmodel.h"
#include "engine/util.h"
#include "server/cmd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: awqd mkmodel PRESET OUTDIR [--seed N] [--threads N] [--tokenizer DIR] [--fp16]\n"
            "                                   [--layers N]\n"
            "\n"
            "Writes a synthetic but genuine Hugging Face AWQ checkpoint (config.json with\n"
            "quantization_config awq/gemm/4 bits/group 128/zero point, generation_config.json,\n"
            "safetensors, sharded with an index when large) plus the real tokenizer of the\n"
            "preset's family. Weights: normal(0, 0.02), quantized round-to-nearest with a zero\n"
            "point per group, packed in AWQ order; the same seed gives the same bytes.\n"
            "\n"
            "Presets:\n"
            "  tiny        Qwen3 family, hidden 128, 4 layers, 4/2 heads x 128, vocab 151936 (~40 MB)\n"
            "  qwen3-0.6b  qwen3-8b  qwen3-32b  llama3-8b  llama3-70b   (real shapes)\n"
            "  qwen3-32b-rank2  qwen3-32b-rank4  the shapes of one tp = 2 / 4 rank of qwen3-32b,\n"
            "                   to time on one GPU (no all-reduce; the lm_head stays whole)\n"
            "\n"
            "Options:\n"
            "  --seed N         generator seed (default 0)\n"
            "  --threads N      writer threads (default: one per CPU)\n"
            "  --tokenizer DIR  folder with tokenizer.json + tokenizer_config.json (or DIR/qwen3,\n"
            "                   DIR/llama3); else $AWQD_TOKENIZER_DIR/<family>, the installed\n"
            "                   share/awqd/tokenizers/<family>, or the source tree's tests/js\n"
            "  --fp16           write the unquantized fp16 model instead (input for awqd quantize)\n"
            "  --layers N       keep the preset's shapes but only N decoder layers (quick tests)\n");
}

int cmd_mkmodel(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    const char *preset = NULL, *out = NULL, *tok = NULL;
    unsigned long long seed = 0;
    int threads = 0, fp16 = 0, layers = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "--seed") || !strcmp(a, "--threads") || !strcmp(a, "--tokenizer") ||
             !strcmp(a, "--layers")) &&
            i + 1 >= argc) {
            fprintf(stderr, "awqd mkmodel: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--seed")) {
            char *end;
            seed = strtoull(argv[++i], &end, 0);
            if (*end) { fprintf(stderr, "awqd mkmodel: bad --seed %s\n", argv[i]); return 2; }
        } else if (!strcmp(a, "--threads")) {
            threads = atoi(argv[++i]);
            if (threads < 1) { fprintf(stderr, "awqd mkmodel: bad --threads\n"); return 2; }
        } else if (!strcmp(a, "--tokenizer")) {
            tok = argv[++i];
        } else if (!strcmp(a, "--layers")) {
            layers = atoi(argv[++i]);
            if (layers < 1 || layers > 4096) {
                fprintf(stderr, "awqd mkmodel: bad --layers\n");
                return 2;
            }
        } else if (!strcmp(a, "--fp16")) {
            fp16 = 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "awqd mkmodel: unknown option %s\n", a);
            return 2;
        } else if (!preset) {
            preset = a;
        } else if (!out) {
            out = a;
        } else {
            fprintf(stderr, "awqd mkmodel: unexpected argument %s\n", a);
            return 2;
        }
    }
    if (!preset || !out) {
        usage(stderr);
        return 2;
    }
    struct mkmodel_spec s;
    if (mkmodel_preset(preset, &s)) {
        fprintf(stderr, "awqd mkmodel: unknown preset \"%s\"; presets:", preset);
        for (const char *const *p = mkmodel_preset_names(); *p; p++) fprintf(stderr, " %s", *p);
        fprintf(stderr, "\n");
        return 2;
    }
    s.unquantized = fp16;
    if (layers) s.n_layers = layers;
    char tdir[4096], err[1024];
    if (mkmodel_find_tokenizer(&s, tok, tdir, sizeof tdir, err, sizeof err)) {
        fprintf(stderr, "awqd mkmodel: %s\n", err);
        return 1;
    }
    double t0 = util_now_s();
    if (mkmodel_write(&s, out, seed, threads, tdir, err, sizeof err)) {
        fprintf(stderr, "awqd mkmodel: %s\n", err);
        return 1;
    }
    fprintf(stderr, "awqd mkmodel: wrote %s (%s, seed %llu) to %s in %.1f s\n", preset,
            fp16 ? "fp16" : "AWQ int4", seed, out, util_now_s() - t0);
    return 0;
}
