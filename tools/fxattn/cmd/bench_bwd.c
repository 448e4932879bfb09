/*
 * `fxattn bench --backward`: the attention backward (fxa_attn_bwd_run) and
 * the forward (fxa_attn_run, auto mode) on the same Wan-like inputs, one
 * context, alternating after a warm-up so that both see the same machine
 * state; medians of --repeats runs. GFLOP/s count the forward's
 * 4 B H S^2 D and the backward's 10 B H S^2 D (fxa_attn_bwd_flops: 2.5x the
 * forward, as FlashAttention counts), each against the peak of the units
 * its products run on (fp32 FMA, or vdpbf16ps with bf16 compute), measured
 * in the same process.
 */
#include <stdio.h>
#include <stdlib.h>

#include "bench_bwd.h"
#include "cli.h"
#include "cmd_opts.h"
#include "peak.h"
#include "runner.h"
#include "stats.h"
#include "workload.h"

typedef struct bwd_bench {
    fxt_workload w;
    fxa_ctx *ctx;
    fxa_attn_plan *fwd;
    fxa_attn_bwd_plan *bwd;
    void *ws_fwd, *ws_bwd;
    float *out, *dout, *lse, *dq, *dk, *dv;
} bwd_bench;

static void *ws_alloc(size_t bytes)
{
    return aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
}

static int setup(bwd_bench *b, const bench_opts *o)
{
    const double n = (double)o->seq * (double)o->heads * (double)o->dim;
    int code = fxt_check_memory(n * 4.0 * 12.0, 1, "bench --backward: inputs and gradients");
    if (code || (code = fxt_workload_sequence(o->seq, o->heads, o->dim, o->dtype, &b->w)) ||
        (code = fxt_context(o->threads, &b->ctx)))
        return code;
    b->w.d.compute = o->compute;
    size_t ws_f = 0, ws_b = 0;
    if (fxa_attn_plan_create(b->ctx, &b->w.d, &b->fwd, &ws_f) != FXA_OK ||
        fxa_attn_bwd_plan_create(b->ctx, &b->w.d, &b->bwd, &ws_b) != FXA_OK)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s", fxa_ctx_last_error(b->ctx));
    const size_t elems = (size_t)n, rows = (size_t)(o->seq * o->heads);
    b->ws_fwd = ws_alloc(ws_f);
    b->ws_bwd = ws_alloc(ws_b);
    b->out = malloc(elems * sizeof(float));
    b->dout = malloc(elems * sizeof(float));
    b->lse = malloc(rows * sizeof(float));
    b->dq = malloc(elems * sizeof(float));
    b->dk = malloc(elems * sizeof(float));
    b->dv = malloc(elems * sizeof(float));
    if (!b->ws_fwd || !b->ws_bwd || !b->out || !b->dout || !b->lse || !b->dq || !b->dk || !b->dv)
        return fxt_fail(FXT_EXIT_FAILURE, "out of memory");
    for (size_t i = 0; i < elems; i++) /* a smooth, deterministic dL/dO */
        b->dout[i] = b->w.v32[(i * 7919) % elems];
    return 0;
}

/* One forward (seconds into *t) and one backward (into *t_bwd). */
static int run_pair(bwd_bench *b, double *t_fwd, double *t_bwd)
{
    const fxa_attn_args a = {.struct_size = sizeof a,
                             .q = b->w.q,
                             .k = b->w.k,
                             .v = b->w.v,
                             .out = b->out,
                             .lse = b->lse};
    double t0 = fxt_now();
    if (fxa_attn_run(b->fwd, &a, b->ws_fwd, NULL) != FXA_OK)
        return fxt_fail(FXT_EXIT_FAILURE, "%s", fxa_ctx_last_error(b->ctx));
    *t_fwd = fxt_now() - t0;
    const fxa_attn_bwd_args g = {.struct_size = sizeof g,
                                 .q = b->w.q,
                                 .k = b->w.k,
                                 .v = b->w.v,
                                 .out = b->out,
                                 .dout = b->dout,
                                 .lse = b->lse,
                                 .dq = b->dq,
                                 .dk = b->dk,
                                 .dv = b->dv};
    t0 = fxt_now();
    if (fxa_attn_bwd_run(b->bwd, &g, b->ws_bwd, NULL) != FXA_OK)
        return fxt_fail(FXT_EXIT_FAILURE, "%s", fxa_ctx_last_error(b->ctx));
    *t_bwd = fxt_now() - t0;
    return 0;
}

