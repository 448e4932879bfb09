/*
 * A. Good runs of `fxattn attn`, `check` and `help`: values against the fp64
 * reference, shapes, the --stats and `check --json` objects, layouts, modes,
 * dtypes, .npy versions, and that a successful run replaces an existing
 * output.
 */
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli_fail.h"
#include "cli_harness.h"
#include "cli_json.h"
#include "cli_npy.h"
#include "cli_tests.h"
#include "fp64_attn.h"
#include "testutil.h"

#define REF_TOL 1e-5

/* Bytes of the outputs of the first good run (A1): what later runs on the
 * same inputs must reproduce. */
static unsigned char *g_run_out;
static size_t g_run_out_len;
static unsigned char *g_run_lse;
static size_t g_run_lse_len;

/* out (and lse when lse_path) against the fp64 reference of q, k, v (the
 * fp32 values the kernels saw), within REF_TOL absolute. */
static void check_ref(const char *label, const fxa_attn_desc *d, const float *q, const float *k,
                      const float *v, const char *out_path, const char *lse_path)
{
    const int bshd = d->layout == FXA_LAYOUT_BSHD;
    const int64_t oshape[4] = {d->batch, bshd ? d->seq_q : d->heads_q, bshd ? d->heads_q : d->seq_q,
                               d->head_dim};
    const int64_t lshape[3] = {d->batch, d->heads_q, d->seq_q};
    fxa_npy o = {0};
    fxa_npy l = {0};
    double ref[FXA_MAX_HEAD_DIM];
    double ref_lse;
    double max_out = 0.0;
    double max_lse = 0.0;
    if (!read_output(label, out_path, 4, oshape, &o))
        return;
    const int have_lse = lse_path && read_output(label, lse_path, 3, lshape, &l);
    const float *out = o.data;
    const float *lse = l.data;
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < d->heads_q; h++)
            for (int64_t i = 0; i < d->seq_q; i++) {
                fxt_fp64_attn_row(d, q, k, v, b, h, i, ref, &ref_lse);
                const int64_t off = fxt_row_offset(d, d->heads_q, d->seq_q, b, h, i);
                for (int64_t c = 0; c < d->head_dim; c++) {
                    const double e = fabs((double)out[off + c] - ref[c]);
                    if (!(e <= max_out))
                        max_out = e; /* NaN sticks */
                }
                if (have_lse) {
                    const int64_t li = (b * d->heads_q + h) * d->seq_q + i;
                    const double e = fabs((double)lse[li] - ref_lse);
                    if (!(e <= max_lse))
                        max_lse = e;
                }
            }
    CHECK(max_out <= REF_TOL, "[%s] max |out - fp64 reference| = %.3g, above %.0e", label, max_out,
          REF_TOL);
    if (have_lse)
        CHECK(max_lse <= REF_TOL, "[%s] max |lse - fp64 reference| = %.3g, above %.0e", label,
              max_lse, REF_TOL);
    fxa_npy_free(&o);
    fxa_npy_free(&l);
}

/* The --stats line: one JSON object with every key CLI.md promises. */
static void check_stats(const char *label, const char *out, const char *mode, const char *center,
                        double fallback_rows)
{
    size_t where;
    static const char *const numeric[] = {"rows", "fallback_rows", "C",       "gate",
                                          "vmax", "max_bound",     "seconds", "gflops"};
    CHECK(json_one_object_line(out, &where),
          "[%s] --stats: stdout is not exactly one JSON object on one line (problem at offset "
          "%zu): %s",
          label, where, out);
    for (size_t i = 0; i < sizeof numeric / sizeof numeric[0]; i++)
        CHECK(json_is_number(out, numeric[i]), "[%s] --stats: no numeric \"%s\" in %s", label,
              numeric[i], out);
    CHECK(json_number_is(out, "rows", (double)(PB * PHQ * PSQ)),
          "[%s] --stats: \"rows\" is not %d: %s", label, PB * PHQ * PSQ, out);
    CHECK(strstr(out, "\"rows\": 148") != NULL, "[%s] --stats: no \"rows\": 148 in %s", label, out);
    CHECK(json_string_is(out, "mode", mode), "[%s] --stats: \"mode\" is not \"%s\": %s", label,
          mode, out);
    CHECK(json_string_is(out, "center", center), "[%s] --stats: \"center\" is not \"%s\": %s",
          label, center, out);
    if (fallback_rows >= 0)
        CHECK(json_number_is(out, "fallback_rows", fallback_rows),
              "[%s] --stats: \"fallback_rows\" is not %.0f: %s", label, fallback_rows, out);
}

