/* fxattn: the command line (README.md, "Command line"). Uses the public API only. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "commands.h"

static const char g_usage[] =
    "usage: fxattn <command> [options]\n"
    "\n"
    "commands:\n"
    "  attn   -q Q.npy -k K.npy -v V.npy -o OUT.npy [--layout bshd|bhsd] [--scale F]\n"
    "         [--mode auto|online] [--center on|off] [--dtype f32|bf16|f16] [--lse FILE.npy]\n"
    "         [--compute fp32|bf16] [--threads N] [--stats] [--verify] [--repeats R]\n"
    "         [--heads-per-tile N] [--block-q N] [--reproducible]\n"
    "         under mpirun: [--ulysses U] [--ring R] [--prefetch P] [--timeout SECONDS]\n"
    "  check  -q Q.npy -k K.npy [-v V.npy] [--layout ...] [--scale F] [--dtype ...] [--json]\n"
    "         [--threads N]   does the fixed-max bound suit these q/k norms?\n"
    "  demo   [--frames F --height H --width W] [--heads N] [--dim D] [--threads N]\n"
    "         [--seed S] [--json] [--save-inputs DIR]   Wan2.2-like synthetic layer:\n"
    "         fixed-max vs online vs fp64 (DIR gets q.npy, k.npy, v.npy)\n"
    "  bench  [--seq S] [--heads H] [--dim D] [--dtype ...] [--compute ...] [--threads N]\n"
    "         [--repeats R] [--json] [--proj] [--backward] [--causal]   GFLOP/s, share of\n"
    "         measured peak, fixed-max vs online (--proj: the QKV projection; --backward:\n"
    "         attention's backward beside its forward; --causal: causal beside unmasked,\n"
    "         with --backward the backward's);\n"
    "         under mpirun also the grid options\n"
    "  layer  [--weights CKPT --block N] [-x X.npy --grid F,H,W] [-o Y.npy]\n"
    "         [--heads N] [--dim D] [--rope-layout interleaved|half] [--dtype f32|bf16]\n"
    "         [--fp8] [--seed S] [--threads N] [--stats] [--verify] [--tp T] [--ulysses U]\n"
    "         [--ring R] [--cp-grid auto] [--timeout SECONDS]   Wan2.2 self-attention\n"
    "         layer: QKV projection, RMSNorm, RoPE, attention, output projection\n"
    "         (synthetic weights and x without files); CKPT: a .safetensors file, a\n"
    "         sharded *.safetensors.index.json or its folder, Wan2.2's or diffusers'\n"
    "         tensor names\n"
    "  plan   --ranks P [--hosts N] [--seq S] [--heads H] [--dim D] [--dtype ...]\n"
    "         [--link-gbps B] [--latency-us L] [--intra-gbps B] [--intra-latency-us L]\n"
    "         [--link-cpu-us-per-mb C] [--intra-cpu-us-per-mb C]\n"
    "         [--gflops G] [--ulysses-groups G] [--threads N] [--json]   predicted step\n"
    "         time of every Ulysses x ring grid and of all-gather + local attention, and\n"
    "         the best grid; under mpirun --measure measures the links and compute rate\n"
    "         (attn and bench: --grid auto runs the planner's choice)\n"
    "  info   [--threads N]   the kernels this CPU runs (FXA_ISA=ref|avx2|avx512|amx\n"
    "         forces a set)\n"
    "  compare A.npy B.npy   the same bytes? (exit 0), or where they differ (exit 1)\n"
    "  help   this text (--version: the version)\n"
    "\n"
    "exit status: 0 success, 2 bad usage or bad input, 1 other failures\n";

/* The commands, by name. */
static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} g_commands[] = {
    {"attn", fxt_cmd_attn},   {"check", fxt_cmd_check},     {"demo", fxt_cmd_demo},
    {"bench", fxt_cmd_bench}, {"layer", fxt_cmd_layer},     {"plan", fxt_cmd_plan},
    {"info", fxt_cmd_info},   {"compare", fxt_cmd_compare},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(g_usage, stderr);
        return fxt_fail(FXT_EXIT_BAD_INPUT, "no command given");
    }
    const char *cmd = argv[1];
    for (size_t i = 0; i < sizeof g_commands / sizeof g_commands[0]; i++)
        if (strcmp(cmd, g_commands[i].name) == 0)
            return g_commands[i].run(argc, argv);
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        fputs(g_usage, stdout);
        return FXT_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("fxattn %s\n", fxa_version());
        return FXT_EXIT_OK;
    }
    return fxt_fail(FXT_EXIT_BAD_INPUT, "unknown command '%s' (see 'fxattn help')", cmd);
}
