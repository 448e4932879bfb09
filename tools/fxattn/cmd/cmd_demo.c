/*
 * `fxattn demo`: the main job on built-in data shaped like one Wan2.2
 * self-attention layer (40 heads x 128, q/k from an RMSNorm across all heads
 * with a non-unit gain and 3-D RoPE). Runs fixed-max (auto) and online
 * softmax and compares both with the fp64 reference on sampled rows.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "cmd_opts.h"
#include "commands.h"
#include "fxattn_npy.h"
#include "runner.h"
#include "verify.h"
#include "workload.h"
#include "stats.h"

#define DEMO_REF_ROWS 24 /* fp64 reference rows per head */

typedef struct demo_row {
    const char *name;
    fxa_attn_stats st;
    fxt_verify_result err;
} demo_row;

static int run_mode(const fxt_workload *w, fxa_mode mode, int threads, float *out, float *lse,
                    demo_row *row)
{
    fxt_runner r;
    fxa_attn_desc d = w->d;
    d.mode = mode;
    int code = fxt_runner_init(&r, threads, &d);
    if (code)
        return code;
    fxa_attn_args a = {
        .struct_size = sizeof a, .q = w->q, .k = w->k, .v = w->v, .out = out, .lse = lse};
    row->st.struct_size = sizeof row->st;
    code = fxt_runner_run(&r, &a, &row->st, 0);
    fxt_runner_free(&r);
    if (!code)
        fxt_verify(&d, w->q32, w->k32, w->v32, out, lse, DEMO_REF_ROWS, &row->err);
    return code;
}

/* DIR/{q,k,v}.npy, the files --save-inputs writes, into paths[3][cap]. */
static void saved_paths(const char *dir, char paths[3][4096])
{
    const char *names[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++)
        snprintf(paths[i], sizeof paths[i], "%s/%s.npy", dir, names[i]);
}

/* Before any work: DIR/{q,k,v}.npy can be written. */
static int check_save_dir(const char *dir)
{
    char paths[3][4096];
    struct stat sb;
    if (strlen(dir) + sizeof "/q.npy" > sizeof paths[0])
        return fxt_fail(FXT_EXIT_BAD_INPUT, "demo --save-inputs: the folder's path is too long");
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return fxt_fail(FXT_EXIT_BAD_INPUT, "demo --save-inputs: %s is not an existing folder",
                        dir);
    saved_paths(dir, paths);
    const fxt_path outs[3] = {
        {"--save-inputs", paths[0]}, {"--save-inputs", paths[1]}, {"--save-inputs", paths[2]}};
    return fxt_check_outputs("demo", outs, 3, NULL, 0);
}

/* Write the synthetic q, k, v as DIR/{q,k,v}.npy ([1, S, H, D], <f4) so that
 * `fxattn attn` and `fxattn check` can be tried on them. */
static int save_inputs(const char *dir, const fxt_workload *w)
{
    const int64_t shape[4] = {1, w->d.seq_q, w->d.heads_q, w->d.head_dim};
    char paths[3][4096];
    saved_paths(dir, paths);
    const fxt_npy_out outs[3] = {
        {paths[0], 4, shape, w->q32}, {paths[1], 4, shape, w->k32}, {paths[2], 4, shape, w->v32}};
    return fxt_write_npy_outputs(outs, 3);
}