static void report(const bwd_bench *b, const bench_opts *o, double fwd, double bwd, double peak,
                   const char *peak_isa)
{
    const double gf_fwd = fxa_attn_flops(&b->w.d) * 1e-9 / fwd;
    const double gf_bwd = fxa_attn_bwd_flops(&b->w.d) * 1e-9 / bwd;
    const double share_f = peak > 0 ? gf_fwd / peak : 0.0, share_b = peak > 0 ? gf_bwd / peak : 0.0;
    const int threads = fxa_ctx_threads(b->ctx);
    const char *compute = o->compute == FXA_COMPUTE_BF16 ? "bf16" : "fp32";
    if (o->json) {
        fxt_json_printf("{\"seq\": %lld, \"heads\": %lld, \"dim\": %lld, \"compute\": \"%s\", "
                        "\"threads\": %d, "
                        "\"isa\": \"%s\", \"forward_seconds_median\": %.6f, "
                        "\"backward_seconds_median\": %.6f, \"forward_gflops\": %.3f, "
                        "\"backward_gflops\": %.3f, "
                        "\"peak_gflops\": %.3f, \"forward_fraction_of_peak\": %.4f, "
                        "\"backward_fraction_of_peak\": %.4f, \"backward_over_forward\": %.4f}\n",
                        (long long)o->seq, (long long)o->heads, (long long)o->dim, compute, threads,
                        fxa_ctx_isa(b->ctx), fwd, bwd, gf_fwd, gf_bwd, peak, share_f, share_b,
                        bwd / fwd);
        return;
    }
    printf("fxattn bench --backward: S=%lld heads=%lld D=%lld %s (compute %s), %d threads, "
           "kernels %s, median of %lld runs\n",
           (long long)o->seq, (long long)o->heads, (long long)o->dim, fxt_dtype_name(o->dtype),
           compute, threads, fxa_ctx_isa(b->ctx), (long long)o->repeats);
    printf("measured peak: %.1f GFLOP/s (%s)\n", peak, peak_isa);
    printf("forward   median %8.3f s  %8.2f GFLOP/s  %5.1f%% of peak  (4 B H S^2 D)\n", fwd, gf_fwd,
           100 * share_f);
    printf("backward  median %8.3f s  %8.2f GFLOP/s  %5.1f%% of peak  (10 B H S^2 D)\n", bwd,
           gf_bwd, 100 * share_b);
    printf("backward over forward: %.2fx the time\n", bwd / fwd);
}

int fxt_bench_bwd(const bench_opts *o)
{
    bwd_bench b = {0};
    double tf[FXT_MAX_REPEATS], tb[FXT_MAX_REPEATS], t_f = 0.0, t_b = 0.0;
    int code = setup(&b, o);
    for (int64_t rep = -1; !code && rep < o->repeats; rep++) { /* rep -1: warm-up */
        code = run_pair(&b, &t_f, &t_b);
        if (!code && rep >= 0) {
            tf[rep] = t_f;
            tb[rep] = t_b;
        }
    }
    if (!code) {
        const char *peak_isa = "";
        const double peak =
            fxt_peak_gflops(o->compute == FXA_COMPUTE_BF16 ? FXT_PEAK_BF16_DOT : FXT_PEAK_F32_FMA,
                            fxa_ctx_threads(b.ctx), &peak_isa);
        report(&b, o, fxt_median(tf, (size_t)o->repeats), fxt_median(tb, (size_t)o->repeats), peak,
               peak_isa);
    }
    fxa_attn_bwd_plan_destroy(b.bwd);
    fxa_attn_plan_destroy(b.fwd);
    fxa_ctx_destroy(b.ctx);
    free(b.ws_fwd);
    free(b.ws_bwd);
    free(b.out);
    free(b.dout);
    free(b.lse);
    free(b.dq);
    free(b.dk);
    free(b.dv);
    fxt_workload_free(&b.w);
    return code;
}
