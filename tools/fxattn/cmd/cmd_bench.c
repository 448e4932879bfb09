/*
 * `fxattn bench`: attention speed on Wan-like synthetic data (README.md, "Command line").
 * Fixed-max (auto) and online runs alternate after a warm-up, so both see
 * the same machine state; each reports the median of its runs as GFLOP/s
 * and as a share of this machine's peak, measured in the same process by an
 * FMA (fp32), vdpbf16ps or AMX tdpbf16ps (bf16: the units the kernel set's
 * tile runs its products on) throughput loop on as many threads. The
 * bound pass alone (fxa_attn_bounds: the input scan and the row setup, no
 * tiles) is timed alongside, as the share of the auto run it accounts for:
 * what fixed-max's exactness costs up front, largest at short sequences.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_opts.h"
#include "bench_proj.h"
#include "cli.h"
#include "cmd_opts.h"
#include "commands.h"
#include "peak.h"
#include "runner.h"
#include "workload.h"
#include "stats.h"

#define MAX_REPEATS FXT_MAX_REPEATS

typedef struct bench_mode {
    fxa_mode mode;
    fxt_runner r;
    double seconds[MAX_REPEATS];
    double median;
    fxa_attn_stats st;
} bench_mode;

/* One run of m's plan (bounds_only: its bound pass alone), its wall time in
 * m->st.seconds. */
static int time_once(bench_mode *m, const fxt_workload *w, float *out, int bounds_only)
{
    fxa_attn_args a = {.struct_size = sizeof a, .q = w->q, .k = w->k, .v = w->v, .out = out};
    const double t0 = fxt_now();
    m->st.struct_size = sizeof m->st;
    int code = fxt_runner_run(&m->r, &a, &m->st, bounds_only);
    m->st.seconds = fxt_now() - t0;
    return code;
}