int fxt_cmd_demo(int argc, char **argv)
{
    fxt_wan_synth p;
    demo_opts o;
    fxt_wan_synth_defaults(&p);
    int code = fxt_demo_opts_parse(argc, argv, &o);
    if (code)
        return code;
    if (o.dim % 2)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--dim must be even (RoPE rotates pairs)");
    if (o.save_dir && (code = check_save_dir(o.save_dir)))
        return code;
    const int64_t frames = o.frames, height = o.height, width = o.width, heads = o.heads;
    const int64_t dim = o.dim, threads = o.threads;
    const int json = o.json;
    p.frames = (int)frames;
    p.height = (int)height;
    p.width = (int)width;
    p.heads = (int)heads;
    p.head_dim = (int)dim;
    p.seed = (uint64_t)o.seed;
    fxt_workload w;
    /* fp32 q, k, v, the output and the LSE. */
    const double n_tok = (double)frames * (double)height * (double)width;
    if ((code = fxt_check_memory(n_tok * (double)heads * (16.0 * (double)dim + 4.0), 1,
                                 "demo: q, k, v and the output")))
        return code;
    const double t0 = fxt_now();
    if ((code = fxt_workload_make(&p, FXA_F32, &w)))
        return code;
    const double t_synth = fxt_now() - t0;
    if (o.save_dir && (code = save_inputs(o.save_dir, &w))) {
        fxt_workload_free(&w);
        return code;
    }
    const int64_t s = w.d.seq_q;
    float *out = malloc((size_t)(s * heads * dim) * sizeof(float));
    float *lse = malloc((size_t)(s * heads) * sizeof(float));
    demo_row rows[2] = {{.name = "fixed-max (auto)"}, {.name = "online softmax"}};
    if (!out || !lse) {
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory");
        goto out;
    }
    if (!json)
        printf("fxattn demo: Wan2.2-like self-attention, grid %lldx%lldx%lld (S=%lld), %lld "
               "heads x %lld\n  q, k: RMSNorm across all heads with per-channel gain, then 3-D "
               "RoPE; synthesised in %.2f s\n",
               (long long)frames, (long long)height, (long long)width, (long long)s,
               (long long)heads, (long long)dim, t_synth);
    if ((code = run_mode(&w, FXA_MODE_AUTO, (int)threads, out, lse, &rows[0])) ||
        (code = run_mode(&w, FXA_MODE_ONLINE, (int)threads, out, lse, &rows[1])))
        goto out;
    const double gflop = fxa_attn_flops(&w.d) * 1e-9;
    if (json) {
        for (int i = 0; i < 2; i++)
            fxt_json_printf(
                "{\"mode\": \"%s\", \"seq\": %lld, \"heads\": %lld, \"dim\": %lld, "
                "\"seconds\": %.4f, \"gflops\": %.3f, \"max_abs_err\": %.4g, "
                "\"max_rel_err\": %.4g, \"max_lse_err\": %.4g, \"ref_rows\": %lld, "
                "\"fallback_rows\": %lld, \"rows\": %lld, \"C\": %d, \"max_bound\": %.0f}\n",
                i ? "online" : "auto", (long long)s, (long long)heads, (long long)dim,
                rows[i].st.seconds, gflop / rows[i].st.seconds, rows[i].err.max_abs_err,
                rows[i].err.max_rel_err, rows[i].err.max_lse_err, (long long)rows[i].err.rows,
                (long long)rows[i].st.fallback_rows, (long long)rows[i].st.rows, rows[i].st.c_min,
                rows[i].st.max_bound);
        goto out;
    }
    printf("\n%-18s %9s %9s %13s %13s %11s %15s\n", "mode", "time (s)", "GFLOP/s", "max |err|",
           "err / max|v|", "lse err", "fallback rows");
    for (int i = 0; i < 2; i++)
        printf("%-18s %9.3f %9.2f %13.3g %13.3g %11.3g %7lld/%lld\n", rows[i].name,
               rows[i].st.seconds, gflop / rows[i].st.seconds, rows[i].err.max_abs_err,
               rows[i].err.max_rel_err, rows[i].err.max_lse_err,
               (long long)rows[i].st.fallback_rows, (long long)rows[i].st.rows);
    printf("%-18s %9s %9s %13s (reference: %lld sampled rows, %d per head)\n", "fp64 exact max",
           "-", "-", "0", (long long)rows[0].err.rows, DEMO_REF_ROWS);
    printf("\nbound: C = %d (Vmax %.3g), strict gate %d, centred gate %d, largest ceil(U) %.0f\n",
           rows[0].st.c_min, rows[0].st.vmax, rows[0].st.gate_strict, rows[0].st.gate_centered,
           rows[0].st.max_bound);
    printf("fixed-max / online speed: %.3fx (one run each; `fxattn bench` takes medians)\n",
           rows[1].st.seconds / rows[0].st.seconds);
out:
    free(out);
    free(lse);
    fxt_workload_free(&w);
    return code;
}
