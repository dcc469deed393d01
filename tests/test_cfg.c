/* test_cfg.c — settings: defaults, JSON file, flags, errors naming the field. */
#include "config/cfg.h"
#include "tests/harness/test.h"

#include <stdlib.h>

static int load(struct cfg *c, const char *json, char *err, size_t n) {
    cfg_defaults(c);
    return cfg_load_json(c, json, "test.json", err, n);
}

TEST(cfg, defaults) {
    struct cfg c;
    cfg_defaults(&c);
    ASSERT_STR_EQ(c.host, "127.0.0.1");
    ASSERT_EQ_INT(c.port, 8000);
    ASSERT_EQ_INT(c.tp, 1);
    ASSERT_EQ_INT(c.kv_block_size, 16);
    ASSERT_EQ_INT(c.max_body_bytes, 8 << 20);
    char err[256];
    ASSERT_EQ_INT(cfg_validate(&c, err, sizeof err), 0);
}

TEST(cfg, json_sets_every_kind) {
    struct cfg c;
    char err[256] = "";
    int rc = load(&c, "{\"model\":\"/m\",\"port\":9000,\"backend\":\"cpu\",\"tp\":2,"
                      "\"devices\":[3,1],\"gpu_memory_fraction\":0.5,\"log_level\":\"debug\","
                      "\"max_body_bytes\":2048}", err, sizeof err);
    ASSERT_MSG(rc == 0, "load: %s", err);
    ASSERT_STR_EQ(c.model, "/m");
    ASSERT_EQ_INT(c.port, 9000);
    ASSERT_EQ_INT(c.backend, CFG_BACKEND_CPU);
    ASSERT_EQ_INT(c.n_devices, 2);
    ASSERT_EQ_INT(c.devices[0], 3);
    ASSERT_EQ_INT(c.devices[1], 1);
    ASSERT_NEAR(c.gpu_memory_fraction, 0.5, 0);
    ASSERT_EQ_INT(c.max_body_bytes, 2048);
    ASSERT_EQ_INT(cfg_validate(&c, err, sizeof err), 0);
}

/* Each bad document must fail with a message naming the field at fault. */
TEST(cfg, bad_values_name_the_field) {
    static const struct { const char *json, *needle; } cases[] = {
        {"{\"port\":70000}", "port = 70000 is out of range: allowed 1 to 65535"},
        {"{\"port\":0}", "port"},
        {"{\"port\":8000.5}", "port must be an integer"},
        {"{\"port\":\"8000\"}", "port must be an integer"},
        {"{\"tp\":0}", "tp"},
        {"{\"backend\":\"gpu\"}", "backend = \"gpu\" is not one of"},
        {"{\"gpu_memory_fraction\":1.5}", "gpu_memory_fraction"},
        {"{\"gpu_memory_fraction\":\"x\"}", "gpu_memory_fraction must be a number"},
        {"{\"log_level\":\"loud\"}", "log_level"},
        {"{\"devices\":[0,0]}", "listed twice"},
        {"{\"devices\":[-1]}", "devices"},
        {"{\"devices\":\"a,b\"}", "devices"},
        {"{\"colour\":1}", "unknown key \"colour\""},
        {"{\"max-model-len\":1}", "unknown key"},
        {"{\"host\":5}", "host must be a string"},
        {"[1,2]", "must be a JSON object"},
        {"{\"port\":", "not valid JSON"},
        {"", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct cfg c;
        char err[256] = "";
        int rc = load(&c, cases[i].json, err, sizeof err);
        ASSERT_MSG(rc != 0, "accepted %s", cases[i].json);
        ASSERT_CONTAINS(err, cases[i].needle);
        ASSERT_CONTAINS(err, "test.json");
    }
}

TEST(cfg, flags_override_file) {
    const char *dir = test_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/c.json", dir);
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fputs("{\"port\": 9001, \"host\": \"0.0.0.0\"}", f);
    fclose(f);
    char *argv[] = {"--port", "9002", "--config", path, "--max-model-len=4096", "extra"};
    char *rest[8];
    int n_rest = 0;
    struct cfg c;
    char err[256] = "";
    cfg_defaults(&c);
    int rc = cfg_parse_args(&c, 6, argv, rest, &n_rest, err, sizeof err);
    ASSERT_MSG(rc == 0, "%s", err);
    ASSERT_EQ_INT(c.port, 9002);           /* flag beats file, wherever --config stands */
    ASSERT_STR_EQ(c.host, "0.0.0.0");      /* file beats default */
    ASSERT_EQ_INT(c.max_model_len, 4096);
    ASSERT_EQ_INT(n_rest, 1);
    ASSERT_STR_EQ(rest[0], "extra");
    char *bad[] = {"--port", "http"};
    cfg_defaults(&c);
    ASSERT(cfg_parse_args(&c, 2, bad, NULL, NULL, err, sizeof err) != 0);
    ASSERT_CONTAINS(err, "--port");
    char *missing[] = {"--port"};
    ASSERT(cfg_parse_args(&c, 1, missing, NULL, NULL, err, sizeof err) != 0);
    ASSERT_CONTAINS(err, "needs a value");
}

TEST(cfg, validate_cross_fields) {
    struct cfg c;
    char err[256];
    ASSERT_EQ_INT(load(&c, "{\"tp\":2,\"devices\":[0]}", err, sizeof err), 0);
    ASSERT(cfg_validate(&c, err, sizeof err) != 0);
    ASSERT_CONTAINS(err, "tp is 2");
    ASSERT_EQ_INT(load(&c, "{\"api_key\":\"k\",\"api_key_file\":\"/f\"}", err, sizeof err), 0);
    ASSERT(cfg_validate(&c, err, sizeof err) != 0);
    ASSERT_CONTAINS(err, "exclusive");
}

/* The committed example must be exactly what the table prints, and load back. */
TEST(cfg, example_file_is_current) {
    char *out = NULL;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s serve --print-config | diff - config/awqd.example.json", test_awqd_bin());
    int rc = test_run(cmd, &out);
    ASSERT_MSG(rc == 0, "config/awqd.example.json is stale:\n%s", out);
    free(out);
    struct cfg c;
    char err[256];
    cfg_defaults(&c);
    ASSERT_MSG(cfg_load_file(&c, "config/awqd.example.json", err, sizeof err) == 0, "%s", err);
}
