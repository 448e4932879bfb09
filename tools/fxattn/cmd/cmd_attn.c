/*
 * `fxattn attn`: attention on .npy files (README.md, "Command line"). Outputs are staged
 * and committed only after the whole run succeeded, so a failed run leaves
 * no partial or stale file.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "attn_opts.h"
#include "cli.h"
#include "commands.h"

#include "inputs.h"
#include "fxattn_npy.h"
#include "runner.h"
#include "verify.h"
#include "stats.h"

static void print_stats(const fxa_attn_desc *d, const fxa_attn_stats *st, const fxt_runner *r,
                        const fxt_verify_result *vr)
{
    const double flops = fxa_attn_flops(d);
    fxt_json_printf(
        "{\"rows\": %lld, \"fallback_rows\": %lld, \"C\": %d, \"gate\": %d, "
        "\"gate_centered\": %d, \"vmax\": %.9g, \"max_bound\": %.17g, \"mode\": \"%s\", "
        "\"center\": \"%s\", \"dtype\": \"%s\", \"compute\": \"%s\", \"threads\": %d, \"isa\": "
        "\"%s\", "
        "\"seconds\": %.6f, \"gflops\": %.3f",
        (long long)st->rows, (long long)st->fallback_rows, st->c_min, st->gate_strict,
        st->gate_centered, st->vmax, st->max_bound, d->mode == FXA_MODE_AUTO ? "auto" : "online",
        d->center ? "on" : "off", fxt_dtype_name(d->dtype),
        st->compute == FXA_COMPUTE_BF16 ? "bf16" : "fp32", fxa_ctx_threads(r->ctx),
        fxa_ctx_isa(r->ctx), st->seconds, st->seconds > 0 ? flops / st->seconds * 1e-9 : 0.0);
    if (vr)
        fxt_json_printf(", \"verify_rows\": %lld, \"max_abs_err\": %.6g, \"max_rel_err\": %.6g, "
                        "\"max_lse_err\": %.6g",
                        (long long)vr->rows, vr->max_abs_err, vr->max_rel_err, vr->max_lse_err);
    printf("}\n");
}

/* Compare with the fp64 reference on 64 rows per head; outside
 * FXT_VERIFY_TOL an error (exit 1). */
int fxt_attn_verify(const fxt_inputs *in, const float *out, const float *lse, fxt_verify_result *vr)
{
    float *q = fxt_inputs_widen(in, 'q');
    float *k = fxt_inputs_widen(in, 'k');
    float *v = fxt_inputs_widen(in, 'v');
    int code = 0;
    if (q && k && v)
        fxt_verify(&in->d, q, k, v, out, lse, 64, vr);
    else
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory for --verify");
    const double tol = in->d.compute == FXA_COMPUTE_BF16 ? FXT_VERIFY_TOL_BF16 : FXT_VERIFY_TOL;
    if (!code && !(vr->max_rel_err <= tol && vr->max_lse_rel <= tol))
        code = fxt_fail(FXT_EXIT_FAILURE,
                        "--verify: max abs err %.3g (%.3g of max|v|), max lse err %.3g (%.3g "
                        "relative) on %lld rows exceeds the tolerance %.3g; nothing written",
                        vr->max_abs_err, vr->max_rel_err, vr->max_lse_err, vr->max_lse_rel,
                        (long long)vr->rows, tol);
    free(q);
    free(k);
    free(v);
    return code;
}

/* Run once, or with repeats > 1 a warm-up and `repeats` timed runs (plan
 * once, run many: the steady state); st->seconds is then their median. */
static int run_repeated(fxt_runner *r, const fxa_attn_args *a, int64_t repeats, fxa_attn_stats *st)
{
    double seconds[FXT_MAX_REPEATS];
    int code = fxt_runner_run(r, a, st, 0);
    for (int64_t i = 0; i < repeats && repeats > 1 && !code; i++) {
        code = fxt_runner_run(r, a, st, 0);
        seconds[i] = st->seconds;
    }
    if (!code && repeats > 1) {
        st->seconds = fxt_median(seconds, (size_t)repeats);
    }
    return code;
}

/* -o and --lse, and the inputs they must not overwrite. */
static int check_outputs(const attn_opts *o)
{
    const fxt_path outs[2] = {{"-o", o->out}, {"--lse", o->lse}};
    const fxt_path ins[3] = {{"-q", o->in.q}, {"-k", o->in.k}, {"-v", o->in.v}};
    return fxt_check_outputs("attn", outs, 2, ins, 3);
}

int fxt_attn_write_outputs(const attn_opts *o, const fxt_inputs *in, const float *out,
                           const float *lse)
{
    const int64_t q_shape[4] = {
        in->d.batch, in->d.layout == FXA_LAYOUT_BSHD ? in->d.seq_q : in->d.heads_q,
        in->d.layout == FXA_LAYOUT_BSHD ? in->d.heads_q : in->d.seq_q, in->d.head_dim};
    const int64_t lse_shape[3] = {in->d.batch, in->d.heads_q, in->d.seq_q};
    const fxt_npy_out outs[2] = {{o->out, 4, q_shape, out}, {o->lse, 3, lse_shape, lse}};
    const int code = check_outputs(o);
    return code ? code : fxt_write_npy_outputs(outs, o->lse ? 2 : 1);
}