int fxt_cmd_bench(int argc, char **argv)
{
    bench_args a;
    fxt_opt opts[FXT_MAX_OPTS];
    fxt_bench_args_defaults(&a);
    fxt_bench_args_table(&a, opts);
    fxa_dtype dtype;
    int code = fxt_parse_options("bench", argc, argv, 2, opts);
    if (code)
        return code;
    if (fxt_parse_dtype(a.dtype_s, &dtype))
        return FXT_EXIT_BAD_INPUT;
    /* bf16 inputs run the bf16 kernels unless --compute fp32 asks otherwise. */
    fxa_compute compute = dtype == FXA_BF16 ? FXA_COMPUTE_BF16 : FXA_COMPUTE_FP32;
    if (a.compute_s && fxt_parse_compute(a.compute_s, &compute))
        return FXT_EXIT_BAD_INPUT;
    if (a.dim % 2)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--dim must be even");
    if (a.proj)
        return fxt_bench_proj(&a);
    if (a.ulysses || a.ring || a.prefetch || a.timeout != 0.0 || a.grid ||
        getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK")) {
        const bench_opts bo = {.seq = a.seq,
                               .heads = a.heads,
                               .dim = a.dim,
                               .dtype = dtype,
                               .compute = compute,
                               .threads = a.threads,
                               .repeats = a.repeats,
                               .json = a.json,
                               .ulysses = a.ulysses,
                               .ring = a.ring,
                               .prefetch = a.prefetch,
                               .timeout = a.timeout,
                               .grid = a.grid};
        return fxt_bench_mpi(&bo);
    }
    const int64_t seq = a.seq, heads = a.heads, dim = a.dim, threads = a.threads;
    const int64_t repeats = a.repeats;
    const int json = a.json;
    /* fp32 q, k, v and the output (16-bit copies of q, k, v besides for
     * bf16/f16); the plans check their workspaces themselves. */
    const double n_elems = (double)seq * (double)heads * (double)dim;
    if ((code = fxt_check_memory(n_elems * (dtype == FXA_F32 ? 16.0 : 22.0), 1,
                                 "bench: q, k, v and the output")))
        return code;
    fxt_wan_synth p;
    fxt_workload w;
    fxt_wan_synth_defaults(&p);
    p.frames = 1;
    p.height = 1;
    p.width = (int)seq;
    p.heads = (int)heads;
    p.head_dim = (int)dim;
    if ((code = fxt_workload_make(&p, dtype, &w)))
        return code;
    bench_mode modes[2] = {{.mode = FXA_MODE_AUTO}, {.mode = FXA_MODE_ONLINE}};
    float *out = malloc((size_t)(seq * heads * dim) * sizeof(float));
    if (!out) {
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory");
        goto out;
    }
    for (int i = 0; i < 2; i++) {
        fxa_attn_desc d = w.d;
        d.mode = modes[i].mode;
        d.compute = compute;
        if ((code = fxt_runner_init(&modes[i].r, (int)threads, &d)))
            goto out;
    }
    const int n_threads = fxa_ctx_threads(modes[0].r.ctx);
    const char *peak_isa = NULL;
    /* The peak of the units the tile's products run on: AMX where the amx set
     * takes this head dim (a multiple of 32), else vdpbf16ps or FMA. */
    const int amx = compute == FXA_COMPUTE_BF16 && dim % 32 == 0 &&
                    strcmp(fxa_ctx_isa(modes[0].r.ctx), "amx") == 0;
    const double peak = fxt_peak_gflops(compute == FXA_COMPUTE_FP32 ? FXT_PEAK_F32_FMA
                                        : amx                       ? FXT_PEAK_BF16_AMX
                                                                    : FXT_PEAK_BF16_DOT,
                                        n_threads, &peak_isa);
    bench_mode bounds = {.r = modes[0].r};     /* the auto plan's bound pass */
    for (int rep = -1; rep < repeats; rep++) { /* rep -1: warm-up */
        for (int i = 0; i < 3; i++) {
            bench_mode *m = i < 2 ? &modes[i] : &bounds;
            if ((code = time_once(m, &w, out, i == 2)))
                goto out;
            if (rep >= 0)
                m->seconds[rep] = m->st.seconds;
        }
    }
    const double gflop = fxa_attn_flops(&w.d) * 1e-9;
    for (int i = 0; i < 2; i++) {
        modes[i].median = fxt_median(modes[i].seconds, (size_t)repeats);
    }
    bounds.median = fxt_median(bounds.seconds, (size_t)repeats);
    const double ratio = modes[1].median / modes[0].median;
    const double bound_share = bounds.median / modes[0].median;
    if (!json) {
        printf("fxattn bench: S=%lld heads=%lld D=%lld %s (compute %s), %d threads, kernels %s, "
               "median of %lld runs\n",
               (long long)seq, (long long)heads, (long long)dim, fxt_dtype_name(dtype),
               compute == FXA_COMPUTE_BF16 ? "bf16" : "fp32", n_threads,
               fxa_ctx_isa(modes[0].r.ctx), (long long)repeats);
        printf("measured peak: %.1f GFLOP/s (%s)\n", peak, peak_isa);
    }
    for (int i = 0; i < 2; i++) {
        const double gf = gflop / modes[i].median;
        const char *name = i ? "online" : "auto";
        if (json)
            fxt_json_printf(
                "{\"seq\": %lld, \"heads\": %lld, \"dim\": %lld, \"dtype\": \"%s\", "
                "\"compute\": \"%s\", \"threads\": %d, \"mode\": \"%s\", \"isa\": \"%s\", "
                "\"seconds_median\": %.6f, "
                "\"seconds_best\": %.6f, \"gflops\": %.3f, \"peak_gflops\": %.3f, "
                "\"fraction_of_peak\": %.4f, \"fallback_rows\": %lld, \"rows\": %lld}\n",
                (long long)seq, (long long)heads, (long long)dim, fxt_dtype_name(dtype),
                compute == FXA_COMPUTE_BF16 ? "bf16" : "fp32", n_threads, name,
                fxa_ctx_isa(modes[i].r.ctx), modes[i].median, modes[i].seconds[0], gf, peak,
                peak > 0 ? gf / peak : 0.0, (long long)modes[i].st.fallback_rows,
                (long long)modes[i].st.rows);
        else
            printf("%-7s median %8.3f s  best %8.3f s  %8.2f GFLOP/s  %5.1f%% of peak  "
                   "fallback rows %lld/%lld\n",
                   name, modes[i].median, modes[i].seconds[0], gf, peak > 0 ? 100 * gf / peak : 0.0,
                   (long long)modes[i].st.fallback_rows, (long long)modes[i].st.rows);
    }
    if (json) {
        fxt_json_printf("{\"fixed_over_online\": %.4f, \"bound_pass_seconds_median\": %.6f, "
                        "\"bound_pass_share\": %.4f}\n",
                        ratio, bounds.median, bound_share);
    } else {
        printf("fixed-max over online: %.3fx\n", ratio);
        printf("bound pass (input scan and row setup, no tiles): median %.4f s, %.1f%% of auto\n",
               bounds.median, 100 * bound_share);
    }
out:
    for (int i = 0; i < 2; i++)
        fxt_runner_free(&modes[i].r);
    free(out);
    fxt_workload_free(&w);
    return code;
}