/* No "*.tmp.*" entry in dir. */
static void check_no_tmp(const char *label, const char *dir)
{
    DIR *dp = opendir(dir);
    struct dirent *e;
    CHECK(dp != NULL, "[%s] cannot list %s", label, dir);
    if (!dp)
        return;
    while ((e = readdir(dp)) != NULL)
        CHECK(strstr(e->d_name, ".tmp.") == NULL, "[%s] temporary file left behind: %s/%s", label,
              dir, e->d_name);
    closedir(dp);
}

/* Input files and the values the kernels see in them. */
typedef struct attn_inputs {
    const char *q, *k, *v;     /* .npy files */
    const float *qv, *kv, *vv; /* their values, rounded as the run's dtype rounds them */
} attn_inputs;

/* `attn -q -k -v (in's files) -o out [--lse lse] EXTRA...` (extra may be
 * NULL); when it succeeds, out (and lse) against the fp64 reference of d on
 * in's values. 1 on success; r holds the run. */
static int attn_ref_run(const char *label, run_result *r, const fxa_attn_desc *d,
                        const attn_inputs *in, const char *out, const char *lse,
                        const char *const *extra)
{
    const char *args[MAX_ARGS + 1] = {"attn", "-q", in->q, "-k", in->k, "-v", in->v, "-o", out};
    int n = 9;
    if (lse) {
        args[n++] = "--lse";
        args[n++] = lse;
    }
    for (; extra && *extra; extra++) {
        if (n == MAX_ARGS)
            die("too many arguments");
        args[n++] = *extra;
    }
    args[n] = NULL;
    const int ok = run_ok(label, r, args);
    if (ok)
        check_ref(label, d, in->qv, in->kv, in->vv, out, lse);
    return ok;
}

static void transpose_bshd_to_bhsd(const float *src, float *dst, int64_t b_, int64_t s_, int64_t h_,
                                   int64_t d_)
{
    for (int64_t b = 0; b < b_; b++)
        for (int64_t s = 0; s < s_; s++)
            for (int64_t h = 0; h < h_; h++)
                for (int64_t c = 0; c < d_; c++)
                    dst[((b * h_ + h) * s_ + s) * d_ + c] = src[((b * s_ + s) * h_ + h) * d_ + c];
}

/* bits: the f16 encodings of src; rounded: the values they encode. */
static void f16_round(const float *src, uint16_t *bits, float *rounded, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        bits[i] = fxa_f32_to_f16(src[i]);
        rounded[i] = fxa_f16_to_f32(bits[i]);
    }
}

/* dst: src rounded to bf16 (RNE). */
static void bf16_round(const float *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = fxa_bf16_to_f32(fxa_f32_to_bf16(src[i]));
}

/* A1b: a good run on (Q, K/2, V): its files are the "old output files" of
 * the failure cases, different from what any run on (Q, K, V) makes. */
static void make_old_files(const fxa_attn_desc *d)
{
    static float k_half[NKV];
    const char *o = join(g_out_dir, "out_old.npy");
    const char *l = join(g_out_dir, "lse_old.npy");
    unsigned char *old_out = NULL;
    unsigned char *old_lse = NULL;
    size_t out_len = 0, lse_len = 0;
    run_result r;
    for (size_t i = 0; i < NKV; i++)
        k_half[i] = 0.5f * g_k[i];
    write_f32(IN("k_half.npy"), 4, g_kvshape, k_half);
    const attn_inputs in = {IN("q.npy"), IN("k_half.npy"), IN("v.npy"), g_q, k_half, g_v};
    if (attn_ref_run("A1b attn on K/2", &r, d, &in, o, l, NULL)) {
        old_out = read_bytes(o, &out_len);
        old_lse = read_bytes(l, &lse_len);
    }
    run_free(&r);
    CHECK(!old_out || !g_run_out || out_len != g_run_out_len ||
              memcmp(old_out, g_run_out, g_run_out_len) != 0,
          "[A1b attn on K/2] gives the same output file as A1: the old-file checks would be "
          "blind");
    fail_set_old_files(old_out, out_len, old_lse, lse_len);
}

