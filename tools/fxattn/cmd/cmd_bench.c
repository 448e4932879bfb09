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

#include "bench_bwd.h"
#include "bench_causal.h"
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

/* The single-process benchmark: the workload, an auto and an online plan of it, the output,
 * and their timings. */
typedef struct bench_single {
    fxt_workload w;
    bench_mode modes[2]; /* auto, online */
    bench_mode bounds;   /* the auto plan's bound pass */
    float *out;
    int n_threads;
    double peak; /* GFLOP/s of the units the tile's products run on */
    const char *peak_isa;
} bench_single;

/* The workload, the two plans and the peak they are measured against. */
static int single_setup(bench_single *b, const bench_opts *o)
{
    /* fp32 q, k, v and the output (16-bit copies of q, k, v besides for
     * bf16/f16); the plans check their workspaces themselves. */
    const double n_elems = (double)o->seq * (double)o->heads * (double)o->dim;
    int code = fxt_check_memory(n_elems * (o->dtype == FXA_F32 ? 16.0 : 22.0), 1,
                                "bench: q, k, v and the output");
    if (code || (code = fxt_workload_sequence(o->seq, o->heads, o->dim, o->dtype, &b->w)))
        return code;
    b->w.d.seq_kv = o->seq_kv; /* the first keys of the sequence: a contiguous [1, Skv, H, D] */
    b->out = malloc((size_t)(o->seq * o->heads * o->dim) * sizeof(float));
    if (!b->out)
        return fxt_fail(FXT_EXIT_FAILURE, "out of memory");
    for (int i = 0; i < 2; i++) {
        fxa_attn_desc d = b->w.d;
        d.mode = b->modes[i].mode;
        d.compute = o->compute;
        if ((code = fxt_runner_init(&b->modes[i].r, (int)o->threads, &d)))
            return code;
    }
    b->bounds.r = b->modes[0].r;
    b->n_threads = fxa_ctx_threads(b->modes[0].r.ctx);
    /* The peak of the units the tile's products run on: AMX where the amx set
     * takes this head dim (a multiple of 32), else vdpbf16ps or FMA. */
    const int amx = o->compute == FXA_COMPUTE_BF16 && o->dim % 32 == 0 &&
                    strcmp(fxa_ctx_isa(b->modes[0].r.ctx), "amx") == 0;
    b->peak = fxt_peak_gflops(o->compute == FXA_COMPUTE_FP32 ? FXT_PEAK_F32_FMA
                              : amx                          ? FXT_PEAK_BF16_AMX
                                                             : FXT_PEAK_BF16_DOT,
                              b->n_threads, &b->peak_isa);
    return 0;
}

/* A warm-up, then --repeats rounds of auto, online and the bound pass; their medians. */
static int single_runs(bench_single *b, const bench_opts *o)
{
    for (int rep = -1; rep < o->repeats; rep++) { /* rep -1: warm-up */
        for (int i = 0; i < 3; i++) {
            bench_mode *m = i < 2 ? &b->modes[i] : &b->bounds;
            const int code = time_once(m, &b->w, b->out, i == 2);
            if (code)
                return code;
            if (rep >= 0)
                m->seconds[rep] = m->st.seconds;
        }
    }
    for (int i = 0; i < 2; i++)
        b->modes[i].median = fxt_median(b->modes[i].seconds, (size_t)o->repeats);
    b->bounds.median = fxt_median(b->bounds.seconds, (size_t)o->repeats);
    return 0;
}

