/* Defaults and option tables of the fxattn subcommands (cmd_opts.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_opts.h"
#include "plan.h"

/* Copy src (n entries, the last one zeroed) into t and zero the rest of t. */
static void fill(fxt_opt t[FXT_MAX_OPTS], const fxt_opt *src, size_t n)
{
    memset(t, 0, FXT_MAX_OPTS * sizeof t[0]);
    memcpy(t, src, n * sizeof src[0]);
}

#define FILL(t, src)                                                                               \
    do {                                                                                           \
        _Static_assert(sizeof(src) / sizeof((src)[0]) <= FXT_MAX_OPTS, "raise FXT_MAX_OPTS");      \
        fill(t, src, sizeof(src) / sizeof((src)[0]));                                              \
    } while (0)

int fxt_cp_opts_distributed(const fxt_cp_opts *o)
{
    return o->ulysses > 0 || o->ring > 0 || o->prefetch > 0 || o->timeout != 0.0 || o->grid ||
           getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

int fxt_qkv_opts_layout(const fxt_qkv_opts *o, int need_v, const char *usage, fxa_layout *layout)
{
    if (!o->q || !o->k || (need_v && !o->v))
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s", usage);
    return fxt_parse_layout(o->layout, layout) ? FXT_EXIT_BAD_INPUT : 0;
}

void fxt_attn_opts_defaults(attn_opts *o)
{
    *o = (attn_opts){.in = FXT_QKV_OPTS_DEFAULTS, .repeats = 1};
}

void fxt_attn_opts_table(attn_opts *o, fxt_opt t[FXT_MAX_OPTS])
{
    const fxt_opt src[] = {
        FXT_QKV_OPTS_ROWS(o->in),
        {"-o", "--out", FXT_OPT_STRING, &o->out, 0, 0},
        {"--lse", NULL, FXT_OPT_STRING, &o->lse, 0, 0},
        {"--mode", NULL, FXT_OPT_STRING, &o->mode, 0, 0},
        {"--center", NULL, FXT_OPT_STRING, &o->center, 0, 0},
        {"--compute", NULL, FXT_OPT_STRING, &o->compute, 0, 0},
        {"--heads-per-tile", NULL, FXT_OPT_INT, &o->heads_per_tile, 0, 1 << 20},
        {"--block-q", NULL, FXT_OPT_INT, &o->block_q, 0, 4096},
        {"--repeats", NULL, FXT_OPT_INT, &o->repeats, 1, FXT_MAX_REPEATS},
        {"--stats", NULL, FXT_OPT_FLAG, &o->stats, 0, 0},
        {"--verify", NULL, FXT_OPT_FLAG, &o->verify, 0, 0},
        {"--reproducible", NULL, FXT_OPT_FLAG, &o->reproducible, 0, 0},
        FXT_CP_OPTS_ROWS(o->cp),
        {"--placement", NULL, FXT_OPT_STRING, &o->placement, 0, 0},
        {"--inputs-on", NULL, FXT_OPT_STRING, &o->inputs_on, 0, 0},
        {0},
    };
    FILL(t, src);
}

void fxt_check_opts_defaults(check_opts *o)
{
    *o = (check_opts){.in = FXT_QKV_OPTS_DEFAULTS};
}

void fxt_check_opts_table(check_opts *o, fxt_opt t[FXT_MAX_OPTS])
{
    const fxt_opt src[] = {
        FXT_QKV_OPTS_ROWS(o->in),
        {"--json", NULL, FXT_OPT_FLAG, &o->json, 0, 0},
        {0},
    };
    FILL(t, src);
}

void fxt_bench_args_defaults(bench_args *o)
{
    *o = (bench_args){.seq = 4096, .heads = 40, .dim = 128, .repeats = 3, .dtype_s = "f32"};
}

void fxt_bench_args_table(bench_args *o, fxt_opt t[FXT_MAX_OPTS])
{
    const fxt_opt src[] = {
        {"--seq", NULL, FXT_OPT_INT, &o->seq, 1, 1 << 24},
        {"--seq-kv", NULL, FXT_OPT_INT, &o->seq_kv, 1, 1 << 24},
        {"--heads", NULL, FXT_OPT_INT, &o->heads, 1, 1024},
        {"--dim", NULL, FXT_OPT_INT, &o->dim, 6, FXA_MAX_HEAD_DIM},
        {"--dtype", NULL, FXT_OPT_STRING, &o->dtype_s, 0, 0},
        {"--compute", NULL, FXT_OPT_STRING, &o->compute_s, 0, 0},
        {"--threads", NULL, FXT_OPT_INT, &o->threads, 0, 1024},
        {"--repeats", NULL, FXT_OPT_INT, &o->repeats, 1, FXT_MAX_REPEATS},
        {"--json", NULL, FXT_OPT_FLAG, &o->json, 0, 0},
        {"--proj", NULL, FXT_OPT_FLAG, &o->proj, 0, 0},
        {"--backward", NULL, FXT_OPT_FLAG, &o->backward, 0, 0},
        {"--causal", NULL, FXT_OPT_FLAG, &o->causal, 0, 0},
        FXT_CP_OPTS_ROWS(o->cp),
        {0},
    };
    FILL(t, src);
}

void fxt_demo_opts_defaults(demo_opts *o)
{
    *o = (demo_opts){.frames = 4, .height = 32, .width = 32, .heads = 40, .dim = 128, .seed = 1};
}

void fxt_demo_opts_table(demo_opts *o, fxt_opt t[FXT_MAX_OPTS])
{
    const fxt_opt src[] = {
        {"--frames", NULL, FXT_OPT_INT, &o->frames, 1, 1024},
        {"--height", NULL, FXT_OPT_INT, &o->height, 1, 1024},
        {"--width", NULL, FXT_OPT_INT, &o->width, 1, 1024},
        {"--heads", NULL, FXT_OPT_INT, &o->heads, 1, 1024},
        {"--dim", NULL, FXT_OPT_INT, &o->dim, 6, FXA_MAX_HEAD_DIM},
        {"--seed", NULL, FXT_OPT_INT, &o->seed, 0, INT64_MAX},
        {"--threads", NULL, FXT_OPT_INT, &o->threads, 0, 1024},
        {"--json", NULL, FXT_OPT_FLAG, &o->json, 0, 0},
        {"--save-inputs", NULL, FXT_OPT_STRING, &o->save_dir, 0, 0},
        {0},
    };
    FILL(t, src);
}

void fxt_layer_opts_defaults(layer_opts *o)
{
    *o = (layer_opts){.rope_layout = "interleaved", .dtype = "f32", .heads = 40, .seed = 1};
}

void fxt_layer_opts_table(layer_opts *o, fxt_opt t[FXT_MAX_OPTS])
{
    const fxt_opt src[] = {
        {"-x", "--x", FXT_OPT_STRING, &o->x, 0, 0},
        {"-o", "--out", FXT_OPT_STRING, &o->out, 0, 0},
        {"--weights", NULL, FXT_OPT_STRING, &o->weights, 0, 0},
        {"--block", NULL, FXT_OPT_INT, &o->block, 0, 1 << 20},
        {"--grid", NULL, FXT_OPT_STRING, &o->grid, 0, 0},
        {"--rope-layout", NULL, FXT_OPT_STRING, &o->rope_layout, 0, 0},
        {"--dtype", NULL, FXT_OPT_STRING, &o->dtype, 0, 0},
        {"--cp-grid", NULL, FXT_OPT_STRING, &o->cp_grid, 0, 0},
        {"--heads", NULL, FXT_OPT_INT, &o->heads, 1, 1024},
        {"--dim", NULL, FXT_OPT_INT, &o->dim, 6, FXA_MAX_HEAD_DIM},
        {"--seed", NULL, FXT_OPT_INT, &o->seed, 0, INT64_MAX},
        {"--threads", NULL, FXT_OPT_INT, &o->threads, 0, 1024},
        {"--fp8", NULL, FXT_OPT_FLAG, &o->fp8, 0, 0},
        {"--stats", NULL, FXT_OPT_FLAG, &o->stats, 0, 0},
        {"--verify", NULL, FXT_OPT_FLAG, &o->verify, 0, 0},
        {"--ulysses", NULL, FXT_OPT_INT, &o->ulysses, 1, 1 << 20},
        {"--ring", NULL, FXT_OPT_INT, &o->ring, 1, 1 << 20},
        {"--tp", NULL, FXT_OPT_INT, &o->tp, 1, 1 << 20},
        {"--timeout", NULL, FXT_OPT_DOUBLE, &o->timeout, 0, 0},
        {0},
    };
    FILL(t, src);
}

void fxt_plan_opts_defaults(plan_opts *o)
{
    *o = (plan_opts){.seq = 4096,
                     .heads = 40,
                     .dim = 128,
                     .dtype = "f32",
                     .link_gbps = NAN,
                     .latency_us = NAN,
                     .intra_gbps = NAN,
                     .intra_latency_us = NAN,
                     .link_cpu_us_per_mb = NAN,
                     .intra_cpu_us_per_mb = NAN,
                     .gflops = NAN,
                     .ulysses_groups = FXT_PLAN_ULYSSES_GROUPS};
}

void fxt_plan_opts_table(plan_opts *o, fxt_opt t[FXT_MAX_OPTS])
{
    const fxt_opt src[] = {
        {"--seq", NULL, FXT_OPT_INT, &o->seq, 1, 1 << 24},
        {"--heads", NULL, FXT_OPT_INT, &o->heads, 1, 1024},
        {"--dim", NULL, FXT_OPT_INT, &o->dim, 6, FXA_MAX_HEAD_DIM},
        {"--dtype", NULL, FXT_OPT_STRING, &o->dtype, 0, 0},
        {"--ranks", NULL, FXT_OPT_INT, &o->ranks, 1, 4096},
        {"--hosts", NULL, FXT_OPT_INT, &o->hosts, 1, 4096},
        {"--link-gbps", NULL, FXT_OPT_DOUBLE, &o->link_gbps, 0, 0},
        {"--latency-us", NULL, FXT_OPT_DOUBLE, &o->latency_us, 0, 0},
        {"--intra-gbps", NULL, FXT_OPT_DOUBLE, &o->intra_gbps, 0, 0},
        {"--intra-latency-us", NULL, FXT_OPT_DOUBLE, &o->intra_latency_us, 0, 0},
        {"--link-cpu-us-per-mb", NULL, FXT_OPT_DOUBLE, &o->link_cpu_us_per_mb, 0, 0},
        {"--intra-cpu-us-per-mb", NULL, FXT_OPT_DOUBLE, &o->intra_cpu_us_per_mb, 0, 0},
        {"--gflops", NULL, FXT_OPT_DOUBLE, &o->gflops, 0, 0},
        {"--ulysses-groups", NULL, FXT_OPT_INT, &o->ulysses_groups, 1, 64},
        {"--threads", NULL, FXT_OPT_INT, &o->threads, 0, 1024},
        {"--json", NULL, FXT_OPT_FLAG, &o->json, 0, 0},
        {"--measure", NULL, FXT_OPT_FLAG, &o->measure, 0, 0},
        {0},
    };
    FILL(t, src);
}

void fxt_info_opts_defaults(info_opts *o)
{
    *o = (info_opts){.threads = 0};
}

void fxt_info_opts_table(info_opts *o, fxt_opt t[FXT_MAX_OPTS])
{
    const fxt_opt src[] = {
        {"--threads", NULL, FXT_OPT_INT, &o->threads, 0, 1024},
        {0},
    };
    FILL(t, src);
}

/* fxt_<type>_parse: the defaults of command cmd, then its arguments through its table. */
#define PARSE(type, cmd)                                                                           \
    int fxt_##type##_parse(int argc, char **argv, type *o)                                         \
    {                                                                                              \
        fxt_opt t[FXT_MAX_OPTS];                                                                   \
        fxt_##type##_defaults(o);                                                                  \
        fxt_##type##_table(o, t);                                                                  \
        return fxt_parse_options(cmd, argc, argv, 2, t);                                           \
    }

PARSE(attn_opts, "attn")
PARSE(check_opts, "check")
PARSE(bench_args, "bench")
PARSE(demo_opts, "demo")
PARSE(layer_opts, "layer")
PARSE(plan_opts, "plan")
PARSE(info_opts, "info")