/* A2: --layout bhsd on transposed files: the transposed output of A1, bit
 * for bit, and its LSE. */
static void test_layout_bhsd(void)
{
    static float qt[NQ], kt[NKV], vt[NKV];
    const int64_t qs[4] = {PB, PHQ, PSQ, PD};
    const int64_t ks[4] = {PB, PHKV, PSKV, PD};
    const int64_t lshape[3] = {PB, PHQ, PSQ};
    const char *out_b = join(g_out_dir, "out_bhsd.npy");
    const char *lse_b = join(g_out_dir, "lse_bhsd.npy");
    fxa_attn_desc db;
    run_result r;
    fxt_attn_desc(&db, PB, PHQ, PHKV, PSQ, PSKV, PD);
    db.layout = FXA_LAYOUT_BHSD;
    transpose_bshd_to_bhsd(g_q, qt, PB, PSQ, PHQ, PD);
    transpose_bshd_to_bhsd(g_k, kt, PB, PSKV, PHKV, PD);
    transpose_bshd_to_bhsd(g_v, vt, PB, PSKV, PHKV, PD);
    write_f32(IN("q_bhsd.npy"), 4, qs, qt);
    write_f32(IN("k_bhsd.npy"), 4, ks, kt);
    write_f32(IN("v_bhsd.npy"), 4, ks, vt);
    const attn_inputs in = {IN("q_bhsd.npy"), IN("k_bhsd.npy"), IN("v_bhsd.npy"), qt, kt, vt};
    if (attn_ref_run("A2 --layout bhsd", &r, &db, &in, out_b, lse_b,
                     ARGV("--layout", "bhsd", "--threads", "2"))) {
        fxa_npy ob = {0};
        fxa_npy os = {0};
        fxa_npy lb = {0};
        fxa_npy ls = {0};
        if (read_output("A2 --layout bhsd", out_b, 4, qs, &ob) &&
            read_output("A2 (bshd output of A1)", g_out, 4, g_qshape, &os)) {
            static float expect[NQ];
            transpose_bshd_to_bhsd(os.data, expect, PB, PSQ, PHQ, PD);
            size_t diff = 0;
            for (size_t i = 0; i < NQ; i++)
                diff += memcmp(&expect[i], (const float *)ob.data + i, sizeof(float)) != 0;
            CHECK(diff == 0,
                  "[A2 --layout bhsd] %zu of %zu output values differ (bitwise) from the "
                  "transposed bshd output",
                  diff, NQ);
        }
        if (read_output("A2 --layout bhsd", lse_b, 3, lshape, &lb) &&
            read_output("A2 (bshd lse of A1)", g_lse, 3, lshape, &ls))
            CHECK(memcmp(lb.data, ls.data, (size_t)PB * PHQ * PSQ * sizeof(float)) == 0,
                  "[A2 --layout bhsd] lse differs (bitwise) from the bshd run's lse");
        fxa_npy_free(&ob);
        fxa_npy_free(&os);
        fxa_npy_free(&lb);
        fxa_npy_free(&ls);
    }
    run_free(&r);
}

/* A5: '<f2' files run as f16; A6: --dtype bf16 on '<f4' files; A7: mixed
 * file dtypes with --dtype f32. */
