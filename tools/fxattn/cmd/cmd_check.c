/*
 * `fxattn check`: does the fixed-max bound suit this model's attention?
 * Per query head: the spread of query and key norms, the bound ceil(U_i)
 * against the gates, the predicted share of rows that fall back with and
 * without centring (from the library's own bound pass, so the prediction is
 * exactly what `attn` would do), and the overshoot of the bound over each
 * row's true maximum score on sampled rows. Base-2 units unless marked nats.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn_diag.h"
#include "cli.h"
#include "cmd_opts.h"
#include "commands.h"
#include "fp64_attn.h"
#include "inputs.h"
#include "runner.h"
#include "stats.h"

#define SAMPLE_ROWS 32 /* rows per (batch, head) for the true-max overshoot */

typedef struct head_report {
    double q_min, q_med, q_max; /* ||q_i|| */
    double k_max;               /* max ||k_j|| */
    double k_radius;            /* max ||k_j - kbar|| */
    double vmax;
    int c, gate, gate_centered;
    double bound_med, bound_max;            /* centred ceil(U_i) */
    double bound_raw_med, bound_raw_max;    /* uncentred */
    double fallback_centered, fallback_raw; /* shares of rows */
    double over_med, over_max;              /* centred overshoot over the true max, base 2 */
    double over_raw_med, over_raw_max;
} head_report;

/* The bound pass of one plan (centring on or off): row bounds and flags. */
static int bound_pass(const fxt_inputs *in, int center, int threads, float *bound, uint8_t *fb)
{
    fxt_runner r;
    fxa_attn_desc d = in->d;
    d.center = center;
    int code = fxt_runner_init(&r, threads, &d);
    if (code)
        return code;
    fxa_attn_args a = {.struct_size = sizeof a,
                       .q = in->q,
                       .k = in->k,
                       .v = in->v,
                       .row_bound = bound,
                       .row_fallback = fb};
    code = fxt_runner_run(&r, &a, NULL, 1);
    fxt_runner_free(&r);
    return code;
}

/* Key statistics of kv head kvh in batch b: max norm, centred radius, Vmax,
 * and the mean key into kbar. */
static void key_stats(const fxa_attn_desc *d, const float *k, const float *v, int64_t b,
                      int64_t kvh, double *kbar, head_report *hr)
{
    const int64_t dim = d->head_dim;
    for (int64_t c = 0; c < dim; c++)
        kbar[c] = 0.0;
    for (int64_t j = 0; j < d->seq_kv; j++) {
        const int64_t off = fxt_row_offset(d, d->heads_kv, d->seq_kv, b, kvh, j);
        double nn = 0.0;
        for (int64_t c = 0; c < dim; c++) {
            kbar[c] += k[off + c] / (double)d->seq_kv;
            nn += (double)k[off + c] * k[off + c];
            hr->vmax = fmax(hr->vmax, fabs((double)v[off + c]));
        }
        hr->k_max = fmax(hr->k_max, sqrt(nn));
    }
    for (int64_t j = 0; j < d->seq_kv; j++) {
        const int64_t off = fxt_row_offset(d, d->heads_kv, d->seq_kv, b, kvh, j);
        double nn = 0.0;
        for (int64_t c = 0; c < dim; c++)
            nn += pow(k[off + c] - kbar[c], 2.0);
        hr->k_radius = fmax(hr->k_radius, sqrt(nn));
    }
}

/* True max over keys of the base-2 scores of row (b, h, i), raw and centred. */
static void true_max(const fxa_attn_desc *d, double lambda, const float *q, const float *k,
                     const double *kbar, int64_t b, int64_t h, int64_t i, double *raw,
                     double *centred)
{
    const int64_t dim = d->head_dim;
    const int64_t kvh = h / (d->heads_q / d->heads_kv);
    const float *qi = q + fxt_row_offset(d, d->heads_q, d->seq_q, b, h, i);
    double qk_bar = 0.0;
    double best = -INFINITY;
    for (int64_t c = 0; c < dim; c++)
        qk_bar += qi[c] * kbar[c];
    for (int64_t j = 0; j < d->seq_kv; j++) {
        const float *kj = k + fxt_row_offset(d, d->heads_kv, d->seq_kv, b, kvh, j);
        double s = 0.0;
        for (int64_t c = 0; c < dim; c++)
            s += (double)qi[c] * kj[c];
        best = fmax(best, s);
    }
    *raw = lambda * best;
    *centred = lambda * (best - qk_bar);
}

