/*
 * `fxattn check`: does the fixed-max bound suit this model's attention?
 * Per query head: the spread of query and key norms, the bound ceil(U_i)
 * against the gates, the predicted share of rows that fall back with and
 * without centring (from the library's own bound pass, so the prediction is
 * exactly what `attn` would do), and the overshoot of the bound over each
 * row's true maximum score on sampled rows. Base-2 units unless marked nats.
 * The report is libfxattn's check plan (fxattn_diag.h); this file runs
 * it and prints it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn_diag.h"
#include "cli.h"
#include "cmd_opts.h"
#include "commands.h"
#include "inputs.h"
#include "runner.h"

static void print_text(const fxa_attn_desc *d, const fxa_check_head *hr, int has_v, double share_c,
                       double share_r)
{
    printf("fxattn check: B=%lld Hq=%lld Hkv=%lld Sq=%lld Skv=%lld D=%lld scale=%.6g%s\n",
           (long long)d->batch, (long long)d->heads_q, (long long)d->heads_kv, (long long)d->seq_q,
           (long long)d->seq_kv, (long long)d->head_dim, d->scale,
           has_v ? "" : " (no V given: Vmax taken as 1)");
    printf("bounds in base-2 units; overshoot = bound - true row max on %d sampled rows/head\n",
           FXA_CHECK_SAMPLE_ROWS);
    printf("%4s %23s %9s %9s %4s %8s %15s %15s %15s %15s\n", "head", "|q| min/med/max", "|k| max",
           "|k-kbar|", "C", "gates", "bound med/max", "fallback c/raw", "over med/max",
           "over raw med/max");
    for (int64_t h = 0; h < d->heads_q; h++) {
        const fxa_check_head *r = &hr[h];
        printf("%4lld %7.3g/%7.3g/%7.3g %9.4g %9.4g %4d %3d/%4d %7.0f/%7.0f %6.1f%%/%6.1f%% "
               "%7.1f/%7.1f %7.1f/%7.1f\n",
               (long long)h, r->q_norm_min, r->q_norm_median, r->q_norm_max, r->k_norm_max,
               r->k_radius_centered, r->c, r->gate, r->gate_centered, r->bound_median, r->bound_max,
               100 * r->fallback_share_centered, 100 * r->fallback_share_raw, r->overshoot_median,
               r->overshoot_max, r->overshoot_raw_median, r->overshoot_raw_max);
    }
    printf("predicted fallback rows: %.2f%% with centring, %.2f%% without\n", 100 * share_c,
           100 * share_r);
}

static void print_json(const fxa_attn_desc *d, const fxa_check_head *hr, int has_v, double share_c,
                       double share_r)
{
    fxt_json_printf("{\"batch\": %lld, \"heads_q\": %lld, \"heads_kv\": %lld, \"seq_q\": %lld, "
                    "\"seq_kv\": %lld, \"head_dim\": %lld, \"scale\": %.17g, \"has_v\": %s, "
                    "\"fallback_share_centered\": %.6g, \"fallback_share_raw\": %.6g, \"heads\": [",
                    (long long)d->batch, (long long)d->heads_q, (long long)d->heads_kv,
                    (long long)d->seq_q, (long long)d->seq_kv, (long long)d->head_dim, d->scale,
                    has_v ? "true" : "false", share_c, share_r);
    for (int64_t h = 0; h < d->heads_q; h++) {
        const fxa_check_head *r = &hr[h];
        fxt_json_printf("%s{\"head\": %lld, \"q_norm_min\": %.6g, \"q_norm_median\": %.6g, "
                        "\"q_norm_max\": %.6g, \"k_norm_max\": %.6g, \"k_radius_centered\": %.6g, "
                        "\"vmax\": %.6g, \"C\": %d, \"gate\": %d, \"gate_centered\": %d, "
                        "\"bound_median\": %.0f, \"bound_max\": %.0f, \"bound_raw_median\": %.0f, "
                        "\"bound_raw_max\": %.0f, \"fallback_share_centered\": %.6g, "
                        "\"fallback_share_raw\": %.6g, \"overshoot_median\": %.4g, "
                        "\"overshoot_max\": %.4g, \"overshoot_raw_median\": %.4g, "
                        "\"overshoot_raw_max\": %.4g, \"overshoot_max_nats\": %.4g}",
                        h ? ", " : "", (long long)h, r->q_norm_min, r->q_norm_median, r->q_norm_max,
                        r->k_norm_max, r->k_radius_centered, r->vmax, r->c, r->gate,
                        r->gate_centered, r->bound_median, r->bound_max, r->bound_raw_median,
                        r->bound_raw_max, r->fallback_share_centered, r->fallback_share_raw,
                        r->overshoot_median, r->overshoot_max, r->overshoot_raw_median,
                        r->overshoot_raw_max, r->overshoot_max * 0.6931471805599453);
    }
    printf("]}\n");
}

/* The report of the loaded inputs into hr (Hq heads): a check plan, its
 * workspace and one run. 0 or the exit code of a failure (printed). */
