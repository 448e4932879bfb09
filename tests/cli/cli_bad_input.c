/*
 * B. Bad input and bad usage: exit status 2, an "fxattn: error: " line on
 * stderr, and the output folder exactly as before the run, each case with
 * and without old output files in place (cli_fail.h).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli_fail.h"
#include "cli_harness.h"
#include "cli_npy.h"
#include "cli_tests.h"
#include "fxattn.h"

/* The broken, hostile and mismatched input files of the B cases, in in/. */
static void make_bad_files(void)
{
    static float buf[2 * NQ + 16];

    /* Non-finite values. */
    memcpy(buf, g_q, sizeof g_q);
    buf[5 * PD + 3] = NAN;
    write_f32(IN("q_nan.npy"), 4, g_qshape, buf);
    memcpy(buf, g_k, sizeof g_k);
    buf[7 * PD + 1] = INFINITY;
    write_f32(IN("k_inf.npy"), 4, g_kvshape, buf);
    memcpy(buf, g_v, sizeof g_v);
    buf[NKV - 2] = -INFINITY;
    write_f32(IN("v_ninf.npy"), 4, g_kvshape, buf);
    {
        static uint16_t q16[NQ];
        for (size_t i = 0; i < NQ; i++)
            q16[i] = fxa_f32_to_f16(g_q[i]);
        q16[11] = 0x7e00; /* f16 NaN */
        write_f16(IN("q_f16_nan.npy"), 4, g_qshape, q16, NQ);
    }
    /* Too large for f16. */
    memcpy(buf, g_q, sizeof g_q);
    buf[3] = 1e6f;
    write_f32(IN("q_big.npy"), 4, g_qshape, buf);

    /* Shapes. */
    {
        const int64_t s3[3] = {PSQ, PHQ, PD};
        const int64_t v52[4] = {PB, PSKV - 1, PHKV, PD};
        const int64_t q_b2[4] = {2, PSQ, PHQ, PD};
        const int64_t q_d8[4] = {PB, PSQ, PHQ, 8};
        const int64_t q_h3[4] = {PB, PSQ, 3, PD};
        const int64_t q_s0[4] = {PB, 0, PHQ, PD};
        const int64_t k_s0[4] = {PB, 0, PHKV, PD};
        const int64_t k_d0[4] = {PB, PSKV, PHKV, 0};
        const int64_t q_d0[4] = {PB, PSQ, PHQ, 0};
        memset(buf, 0, sizeof buf);
        memcpy(buf, g_q, sizeof g_q);
        memcpy(buf + NQ, g_q, sizeof g_q);
        write_f32(IN("q_3d.npy"), 3, s3, buf);
        write_f32(IN("v_short.npy"), 4, v52, g_v);
        write_f32(IN("q_b2.npy"), 4, q_b2, buf);
        write_f32(IN("q_d8.npy"), 4, q_d8, buf);
        write_f32(IN("q_h3.npy"), 4, q_h3, buf);
        write_f32(IN("q_s0.npy"), 4, q_s0, buf);
        write_f32(IN("k_s0.npy"), 4, k_s0, buf);
        write_f32(IN("v_s0.npy"), 4, k_s0, buf);
        write_f32(IN("q_d0.npy"), 4, q_d0, buf);
        write_f32(IN("k_d0.npy"), 4, k_d0, buf);
        write_f32(IN("v_d0.npy"), 4, k_d0, buf);
    }

    /* Broken files. */
    {
        const int64_t lies[4] = {PB, PSQ, 2 * PHQ, PD};
        const int64_t flat[1] = {(int64_t)NQ};
        static double q64[NQ];
        static int32_t qi[NQ];
        static uint32_t qbe[NQ];
        for (size_t i = 0; i < NQ; i++) {
            uint32_t u;
            q64[i] = g_q[i];
            qi[i] = (int32_t)lrint(g_q[i] * 100.0f);
            memcpy(&u, &g_q[i], 4);
            qbe[i] = __builtin_bswap32(u);
        }
        write_npy(IN("q_trunc.npy"), 1, "<f4", 0, 4, g_qshape, g_q, sizeof g_q - 100);
        write_npy(IN("q_trunc_hdr.npy"), 1, "<f4", 0, 4, g_qshape, g_q, 0);
        write_npy(IN("q_lies.npy"), 1, "<f4", 0, 4, lies, g_q, sizeof g_q);
        memcpy(buf, g_q, sizeof g_q);
        write_npy(IN("q_trail.npy"), 1, "<f4", 0, 4, g_qshape, buf, sizeof g_q + 4);
        write_npy(IN("q_fortran.npy"), 1, "<f4", 1, 4, g_qshape, g_q, sizeof g_q);
        write_npy(IN("q_be.npy"), 1, ">f4", 0, 4, g_qshape, qbe, sizeof qbe);
        write_npy(IN("q_f8.npy"), 1, "<f8", 0, 4, g_qshape, q64, sizeof q64);
        write_npy(IN("q_i4.npy"), 1, "<i4", 0, 4, g_qshape, qi, sizeof qi);
        write_npy(IN("q_1d.npy"), 1, "<f4", 0, 1, flat, g_q, sizeof g_q);
        static const char text[] = "this is not a .npy file, just some text\n";
        write_bytes(IN("q_text.npy"), text, sizeof text - 1);
        write_bytes(IN("q_empty.npy"), "", 0);
        /* Only the first 9 bytes of a valid header. */
        write_npy(IN("q_tmp.npy"), 1, "<f4", 0, 4, g_qshape, g_q, sizeof g_q);
        size_t n;
        unsigned char *b = read_bytes(IN("q_tmp.npy"), &n);
        if (!b)
            die("cannot read back q_tmp.npy");
        write_bytes(IN("q_preamble.npy"), b, 9);
        free(b);
        if (mkdir(IN("q_dir.npy"), 0755) != 0)
            die("mkdir q_dir.npy: %s", strerror(errno));
    }
}

