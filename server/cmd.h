/* cmd.h — the subcommands of the awqd binary. Each is `int cmd_X(argc, argv)`
 * with argv[0] the subcommand's name; it returns the process exit status
 * (0 ok, 1 failure, 2 usage error or not built) and handles its own --help.
 * main.c owns only the table below them. */
#ifndef AWQD_CMD_H
#define AWQD_CMD_H

int cmd_serve(int argc, char **argv);      /* server/cmd_serve.c */
int cmd_generate(int argc, char **argv);   /* engine/cmd_generate.c */
int cmd_inspect(int argc, char **argv);    /* engine/cmd_inspect.c */
int cmd_tokenize(int argc, char **argv);   /* engine/cmd_tokenize.c */
int cmd_detokenize(int argc, char **argv); /* engine/cmd_tokenize.c */
int cmd_mkmodel(int argc, char **argv);    /* engine/cmd_mkmodel.c */
int cmd_quantize(int argc, char **argv);   /* engine/cmd_quantize.c */
int cmd_bench(int argc, char **argv);      /* engine/cmd_bench.c */

/* True when argv (after argv[0]) asks for help. */
int cmd_wants_help(int argc, char **argv);

/* The standard answer of a subcommand that a later piece of work fills in:
 * prints "awqd NAME: not built yet (WHAT)" and returns 2. */
int cmd_not_built(const char *name, const char *what);

#endif