static int run_report(fxa_ctx *ctx, const fxt_inputs *in, int has_v, fxa_check_head *hr)
{
    fxa_check_desc cd;
    fxa_check_desc_init(&cd);
    cd.attn = &in->d;
    cd.has_v = has_v;
    fxa_check_plan *plan = NULL;
    size_t ws_bytes = 0;
    void *ws = NULL;
    fxa_status st = fxa_check_plan_create(ctx, &cd, &plan, &ws_bytes);
    if (st == FXA_OK && !(ws = aligned_alloc(64, (ws_bytes + 63) / 64 * 64))) {
        fxa_check_plan_destroy(plan);
        return fxt_fail(FXT_EXIT_FAILURE, "out of memory for the check's workspace");
    }
    if (st == FXA_OK) {
        const fxa_attn_args a = {
            .struct_size = sizeof a, .q = in->q, .k = in->k, .v = has_v ? in->v : NULL};
        st = fxa_check_run(plan, &a, ws, hr, sizeof(fxa_check_head));
    }
    free(ws);
    fxa_check_plan_destroy(plan);
    return st == FXA_OK ? 0 : fxt_fail(fxt_exit_code(st), "%s", fxa_ctx_last_error(ctx));
}

int fxt_cmd_check(int argc, char **argv)
{
    check_opts o;
    fxa_layout layout;
    fxt_inputs in;
    int code = fxt_check_opts_parse(argc, argv, &o);
    if (!code)
        code = fxt_qkv_opts_layout(&o.in, 0, "check needs -q Q.npy -k K.npy [-v V.npy]", &layout);
    if (code)
        return code;
    if (o.in.scale == 0.0)
        return fxt_fail(FXT_EXIT_BAD_INPUT,
                        "--scale 0: leave --scale out for 1/sqrt(D) (any other finite scale, "
                        "negative too, is taken)");
    if ((code = fxt_inputs_load(o.in.q, o.in.k, o.in.v, layout, o.in.dtype, &in)))
        return code;
    in.d.scale = isnan(o.in.scale) ? 1.0 / sqrt((double)in.d.head_dim) : o.in.scale;
    fxa_ctx *ctx = NULL;
    fxa_check_head *hr = calloc((size_t)in.d.heads_q, sizeof *hr);
    if (!hr) {
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory");
        goto out;
    }
    if ((code = fxt_context(o.in.threads, &ctx)))
        goto out;
    /* Without -v no V is passed (fxt_inputs_load's zeros are not data): vmax
     * reads 1 and C is that of Vmax 1, as for every caller without V. */
    if ((code = run_report(ctx, &in, o.in.v != NULL, hr)))
        goto out;
    /* The overall shares: the mean of the heads' (every head has B Sq rows). */
    double share_c = 0.0;
    double share_r = 0.0;
    for (int64_t h = 0; h < in.d.heads_q; h++) {
        share_c += hr[h].fallback_share_centered / (double)in.d.heads_q;
        share_r += hr[h].fallback_share_raw / (double)in.d.heads_q;
    }
    if (o.json)
        print_json(&in.d, hr, o.in.v != NULL, share_c, share_r);
    else
        print_text(&in.d, hr, o.in.v != NULL, share_c, share_r);
out:
    fxa_ctx_destroy(ctx);
    free(hr);
    fxt_inputs_free(&in);
    return code;
}
