/* test_cli.c — the awqd binary's command line: help, version, subcommands,
 * bad config. */
#include "tests/harness/test.h"

#include <stdlib.h>

static int awqd(const char *args, char **out) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", test_awqd_bin(), args);
    return test_run(cmd, out);
}

TEST(cli, help_lists_subcommands) {
    char *out;
    ASSERT_EQ_INT(awqd("--help", &out), 0);
    const char *subs[] = {"serve", "generate", "inspect", "tokenize", "mkmodel", "quantize", "bench"};
    for (int i = 0; i < 7; i++) ASSERT_CONTAINS(out, subs[i]);
    free(out);
}

TEST(cli, version) {
    char *out;
    ASSERT_EQ_INT(awqd("--version", &out), 0);
    ASSERT_CONTAINS(out, "awqd 0.");
    free(out);
}

TEST(cli, every_subcommand_has_help) {
    const char *subs[] = {"serve", "generate", "inspect", "tokenize", "detokenize", "mkmodel",
                          "quantize", "bench"};
    for (int i = 0; i < 8; i++) {
        char args[64], *out;
        snprintf(args, sizeof args, "%s --help", subs[i]);
        ASSERT_MSG(awqd(args, &out) == 0, "%s --help failed", subs[i]);
        ASSERT_CONTAINS(out, "usage: awqd");
        free(out);
    }
}

TEST(cli, unknown_subcommand_exits_2) {
    char *out;
    ASSERT_EQ_INT(awqd("frobnicate", &out), 2);
    ASSERT_CONTAINS(out, "unknown subcommand");
    free(out);
    ASSERT_EQ_INT(awqd("", &out), 2);
    free(out);
}

TEST(cli, serve_bad_config_names_field) {
    char path[512], args[600], *out;
    snprintf(path, sizeof path, "%s/bad.json", test_tmpdir());
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fputs("{\"max_num_seqs\": -3}", f);
    fclose(f);
    snprintf(args, sizeof args, "serve --config %s", path);
    int rc = awqd(args, &out);
    ASSERT(rc != 0);
    ASSERT_CONTAINS(out, "max_num_seqs");
    ASSERT_CONTAINS(out, "bad.json");
    free(out);
    ASSERT(awqd("serve --config /nonexistent/awqd.json", &out) != 0);
    ASSERT_CONTAINS(out, "/nonexistent/awqd.json");
    free(out);
}
