/*
 * `fxattn bench --causal`: causal attention (fxa_attn_desc.causal = 1) and
 * unmasked attention, both auto mode, on the same Wan-like inputs,
 * alternating after a warm-up so that both see the same machine state;
 * medians of --repeats runs and the causal speedup (unmasked median over
 * causal median; causal skips about half the scores at Sq = Skv, so 2 is
 * the ideal).
 */
#include <stdio.h>
#include <stdlib.h>

#include "bench_causal.h"
#include "cli.h"
#include "cmd_opts.h"
#include "runner.h"
#include "stats.h"
#include "workload.h"

#define N_WAYS 2 /* unmasked, causal */

static int run_ways(fxt_runner *r, const fxt_workload *w, float *out, const bench_opts *o,
                    double seconds[N_WAYS][FXT_MAX_REPEATS])
{
    fxa_attn_args a = {.struct_size = sizeof a, .q = w->q, .k = w->k, .v = w->v, .out = out};
    for (int rep = -1; rep < o->repeats; rep++) { /* rep -1: warm-up */
        for (int i = 0; i < N_WAYS; i++) {
            fxa_attn_stats st = {.struct_size = sizeof st};
            const double t0 = fxt_now();
            const int code = fxt_runner_run(&r[i], &a, &st, 0);
            if (code)
                return code;
            if (rep >= 0)
                seconds[i][rep] = fxt_now() - t0;
        }
    }
    return 0;
}

int fxt_bench_causal(const bench_opts *o)
{
    const double n_elems = (double)o->seq * (double)o->heads * (double)o->dim;
    fxt_workload w;
    fxt_runner r[N_WAYS] = {{0}};
    float *out = NULL;
    double seconds[N_WAYS][FXT_MAX_REPEATS];
    int code = fxt_check_memory(n_elems * (o->dtype == FXA_F32 ? 16.0 : 22.0), 1,
                                "bench --causal: q, k, v and the output");
    if (code || (code = fxt_workload_sequence(o->seq, o->heads, o->dim, o->dtype, &w)))
        return code;
    out = malloc((size_t)n_elems * sizeof(float));
    if (!out)
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory");
    for (int i = 0; i < N_WAYS && !code; i++) {
        fxa_attn_desc d = w.d;
        d.compute = o->compute;
        d.causal = i;
        code = fxt_runner_init(&r[i], (int)o->threads, &d);
    }
    if (!code)
        code = run_ways(r, &w, out, o, seconds);
    if (!code) {
        const double unmasked = fxt_median(seconds[0], (size_t)o->repeats);
        const double causal = fxt_median(seconds[1], (size_t)o->repeats);
        const char *compute = o->compute == FXA_COMPUTE_BF16 ? "bf16" : "fp32";
        if (o->json)
            fxt_json_printf(
                "{\"seq\": %lld, \"heads\": %lld, \"dim\": %lld, \"dtype\": \"%s\", "
                "\"compute\": \"%s\", \"threads\": %d, \"unmasked_seconds_median\": %.6f, "
                "\"causal_seconds_median\": %.6f, \"causal_speedup\": %.4f}\n",
                (long long)o->seq, (long long)o->heads, (long long)o->dim, fxt_dtype_name(o->dtype),
                compute, fxa_ctx_threads(r[0].ctx), unmasked, causal, unmasked / causal);
        else
            printf("fxattn bench --causal: S=%lld heads=%lld D=%lld %s (compute %s), %d threads, "
                   "median of %lld runs\nunmasked median %8.4f s\ncausal   median %8.4f s\n"
                   "causal speedup over unmasked: %.3fx\n",
                   (long long)o->seq, (long long)o->heads, (long long)o->dim,
                   fxt_dtype_name(o->dtype), compute, fxa_ctx_threads(r[0].ctx),
                   (long long)o->repeats, unmasked, causal, unmasked / causal);
    }
    for (int i = 0; i < N_WAYS; i++)
        fxt_runner_free(&r[i]);
    free(out);
    fxt_workload_free(&w);
    return code;
}