static void test_dtypes(const fxa_attn_desc *d)
{
    static uint16_t q16[NQ], k16[NKV], v16[NKV];
    static float qh[NQ], kh[NKV], vh[NKV];
    static float qb[NQ], kb[NKV], vb[NKV];
    run_result r;
    f16_round(g_q, q16, qh, NQ);
    f16_round(g_k, k16, kh, NKV);
    f16_round(g_v, v16, vh, NKV);
    write_f16(IN("q_f16.npy"), 4, g_qshape, q16, NQ);
    write_f16(IN("k_f16.npy"), 4, g_kvshape, k16, NKV);
    write_f16(IN("v_f16.npy"), 4, g_kvshape, v16, NKV);
    const attn_inputs f16 = {IN("q_f16.npy"), IN("k_f16.npy"), IN("v_f16.npy"), qh, kh, vh};
    if (attn_ref_run("A5 <f2 inputs", &r, d, &f16, join(g_out_dir, "out_f16.npy"),
                     join(g_out_dir, "lse_f16.npy"), ARGV("--stats"))) {
        check_stats("A5 <f2 inputs", r.out, "auto", "on", -1);
        CHECK(json_string_is(r.out, "dtype", "f16"),
              "[A5 <f2 inputs] --stats does not say \"dtype\": \"f16\" (CLI.md: <f2 inputs "
              "imply f16): %s",
              r.out);
    }
    run_free(&r);

    bf16_round(g_q, qb, NQ);
    bf16_round(g_k, kb, NKV);
    bf16_round(g_v, vb, NKV);
    const attn_inputs bf16 = {IN("q.npy"), IN("k.npy"), IN("v.npy"), qb, kb, vb};
    if (attn_ref_run("A6 --dtype bf16", &r, d, &bf16, join(g_out_dir, "out_bf16.npy"), NULL,
                     ARGV("--dtype", "bf16", "--stats")))
        CHECK(json_string_is(r.out, "dtype", "bf16"),
              "[A6 --dtype bf16] --stats does not say \"dtype\": \"bf16\": %s", r.out);
    run_free(&r);

    const attn_inputs mixed = {IN("q_f16.npy"), IN("k.npy"), IN("v.npy"), qh, g_k, g_v};
    attn_ref_run("A7 mixed <f2/<f4 files with --dtype f32", &r, d, &mixed,
                 join(g_out_dir, "out_mixed.npy"), NULL, ARGV("--dtype", "f32"));
    run_free(&r);

    /* Any finite scale, negative too, against the fp64 reference at that scale. */
    fxa_attn_desc neg = *d;
    neg.scale = -0.3;
    const attn_inputs f32 = {IN("q.npy"), IN("k.npy"), IN("v.npy"), g_q, g_k, g_v};
    attn_ref_run("A7b --scale -0.3", &r, &neg, &f32, join(g_out_dir, "out_neg.npy"),
                 join(g_out_dir, "lse_neg.npy"), ARGV("--scale", "-0.3"));
    run_free(&r);
}

/* A8: .npy versions 2.0 and 3.0 give the same bytes as version 1.0 (A1);
 * A9: --verify prints "max abs err". */
static void test_npy_versions_and_verify(void)
{
    const char *o = join(g_out_dir, "out_v23.npy");
    run_result r;
    write_npy(IN("q_v2.npy"), 2, "<f4", 0, 4, g_qshape, g_q, sizeof g_q);
    write_npy(IN("k_v3.npy"), 3, "<f4", 0, 4, g_kvshape, g_k, sizeof g_k);
    if (run_ok("A8 .npy 2.0/3.0 inputs", NULL,
               ARGV("attn", "-q", IN("q_v2.npy"), "-k", IN("k_v3.npy"), "-v", IN("v.npy"), "-o", o,
                    "--threads", "2")))
        CHECK(file_holds(o, g_run_out, g_run_out_len),
              "[A8 .npy 2.0/3.0 inputs] output differs from the version 1.0 run (A1)");

    if (run_ok("A9 --verify", &r,
               ARGV("attn", "-q", IN("q.npy"), "-k", IN("k.npy"), "-v", IN("v.npy"), "-o",
                    join(g_out_dir, "out_verify.npy"), "--verify")))
        CHECK(strstr(r.out, "max abs err") != NULL,
              "[A9 --verify] stdout has no \"max abs err\": %s", r.out);
    run_free(&r);
}

/* A10: an existing output is replaced by a successful run. */
static void test_replaces_outputs(void)
{
    static const char stale[] = "stale output from an older run\n";
    clear_dir(g_out_dir);
    write_bytes(g_out, stale, sizeof stale - 1);
    write_bytes(g_lse, stale, sizeof stale - 1);
    if (run_ok("A10 replaces existing files", NULL,
               ARGV(ATTN3(IN("q.npy"), IN("k.npy"), IN("v.npy")), "--threads", "2"))) {
        CHECK(file_holds(g_out, g_run_out, g_run_out_len),
              "[A10 replaces existing files] out.npy was not replaced by the new output "
              "(expected %zu bytes)",
              g_run_out_len);
        CHECK(file_holds(g_lse, g_run_lse, g_run_lse_len),
              "[A10 replaces existing files] lse.npy was not replaced by the new output");
        check_no_tmp("A10", g_out_dir);
    }
    clear_dir(g_out_dir);
}

