/*
 * `fxattn bench --backward --causal`: the attention backward
 * (fxa_attn_bwd_run) unmasked and causal on the same Wan-like inputs in the
 * asked compute (fp32, or bf16 products), one context, each with its own
 * forward's output and lse (computed once before timing), alternating after
 * a warm-up so that both see the same machine state; medians of --repeats
 * runs and the causal speedup
 * (unmasked median over causal median; causal skips the key tiles past the
 * diagonal, about half the work at Sq = Skv, so 2 is the ideal).
 */
#include <stdio.h>
#include <stdlib.h>

#include "bench_bwd.h"
#include "cli.h"
#include "cmd_opts.h"
#include "runner.h"
#include "stats.h"
#include "workload.h"

#define N_WAYS 2 /* unmasked, causal */

typedef struct way {
    fxa_attn_bwd_plan *plan;
    void *ws;
    float *out, *lse;
} way;

static void *ws_alloc(size_t bytes)
{
    return aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
}

/* Way i's plan and workspace (in compute), and its forward's out and lse. */
static int setup_way(way *w, fxa_ctx *ctx, const fxt_workload *wl, fxa_compute compute, int causal,
                     size_t elems, size_t rows)
{
    fxa_attn_desc d = wl->d;
    d.compute = compute;
    d.causal = causal;
    fxa_attn_plan *fwd = NULL;
    size_t ws_f = 0, ws_b = 0;
    if (fxa_attn_plan_create(ctx, &d, &fwd, &ws_f) != FXA_OK ||
        fxa_attn_bwd_plan_create(ctx, &d, &w->plan, &ws_b) != FXA_OK) {
        fxa_attn_plan_destroy(fwd);
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s", fxa_ctx_last_error(ctx));
    }
    void *ws_fwd = ws_alloc(ws_f);
    w->ws = ws_alloc(ws_b);
    w->out = malloc(elems * sizeof(float));
    w->lse = malloc(rows * sizeof(float));
    int code = 0;
    if (!ws_fwd || !w->ws || !w->out || !w->lse) {
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory");
    } else {
        const fxa_attn_args a = {.struct_size = sizeof a,
                                 .q = wl->q,
                                 .k = wl->k,
                                 .v = wl->v,
                                 .out = w->out,
                                 .lse = w->lse};
        if (fxa_attn_run(fwd, &a, ws_fwd, NULL) != FXA_OK)
            code = fxt_fail(FXT_EXIT_FAILURE, "%s", fxa_ctx_last_error(ctx));
    }
    free(ws_fwd);
    fxa_attn_plan_destroy(fwd);
    return code;
}

int fxt_bench_bwd_causal(const bench_opts *o)
{
    const double n = (double)o->seq * (double)o->heads * (double)o->dim;
    const size_t elems = (size_t)n, rows = (size_t)(o->seq * o->heads);
    fxt_workload wl;
    fxa_ctx *ctx = NULL;
    way w[N_WAYS] = {{0}};
    float *dout = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    double seconds[N_WAYS][FXT_MAX_REPEATS];
    int code =
        fxt_check_memory(n * 4.0 * 14.0, 1, "bench --backward --causal: inputs and gradients");
    if (code || (code = fxt_workload_sequence(o->seq, o->heads, o->dim, o->dtype, &wl)))
        return code;
    if (!(code = fxt_context(o->threads, &ctx))) {
        dout = malloc(elems * sizeof(float));
        dq = malloc(elems * sizeof(float));
        dk = malloc(elems * sizeof(float));
        dv = malloc(elems * sizeof(float));
        if (!dout || !dq || !dk || !dv)
            code = fxt_fail(FXT_EXIT_FAILURE, "out of memory");
    }
    for (size_t i = 0; !code && i < elems; i++) /* a smooth, deterministic dL/dO */
        dout[i] = wl.v32[(i * 7919) % elems];
    for (int i = 0; i < N_WAYS && !code; i++)
        code = setup_way(&w[i], ctx, &wl, o->compute, i, elems, rows);
    for (int64_t rep = -1; !code && rep < o->repeats; rep++) { /* rep -1: warm-up */
        for (int i = 0; i < N_WAYS && !code; i++) {
            const fxa_attn_bwd_args g = {.struct_size = sizeof g,
                                         .q = wl.q,
                                         .k = wl.k,
                                         .v = wl.v,
                                         .out = w[i].out,
                                         .dout = dout,
                                         .lse = w[i].lse,
                                         .dq = dq,
                                         .dk = dk,
                                         .dv = dv};
            const double t0 = fxt_now();
            if (fxa_attn_bwd_run(w[i].plan, &g, w[i].ws, NULL) != FXA_OK)
                code = fxt_fail(FXT_EXIT_FAILURE, "%s", fxa_ctx_last_error(ctx));
            else if (rep >= 0)
                seconds[i][rep] = fxt_now() - t0;
        }
    }
    if (!code) {
        const char *compute = o->compute == FXA_COMPUTE_BF16 ? "bf16" : "fp32";
        const double unmasked = fxt_median(seconds[0], (size_t)o->repeats);
        const double causal = fxt_median(seconds[1], (size_t)o->repeats);
        if (o->json)
            fxt_json_printf("{\"seq\": %lld, \"heads\": %lld, \"dim\": %lld, \"compute\": "
                            "\"%s\", \"threads\": %d, \"isa\": \"%s\", "
                            "\"unmasked_backward_seconds_median\": %.6f, "
                            "\"causal_backward_seconds_median\": %.6f, "
                            "\"causal_backward_speedup\": %.4f}\n",
                            (long long)o->seq, (long long)o->heads, (long long)o->dim, compute,
                            fxa_ctx_threads(ctx), fxa_ctx_isa(ctx), unmasked, causal,
                            unmasked / causal);
        else
            printf("fxattn bench --backward --causal: S=%lld heads=%lld D=%lld %s (compute %s), "
                   "%d threads, kernels %s, median of %lld runs\nunmasked backward median %8.4f s\n"
                   "causal   backward median %8.4f s\ncausal backward speedup over unmasked: "
                   "%.3fx\n",
                   (long long)o->seq, (long long)o->heads, (long long)o->dim,
                   fxt_dtype_name(o->dtype), compute, fxa_ctx_threads(ctx), fxa_ctx_isa(ctx),
                   (long long)o->repeats, unmasked, causal, unmasked / causal);
    }
    for (int i = 0; i < N_WAYS; i++) {
        fxa_attn_bwd_plan_destroy(w[i].plan);
        free(w[i].ws);
        free(w[i].out);
        free(w[i].lse);
    }
    fxa_ctx_destroy(ctx);
    free(dout);
    free(dq);
    free(dk);
    free(dv);
    fxt_workload_free(&wl);
    return code;
}
