/* The fxattn subcommands; each takes the whole argv (argv[1] is its name)
 * and returns the process exit code. */
#ifndef FXT_COMMANDS_H
#define FXT_COMMANDS_H

int fxt_cmd_attn(int argc, char **argv);
int fxt_cmd_check(int argc, char **argv);
int fxt_cmd_demo(int argc, char **argv);
int fxt_cmd_bench(int argc, char **argv);
int fxt_cmd_info(int argc, char **argv);
int fxt_cmd_layer(int argc, char **argv);
int fxt_cmd_plan(int argc, char **argv);
int fxt_cmd_compare(int argc, char **argv);

#endif