static void report_head(const fxt_inputs *in, const float *q, const float *k, const float *v,
                        const float *bound_c, const float *bound_r, const uint8_t *fb_c,
                        const uint8_t *fb_r, int64_t h, double *scratch, head_report *hr)
{
    const fxa_attn_desc *d = &in->d;
    const int64_t n = d->batch * d->seq_q;
    const double lambda = d->scale * 1.4426950408889634;
    double kbar[FXA_MAX_HEAD_DIM];
    double *over = scratch + 3 * n;
    double *over_raw = over + SAMPLE_ROWS * d->batch;
    int64_t n_over = 0;
    int64_t fb_count_c = 0;
    int64_t fb_count_r = 0;
    memset(hr, 0, sizeof *hr);
    for (int64_t b = 0; b < d->batch; b++) {
        key_stats(d, k, v, b, h / (d->heads_q / d->heads_kv), kbar, hr);
        const int64_t samples = d->seq_q < SAMPLE_ROWS ? d->seq_q : SAMPLE_ROWS;
        for (int64_t i = 0; i < d->seq_q; i++) {
            const int64_t row = (b * d->heads_q + h) * d->seq_q + i;
            const float *qi = q + fxt_row_offset(d, d->heads_q, d->seq_q, b, h, i);
            double nn = 0.0;
            for (int64_t c = 0; c < d->head_dim; c++)
                nn += (double)qi[c] * qi[c];
            scratch[b * d->seq_q + i] = sqrt(nn);
            scratch[n + b * d->seq_q + i] = bound_c[row];
            scratch[2 * n + b * d->seq_q + i] = bound_r[row];
            fb_count_c += fb_c[row];
            fb_count_r += fb_r[row];
        }
        for (int64_t s = 0; s < samples; s++) {
            const int64_t i = samples > 1 ? s * (d->seq_q - 1) / (samples - 1) : 0;
            const int64_t row = (b * d->heads_q + h) * d->seq_q + i;
            double raw;
            double centred;
            true_max(d, lambda, q, k, kbar, b, h, i, &raw, &centred);
            over[n_over] = bound_c[row] - centred;
            over_raw[n_over++] = bound_r[row] - raw;
        }
    }
    hr->c = fxa_fixed_m_c(d->seq_kv, hr->vmax);
    hr->gate = fxa_fixed_m_gate_strict(hr->c);
    hr->gate_centered = fxa_fixed_m_gate_centered(hr->c, d->seq_kv);
    hr->fallback_centered = (double)fb_count_c / (double)n;
    hr->fallback_raw = (double)fb_count_r / (double)n;
    hr->q_max = 0.0;
    hr->q_min = INFINITY;
    for (int64_t i = 0; i < n; i++) {
        hr->q_max = fmax(hr->q_max, scratch[i]);
        hr->q_min = fmin(hr->q_min, scratch[i]);
        hr->bound_max = fmax(hr->bound_max, scratch[n + i]);
        hr->bound_raw_max = fmax(hr->bound_raw_max, scratch[2 * n + i]);
    }
    hr->q_med = fxt_median(scratch, (size_t)n);
    hr->bound_med = fxt_median(scratch + n, (size_t)n);
    hr->bound_raw_med = fxt_median(scratch + 2 * n, (size_t)n);
    for (int64_t i = 0; i < n_over; i++) {
        hr->over_max = fmax(hr->over_max, over[i]);
        hr->over_raw_max = fmax(hr->over_raw_max, over_raw[i]);
    }
    hr->over_med = fxt_median(over, (size_t)n_over);
    hr->over_raw_med = fxt_median(over_raw, (size_t)n_over);
}

static void print_text(const fxa_attn_desc *d, const head_report *hr, int has_v, double share_c,
                       double share_r)
{
    printf("fxattn check: B=%lld Hq=%lld Hkv=%lld Sq=%lld Skv=%lld D=%lld scale=%.6g%s\n",
           (long long)d->batch, (long long)d->heads_q, (long long)d->heads_kv, (long long)d->seq_q,
           (long long)d->seq_kv, (long long)d->head_dim, d->scale,
           has_v ? "" : " (no V given: Vmax taken as 1)");
    printf("bounds in base-2 units; overshoot = bound - true row max on %d sampled rows/head\n",
           SAMPLE_ROWS);
    printf("%4s %23s %9s %9s %4s %8s %15s %15s %15s %15s\n", "head", "|q| min/med/max", "|k| max",
           "|k-kbar|", "C", "gates", "bound med/max", "fallback c/raw", "over med/max",
           "over raw med/max");
    for (int64_t h = 0; h < d->heads_q; h++) {
        const head_report *r = &hr[h];
        printf("%4lld %7.3g/%7.3g/%7.3g %9.4g %9.4g %4d %3d/%4d %7.0f/%7.0f %6.1f%%/%6.1f%% "
               "%7.1f/%7.1f %7.1f/%7.1f\n",
               (long long)h, r->q_min, r->q_med, r->q_max, r->k_max, r->k_radius, r->c, r->gate,
               r->gate_centered, r->bound_med, r->bound_max, 100 * r->fallback_centered,
               100 * r->fallback_raw, r->over_med, r->over_max, r->over_raw_med, r->over_raw_max);
    }
    printf("predicted fallback rows: %.2f%% with centring, %.2f%% without\n", 100 * share_c,
           100 * share_r);
}

