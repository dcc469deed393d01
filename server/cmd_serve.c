/* cmd_serve.c — `awqd serve`: reads the settings (defaults < --config FILE <
 * flags), validates them, and runs the daemon (server/serve.c). */
#include "config/cfg.h"
#include "engine/util.h"
#include "server/cmd.h"
#include "server/serve.h"

#include <stdio.h>
#include <string.h>

int cmd_serve(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        printf("usage: awqd serve [--config FILE] [--model DIR] [--flag VALUE ...]\n\n");
        cfg_print_help(stdout);
        printf("\n  --print-config         print the resulting settings as JSON and exit\n");
        return 0;
    }
    struct cfg c;
    char err[512];
    cfg_defaults(&c);
    char *rest[64];
    int n_rest = 0;
    if (argc - 1 > 64) {
        fprintf(stderr, "awqd serve: too many arguments\n");
        return 2;
    }
    if (cfg_parse_args(&c, argc - 1, argv + 1, rest, &n_rest, err, sizeof err) != 0 ||
        cfg_validate(&c, err, sizeof err) != 0) {
        fprintf(stderr, "awqd serve: %s\n", err);
        return 2;
    }
    int print_config = 0;
    for (int i = 0; i < n_rest; i++) {
        if (strcmp(rest[i], "--print-config") == 0) {
            print_config = 1;
        } else {
            fprintf(stderr, "awqd serve: unknown option \"%s\" (see awqd serve --help)\n", rest[i]);
            return 2;
        }
    }
    if (print_config) {
        cfg_print_json(stdout, &c);
        return 0;
    }
    return serve_run(&c);
}