static void single_report(const bench_single *b, const bench_opts *o)
{
    const double gflop = fxa_attn_flops(&b->w.d) * 1e-9;
    const double ratio = b->modes[1].median / b->modes[0].median;
    const double bound_share = b->bounds.median / b->modes[0].median;
    const char *compute = o->compute == FXA_COMPUTE_BF16 ? "bf16" : "fp32";
    if (!o->json) {
        printf("fxattn bench: S=%lld Skv=%lld heads=%lld D=%lld %s (compute %s), %d threads, "
               "kernels %s, median of %lld runs\n",
               (long long)o->seq, (long long)o->seq_kv, (long long)o->heads, (long long)o->dim,
               fxt_dtype_name(o->dtype), compute, b->n_threads, fxa_ctx_isa(b->modes[0].r.ctx),
               (long long)o->repeats);
        printf("measured peak: %.1f GFLOP/s (%s)\n", b->peak, b->peak_isa);
    }
    for (int i = 0; i < 2; i++) {
        const bench_mode *m = &b->modes[i];
        const double gf = gflop / m->median;
        const double share = b->peak > 0 ? gf / b->peak : 0.0;
        const char *name = i ? "online" : "auto";
        if (o->json)
            fxt_json_printf(
                "{\"seq\": %lld, \"seq_kv\": %lld, \"heads\": %lld, \"dim\": %lld, \"dtype\": "
                "\"%s\", \"compute\": \"%s\", \"threads\": %d, \"mode\": \"%s\", \"isa\": \"%s\", "
                "\"seconds_median\": %.6f, "
                "\"seconds_best\": %.6f, \"gflops\": %.3f, \"peak_gflops\": %.3f, "
                "\"fraction_of_peak\": %.4f, \"fallback_rows\": %lld, \"rows\": %lld}\n",
                (long long)o->seq, (long long)o->seq_kv, (long long)o->heads, (long long)o->dim,
                fxt_dtype_name(o->dtype), compute, b->n_threads, name, fxa_ctx_isa(m->r.ctx),
                m->median, m->seconds[0], gf, b->peak, share, (long long)m->st.fallback_rows,
                (long long)m->st.rows);
        else
            printf("%-7s median %8.3f s  best %8.3f s  %8.2f GFLOP/s  %5.1f%% of peak  "
                   "fallback rows %lld/%lld\n",
                   name, m->median, m->seconds[0], gf, 100 * share, (long long)m->st.fallback_rows,
                   (long long)m->st.rows);
    }
    if (o->json) {
        fxt_json_printf("{\"fixed_over_online\": %.4f, \"bound_pass_seconds_median\": %.6f, "
                        "\"bound_pass_share\": %.4f}\n",
                        ratio, b->bounds.median, bound_share);
    } else {
        printf("fixed-max over online: %.3fx\n", ratio);
        printf("bound pass (input scan and row setup, no tiles): median %.4f s, %.1f%% of auto\n",
               b->bounds.median, 100 * bound_share);
    }
}

static int bench_one_process(const bench_opts *o)
{
    bench_single b = {.modes = {{.mode = FXA_MODE_AUTO}, {.mode = FXA_MODE_ONLINE}}};
    int code = single_setup(&b, o);
    if (!code)
        code = single_runs(&b, o);
    if (!code)
        single_report(&b, o);
    for (int i = 0; i < 2; i++)
        fxt_runner_free(&b.modes[i].r);
    free(b.out);
    fxt_workload_free(&b.w);
    return code;
}

int fxt_cmd_bench(int argc, char **argv)
{
    bench_args a;
    fxa_dtype dtype;
    int code = fxt_bench_args_parse(argc, argv, &a);
    if (code)
        return code;
    if (fxt_parse_dtype(a.dtype_s, &dtype))
        return FXT_EXIT_BAD_INPUT;
    /* The library's choice unless --compute names one; one process resolves it here, so that
     * the report names what ran (ranks resolve it together, in their plans). */
    fxa_compute compute = FXA_COMPUTE_AUTO;
    if (a.compute_s && fxt_parse_compute(a.compute_s, &compute))
        return FXT_EXIT_BAD_INPUT;
    if (!fxt_cp_opts_distributed(&a.cp) && (code = fxt_resolve_compute(&compute, dtype, a.dim)))
        return code;
    if (a.dim % 2)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--dim must be even");
    if (a.causal && (fxt_cp_opts_distributed(&a.cp) || a.proj))
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--causal runs attention in one process (not under "
                                            "mpirun, not with --proj)");
    if (a.seq_kv &&
        (a.seq_kv > a.seq || a.proj || a.backward || a.causal || fxt_cp_opts_distributed(&a.cp)))
        return fxt_fail(FXT_EXIT_BAD_INPUT,
                        "--seq-kv runs the forward in one process (not with --proj, --backward, "
                        "--causal or under mpirun) with at most --seq keys");
    if (a.backward && a.proj)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--backward times attention's backward, --proj the "
                                            "forward layer's projections: pass one of them");
    if (a.proj)
        return fxt_bench_proj(&a);
    const bench_opts o = {.seq = a.seq,
                          .seq_kv = a.seq_kv ? a.seq_kv : a.seq,
                          .heads = a.heads,
                          .dim = a.dim,
                          .dtype = dtype,
                          .compute = compute,
                          .threads = a.threads,
                          .repeats = a.repeats,
                          .json = a.json,
                          .cp = a.cp};
    if (a.causal && !a.backward)
        return fxt_bench_causal(&o);
    if (a.backward) {
        if (fxt_cp_opts_distributed(&a.cp))
            return fxt_fail(FXT_EXIT_BAD_INPUT,
                            "--backward runs in one process (not under mpirun)");
        return a.causal ? fxt_bench_bwd_causal(&o) : fxt_bench_bwd(&o);
    }
    return fxt_cp_opts_distributed(&a.cp) ? fxt_bench_mpi(&o) : bench_one_process(&o);
}