static void print_json(const fxa_attn_desc *d, const head_report *hr, int has_v, double share_c,
                       double share_r)
{
    fxt_json_printf("{\"batch\": %lld, \"heads_q\": %lld, \"heads_kv\": %lld, \"seq_q\": %lld, "
                    "\"seq_kv\": %lld, \"head_dim\": %lld, \"scale\": %.17g, \"has_v\": %s, "
                    "\"fallback_share_centered\": %.6g, \"fallback_share_raw\": %.6g, \"heads\": [",
                    (long long)d->batch, (long long)d->heads_q, (long long)d->heads_kv,
                    (long long)d->seq_q, (long long)d->seq_kv, (long long)d->head_dim, d->scale,
                    has_v ? "true" : "false", share_c, share_r);
    for (int64_t h = 0; h < d->heads_q; h++) {
        const head_report *r = &hr[h];
        fxt_json_printf("%s{\"head\": %lld, \"q_norm_min\": %.6g, \"q_norm_median\": %.6g, "
                        "\"q_norm_max\": %.6g, \"k_norm_max\": %.6g, \"k_radius_centered\": %.6g, "
                        "\"vmax\": %.6g, \"C\": %d, \"gate\": %d, \"gate_centered\": %d, "
                        "\"bound_median\": %.0f, \"bound_max\": %.0f, \"bound_raw_median\": %.0f, "
                        "\"bound_raw_max\": %.0f, \"fallback_share_centered\": %.6g, "
                        "\"fallback_share_raw\": %.6g, \"overshoot_median\": %.4g, "
                        "\"overshoot_max\": %.4g, \"overshoot_raw_median\": %.4g, "
                        "\"overshoot_raw_max\": %.4g, \"overshoot_max_nats\": %.4g}",
                        h ? ", " : "", (long long)h, r->q_min, r->q_med, r->q_max, r->k_max,
                        r->k_radius, r->vmax, r->c, r->gate, r->gate_centered, r->bound_med,
                        r->bound_max, r->bound_raw_med, r->bound_raw_max, r->fallback_centered,
                        r->fallback_raw, r->over_med, r->over_max, r->over_raw_med, r->over_raw_max,
                        r->over_max * 0.6931471805599453);
    }
    printf("]}\n");
}

int fxt_cmd_check(int argc, char **argv)
{
    check_opts o;
    fxt_opt opts[FXT_MAX_OPTS];
    fxt_check_opts_defaults(&o);
    fxt_check_opts_table(&o, opts);
    fxa_layout layout;
    fxt_inputs in;
    int code = fxt_parse_options("check", argc, argv, 2, opts);
    if (code)
        return code;
    if (!o.q || !o.k)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "check needs -q Q.npy -k K.npy [-v V.npy]");
    if (!isnan(o.scale) && !(o.scale > 0.0))
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--scale must be positive, not %g", o.scale);
    if (fxt_parse_layout(o.layout, &layout))
        return FXT_EXIT_BAD_INPUT;
    if ((code = fxt_inputs_load(o.q, o.k, o.v, layout, o.dtype, &in)))
        return code;
    in.d.scale = isnan(o.scale) ? 1.0 / sqrt((double)in.d.head_dim) : o.scale;
    const size_t rows = (size_t)(in.d.batch * in.d.heads_q * in.d.seq_q);
    const size_t n = (size_t)(in.d.batch * in.d.seq_q);
    float *bound_c = malloc(rows * sizeof(float));
    float *bound_r = malloc(rows * sizeof(float));
    uint8_t *fb_c = malloc(rows);
    uint8_t *fb_r = malloc(rows);
    double *scratch = malloc((3 * n + 2 * SAMPLE_ROWS * (size_t)in.d.batch) * sizeof(double));
    head_report *hr = calloc((size_t)in.d.heads_q, sizeof *hr);
    float *q = fxt_inputs_widen(&in, 'q');
    float *k = fxt_inputs_widen(&in, 'k');
    float *v = fxt_inputs_widen(&in, 'v');
    if (!bound_c || !bound_r || !fb_c || !fb_r || !scratch || !hr || !q || !k || !v) {
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory");
        goto out;
    }
    if ((code = bound_pass(&in, 1, (int)o.threads, bound_c, fb_c)) ||
        (code = bound_pass(&in, 0, (int)o.threads, bound_r, fb_r)))
        goto out;
    double share_c = 0.0;
    double share_r = 0.0;
    for (int64_t h = 0; h < in.d.heads_q; h++) {
        report_head(&in, q, k, v, bound_c, bound_r, fb_c, fb_r, h, scratch, &hr[h]);
        share_c += hr[h].fallback_centered / (double)in.d.heads_q;
        share_r += hr[h].fallback_raw / (double)in.d.heads_q;
    }
    if (o.json)
        print_json(&in.d, hr, o.v != NULL, share_c, share_r);
    else
        print_text(&in.d, hr, o.v != NULL, share_c, share_r);
out:
    free(bound_c);
    free(bound_r);
    free(fb_c);
    free(fb_r);
    free(scratch);
    free(hr);
    free(q);
    free(k);
    free(v);
    fxt_inputs_free(&in);
    return code;
}