int fxt_attn_apply_options(const attn_opts *o, fxa_attn_desc *d)
{
    if (o->mode && fxt_parse_mode(o->mode, &d->mode))
        return FXT_EXIT_BAD_INPUT;
    if (o->center && fxt_parse_onoff("--center", o->center, &d->center))
        return FXT_EXIT_BAD_INPUT;
    if (o->compute && fxt_parse_compute(o->compute, &d->compute))
        return FXT_EXIT_BAD_INPUT;
    if (!isnan(o->in.scale)) { /* NaN: not given (the parser refuses NaN) */
        if (o->in.scale == 0.0)
            return fxt_fail(FXT_EXIT_BAD_INPUT,
                            "--scale 0: leave --scale out for 1/sqrt(D) (any other finite "
                            "scale, negative too, is taken)");
        d->scale = o->in.scale;
    }
    d->heads_per_tile = (int)o->heads_per_tile;
    d->block_q = (int)o->block_q;
    d->reproducible = o->reproducible;
    return 0;
}

int fxt_attn_is_distributed(const attn_opts *o)
{
    return fxt_cp_opts_distributed(&o->cp);
}

/* Before reading anything: the three files (as read; a conversion to
 * another dtype holds both copies for a moment: counted twice), the output
 * and the LSE (Q's elements as fp32: at most twice Q's file). Over `ranks`
 * MPI ranks each holds about its share of that, three times (its shards,
 * the Ulysses buffers or ring slots, the accumulators), `node_ranks` of
 * them sharing the node's memory, and the rank that gathers also holds the
 * whole output and LSE (and for --verify the whole inputs, widened). */
int fxt_attn_check_memory(const attn_opts *o, int ranks, int node_ranks, int gathers)
{
    const char *paths[3] = {o->in.q, o->in.k, o->in.v};
    double files = 0.0, q_bytes = 0.0;
    for (int i = 0; i < 3; i++) {
        struct stat sb;
        if (stat(paths[i], &sb) != 0 || !S_ISREG(sb.st_mode))
            return 0; /* the loader reports it */
        files += (double)sb.st_size;
        q_bytes = i == 0 ? (double)sb.st_size : q_bytes;
    }
    const double whole = files * (o->in.dtype ? 2.0 : 1.0) + 2.0 * q_bytes;
    const double verify = o->verify ? 2.0 * files : 0.0;
    const double need =
        ranks > 1 ? 3.0 * whole / ranks + (gathers ? 2.0 * q_bytes + verify : 0.0) : whole + verify;
    return fxt_check_memory(need, node_ranks, "attn: the inputs, the output and the LSE");
}

int fxt_cmd_attn(int argc, char **argv)
{
    attn_opts o;
    fxt_inputs in;
    fxt_runner r;
    fxa_layout layout;
    const char *usage = "attn needs -q Q.npy -k K.npy -v V.npy -o OUT.npy";
    int code = fxt_attn_opts_parse(argc, argv, &o);
    if (!code)
        code = o.out ? fxt_qkv_opts_layout(&o.in, 1, usage, &layout)
                     : fxt_fail(FXT_EXIT_BAD_INPUT, "%s", usage);
    if (code)
        return code;
    if (o.lse && fxa_same_output(o.out, o.lse))
        return fxt_fail(FXT_EXIT_BAD_INPUT, "-o %s and --lse %s name the same file", o.out, o.lse);
    if (o.mode || o.center || o.compute || !isnan(o.in.scale)) {
        /* Validate cheap options before reading any file. */
        fxa_attn_desc probe;
        fxa_attn_desc_init(&probe);
        if ((code = fxt_attn_apply_options(&o, &probe)))
            return code;
    }
    if (fxt_attn_is_distributed(&o))
        return fxt_attn_mpi(&o);
    if ((code = check_outputs(&o)))
        return code;
    if ((code = fxt_attn_check_memory(&o, 1, 1, 1)))
        return code;
    if ((code = fxt_inputs_load(o.in.q, o.in.k, o.in.v, layout, o.in.dtype, &in)))
        return code;
    if ((code = fxt_attn_apply_options(&o, &in.d)) ||
        (code = fxt_resolve_compute(&in.d.compute, in.d.dtype, in.d.head_dim)))
        goto out_inputs;
    if ((code = fxt_runner_init(&r, (int)o.in.threads, &in.d)))
        goto out_inputs;
    const size_t rows = (size_t)(in.d.batch * in.d.heads_q * in.d.seq_q);
    float *out = malloc((size_t)in.nq * sizeof(float));
    float *lse = o.lse || o.verify ? malloc(rows * sizeof(float)) : NULL;
    if (!out || ((o.lse || o.verify) && !lse)) {
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory for the output");
        goto out_buffers;
    }
    /* --verify alone checks the output only: no LSE is asked of the library
     * (whose LSE bound might refuse inputs whose output is representable). */
    fxa_attn_args a = {.struct_size = sizeof a,
                       .q = in.q,
                       .k = in.k,
                       .v = in.v,
                       .out = out,
                       .lse = o.lse ? lse : NULL};
    fxa_attn_stats st = {.struct_size = sizeof st};
    fxt_verify_result vr;
    if ((code = run_repeated(&r, &a, o.repeats, &st)))
        goto out_buffers;
    if (o.verify && (code = fxt_attn_verify(&in, out, a.lse, &vr)))
        goto out_buffers;
    if ((code = fxt_attn_write_outputs(&o, &in, out, lse)))
        goto out_buffers;
    if (o.stats)
        print_stats(&in.d, &st, &r, o.verify ? &vr : NULL);
    else if (o.verify)
        printf("verify: %lld rows, max abs err %.3g (%.3g of max|v|), max lse err %.3g\n",
               (long long)vr.rows, vr.max_abs_err, vr.max_rel_err, vr.max_lse_err);
out_buffers:
    free(out);
    free(lse);
    fxt_runner_free(&r);
out_inputs:
    fxt_inputs_free(&in);
    return code;
}