/* A11: check --json; A12: check without -v; A13: help. None writes a file. */
static void test_check_and_help(void)
{
    const char *q = IN("q.npy");
    const char *k = IN("k.npy");
    run_result r;
    if (run_ok("A11 check --json", &r,
               ARGV("check", "-q", q, "-k", k, "-v", IN("v.npy"), "--json"))) {
        size_t where;
        CHECK(json_one_object_line(r.out, &where),
              "[A11 check --json] stdout is not one JSON object on one line (problem at offset "
              "%zu): %s",
              where, r.out);
        const char *heads = json_field(r.out, "heads");
        CHECK(heads && heads[0] == '[', "[A11 check --json] no \"heads\": [ in %s", r.out);
        CHECK(strstr(r.out, "\"heads\": [") != NULL, "[A11 check --json] no \"heads\": [ in %s",
              r.out);
        CHECK(json_is_number(r.out, "fallback_share_centered"),
              "[A11 check --json] no numeric \"fallback_share_centered\" in %s", r.out);
        CHECK(json_number_is(r.out, "heads_q", PHQ) || json_field(r.out, "heads_q") == NULL,
              "[A11 check --json] \"heads_q\" is not %d: %s", PHQ, r.out);
    }
    run_free(&r);
    if (run_ok("A12 check without -v", &r, ARGV("check", "-q", q, "-k", k)))
        CHECK(r.out[0] != 0, "[A12 check without -v] printed nothing on stdout");
    run_free(&r);
    if (run_ok("A13 help", &r, ARGV("help")))
        CHECK(strstr(r.out, "usage") != NULL && strstr(r.out, "attn") != NULL,
              "[A13 help] stdout has no usage text: %s", r.out);
    run_free(&r);
    CHECK(!file_exists(g_out) && !file_exists(g_lse),
          "[A11..A13] check/help wrote files into the output folder");
}

void test_good_runs(void)
{
    const attn_inputs in = {IN("q.npy"), IN("k.npy"), IN("v.npy"), g_q, g_k, g_v};
    fxa_attn_desc d;
    run_result r;
    fxt_attn_desc(&d, PB, PHQ, PHKV, PSQ, PSKV, PD);

    /* A1: the main run, GQA, with --lse --stats --threads 2. */
    clear_dir(g_out_dir);
    if (attn_ref_run("A1 attn --lse --stats", &r, &d, &in, g_out, g_lse,
                     ARGV("--stats", "--threads", "2"))) {
        check_stats("A1 attn --lse --stats", r.out, "auto", "on", -1);
        check_no_tmp("A1", g_out_dir);
        g_run_out = read_bytes(g_out, &g_run_out_len);
        g_run_lse = read_bytes(g_lse, &g_run_lse_len);
    }
    run_free(&r);
    make_old_files(&d);
    test_layout_bhsd();

    /* A3: --mode online; A4: --center off. */
    if (attn_ref_run("A3 --mode online", &r, &d, &in, join(g_out_dir, "out_online.npy"),
                     join(g_out_dir, "lse_online.npy"), ARGV("--mode", "online", "--stats")))
        check_stats("A3 --mode online", r.out, "online", "on", (double)(PB * PHQ * PSQ));
    run_free(&r);
    if (attn_ref_run("A4 --center off", &r, &d, &in, join(g_out_dir, "out_nocenter.npy"),
                     join(g_out_dir, "lse_nocenter.npy"), ARGV("--center", "off", "--stats")))
        check_stats("A4 --center off", r.out, "auto", "off", -1);
    run_free(&r);

    test_dtypes(&d);
    test_npy_versions_and_verify();
    check_no_tmp("A2..A9", g_out_dir);
    test_replaces_outputs();
    test_check_and_help();
    free(g_run_out);
    free(g_run_lse);
}