void test_bad_input(void)
{
    const char *q = IN("q.npy");
    const char *k = IN("k.npy");
    const char *v = IN("v.npy");
    make_bad_files();

    /* Non-finite values: the message names the tensor. */
    BAD("B1 NaN in Q", "Q", ATTN3(IN("q_nan.npy"), k, v));
    BAD("B2 +Inf in K", "K", ATTN3(q, IN("k_inf.npy"), v));
    BAD("B3 -Inf in V", "V", ATTN3(q, k, IN("v_ninf.npy")));
    BAD("B4 NaN in a <f2 Q", "Q", ATTN3(IN("q_f16_nan.npy"), IN("k_f16.npy"), IN("v_f16.npy")));
    BAD("B5 NaN in Q, --mode online", "Q", ATTN3(IN("q_nan.npy"), k, v), "--mode", "online");
    BAD("B6 +Inf in K, check", "K", "check", "-q", q, "-k", IN("k_inf.npy"), "-v", v);

    /* Shapes. */
    BAD("B7 Q is 3-D", "Q", ATTN3(IN("q_3d.npy"), k, v));
    BAD("B8 K and V shapes differ", NULL, ATTN3(q, k, IN("v_short.npy")));
    BAD("B9 batch differs (Q 2, K 1)", NULL, ATTN3(IN("q_b2.npy"), k, v));
    BAD("B10 head dim differs (Q 8, K 16)", NULL, ATTN3(IN("q_d8.npy"), k, v));
    BAD("B11 Hq=3 not a multiple of Hkv=2", NULL, ATTN3(IN("q_h3.npy"), k, v));
    BAD("B12 zero-size Sq", NULL, ATTN3(IN("q_s0.npy"), k, v));
    BAD("B13 zero-size Skv", NULL, ATTN3(q, IN("k_s0.npy"), IN("v_s0.npy")));
    BAD("B14 zero-size head dim", NULL, ATTN3(IN("q_d0.npy"), IN("k_d0.npy"), IN("v_d0.npy")));
    BAD("B15 bshd files with --layout bhsd", NULL, ATTN3(q, k, v), "--layout", "bhsd");
    BAD("B16 Q is 1-D", "Q", ATTN3(IN("q_1d.npy"), k, v));

    /* Broken or unsupported files: the message names the file (B17-B28: as Q). */
    static const char *const broken_q[][2] = {
        {"B17 truncated data", "q_trunc.npy"},
        {"B18 header only, no data", "q_trunc_hdr.npy"},
        {"B19 header declares a bigger shape", "q_lies.npy"},
        {"B20 trailing bytes", "q_trail.npy"},
        {"B21 Fortran order", "q_fortran.npy"},
        {"B22 big-endian >f4", "q_be.npy"},
        {"B23 dtype <f8", "q_f8.npy"},
        {"B24 dtype <i4", "q_i4.npy"},
        {"B25 not a .npy file", "q_text.npy"},
        {"B26 empty file", "q_empty.npy"},
        {"B27 truncated preamble", "q_preamble.npy"},
        {"B28 missing file", "q_missing.npy"},
    };
    for (size_t i = 0; i < sizeof broken_q / sizeof broken_q[0]; i++)
        BAD(broken_q[i][0], broken_q[i][1], ATTN3(IN(broken_q[i][1]), k, v));
    BAD("B29 missing K file", "k_missing.npy", ATTN3(q, IN("k_missing.npy"), v));
    BAD("B30 a folder as input", "q_dir.npy", ATTN3(IN("q_dir.npy"), k, v));
    BAD("B31 truncated V (bad file last)", "q_trunc.npy", ATTN3(q, k, IN("q_trunc.npy")));

    /* dtypes. */
    BAD("B32 mixed <f2 Q and <f4 K/V without --dtype", NULL, ATTN3(IN("q_f16.npy"), k, v));
    BAD("B33 1e6 in Q with --dtype f16", "Q", ATTN3(IN("q_big.npy"), k, v), "--dtype", "f16");

    /* Options: the message names the option (B36-B46: a bad value). */
    BAD("B34 unknown option", "--bogus", ATTN3(q, k, v), "--bogus");
    BAD("B35 missing value (-q at the end)", "-q", "attn", "-k", k, "-v", v, "-o", g_out, "--lse",
        g_lse, "-q");
    static const char *const bad_values[][3] = {
        {"B36 --threads -1", "--threads", "-1"},
        {"B37 --threads abc", "--threads", "abc"},
        {"B38 --scale 0", "--scale", "0"},
        {"B39 --scale 1e999", "--scale", "1e999"},
        {"B40 --scale nan", "--scale", "nan"},
        {"B41 --scale inf", "--scale", "inf"},
        {"B42 --mode fast", "--mode", "fast"},
        {"B43 --center maybe", "--center", "maybe"},
        {"B44 --layout xyz", "--layout", "xyz"},
        {"B45 --dtype f64", "--dtype", "f64"},
        {"B46 --block-q 99999", "--block-q", "99999"},
    };
    for (size_t i = 0; i < sizeof bad_values / sizeof bad_values[0]; i++)
        BAD(bad_values[i][0], bad_values[i][1], ATTN3(q, k, v), bad_values[i][1], bad_values[i][2]);
    BAD("B47 missing -o", "-o", "attn", "-q", q, "-k", k, "-v", v, "--lse", g_lse);
    BAD("B48 missing -v", "-v", "attn", "-q", q, "-k", k, "-o", g_out, "--lse", g_lse);
    BAD("B49 unknown command", "frobnicate", "frobnicate", "-q", q, "-o", g_out);
    BAD("B50 no command at all", NULL, (const char *)NULL);
    BAD("B51 check: missing -k", NULL, "check", "-q", q);
    BAD("B52 check: --layout xyz", "--layout", "check", "-q", q, "-k", k, "--layout", "xyz");
}
