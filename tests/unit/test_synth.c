/*
 * test_synth: checks of the Wan2.2-like synthetic inputs (tools/common/synth_wan.h):
 * argument checks, determinism per seed, finite outputs, the RMSNorm association order,
 * the normalised row norm, the RoPE band split, and RoPE's identity at the origin and its
 * preservation of norms and same-position dot products. Exit status 0 and "ok N checks"
 * on success; each failure is printed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synth_wan.h"

static int n_checks, n_failed;

static void check(int ok, const char *what)
{
    n_checks++;
    if (!ok) {
        n_failed++;
        fprintf(stderr, "FAIL: %s\n", what);
    }
}

/* Test-local inputs: 64-bit LCG, top 24 bits to a float in [-1, 1). */
static uint64_t lcg_state = 12345;

static float rnd(void)
{
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(lcg_state >> 40) * 0x1p-23f - 1.0f;
}

static size_t tensor_len(const fxt_wan_synth *p)
{
    return (size_t)p->frames * (size_t)p->height * (size_t)p->width * (size_t)p->heads *
           (size_t)p->head_dim;
}

static int all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

static void test_args(void)
{
    fxt_wan_synth p;
    float buf[1];
    fxt_wan_synth_defaults(&p);
    check(p.frames * p.height * p.width == 4096 && p.heads == 40 && p.head_dim == 128,
          "defaults are 4096 tokens, 40 heads, head_dim 128");
    fxt_wan_synth bad = p;
    bad.head_dim = 127;
    check(fxt_wan_synth_qkv(&bad, buf, buf, buf) == FXA_ERR_INVALID_ARG, "odd head_dim refused");
    bad.head_dim = 4;
    check(fxt_wan_synth_qkv(&bad, buf, buf, buf) == FXA_ERR_INVALID_ARG, "head_dim 4 refused");
    bad = p;
    bad.frames = 0;
    check(fxt_wan_synth_qkv(&bad, buf, buf, buf) == FXA_ERR_INVALID_ARG, "zero frames refused");
    bad = p;
    bad.heads = -1;
    check(fxt_wan_synth_qkv(&bad, buf, buf, buf) == FXA_ERR_INVALID_ARG, "negative heads refused");
    check(fxt_wan_synth_qkv(&p, NULL, buf, buf) == FXA_ERR_INVALID_ARG, "NULL q refused");
}

static void test_determinism(void)
{
    fxt_wan_synth p = {.frames = 2, .height = 6, .width = 5, .heads = 4, .head_dim = 32, .seed = 7};
    size_t n = tensor_len(&p);
    float *a = malloc(6 * n * sizeof(float));
    if (!a) {
        check(0, "allocation");
        return;
    }
    float *b = a + 3 * n;
    check(fxt_wan_synth_qkv(&p, a, a + n, a + 2 * n) == FXA_OK, "synth runs (seed 7)");
    check(fxt_wan_synth_qkv(&p, b, b + n, b + 2 * n) == FXA_OK, "synth runs again (seed 7)");
    check(memcmp(a, b, 3 * n * sizeof(float)) == 0, "same seed gives identical bits");
    check(all_finite(a, 3 * n), "q, k, v finite");
    float vmax = 0.0f;
    for (size_t i = 0; i < n; i++)
        vmax = fmaxf(vmax, fabsf(a[2 * n + i]));
    check(vmax > 0.0f && vmax < 10.0f, "0 < max |v| < 10");
    p.seed = 8;
    check(fxt_wan_synth_qkv(&p, b, b + n, b + 2 * n) == FXA_OK, "synth runs (seed 8)");
    for (int t = 0; t < 3; t++)
        check(memcmp(a + (size_t)t * n, b + (size_t)t * n, n * sizeof(float)) != 0,
              "different seed gives different q, k and v");
    free(a);
}

static void test_rmsnorm(void)
{
    enum { N = 40 * 128 };
    static float x[N], g[N], y[N], ref[N], one[N];
    for (int i = 0; i < N; i++) {
        x[i] = 3.0f * rnd() + 0.5f;
        g[i] = expf(rnd());
        one[i] = 1.0f;
    }
    fxt_rmsnorm_row(x, g, N, 1e-6f, y);
    double acc = 0.0;
    for (int i = 0; i < N; i++)
        acc += (double)x[i] * (double)x[i];
    float r = 1.0f / sqrtf((float)(acc / N) + 1e-6f);
    int same = 1, other_order_differs = 0;
    for (int i = 0; i < N; i++) {
        ref[i] = x[i] * (r * g[i]);
        same &= memcmp(&ref[i], &y[i], sizeof(float)) == 0;
        other_order_differs |= (x[i] * r) * g[i] != ref[i];
    }
    check(same, "rmsnorm is x * (r * gamma) bit for bit");
    check(other_order_differs, "(x * r) * gamma differs from x * (r * gamma) somewhere");

    fxt_rmsnorm_row(x, x, N, 1e-6f, ref);
    memcpy(y, x, sizeof x);
    fxt_rmsnorm_row(y, x, N, 1e-6f, y);
    check(memcmp(y, ref, sizeof y) == 0, "rmsnorm in place equals out of place");

    fxt_rmsnorm_row(x, one, N, 1e-6f, y);
    double ss = 0.0;
    for (int i = 0; i < N; i++)
        ss += (double)y[i] * (double)y[i];
    check(fabs(sqrt(ss) / sqrt((double)N) - 1.0) < 1e-3, "unit-gain row norm is sqrt(n)");
}

static double dot(const float *a, const float *b, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += (double)a[i] * (double)b[i];
    return s;
}

static void test_rope(void)
{
    int t, h, w;
    fxt_wan_rope_bands(128, &t, &h, &w);
    check(t == 22 && h == 21 && w == 21, "bands of head_dim 128 are 22/21/21 pairs");
    fxt_wan_rope_bands(6, &t, &h, &w);
    check(t == 1 && h == 1 && w == 1, "bands of head_dim 6 are 1/1/1 pairs");

    enum { D = 128 };
    float q[D], k[D], q0[D], k0[D];
    for (int i = 0; i < D; i++) {
        q0[i] = 4.0f * rnd();
        k0[i] = 4.0f * rnd() + 1.0f;
    }
    memcpy(q, q0, sizeof q);
    fxt_wan_rope_apply(q, D, 0, 0, 0);
    int ident = 1;
    for (int i = 0; i < D; i++)
        ident &= q[i] == q0[i];
    check(ident, "rope at (0,0,0) is the identity");

    static const int pos[][3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}, {3, 17, 29}, {20, 59, 104}};
    for (size_t p = 0; p < sizeof pos / sizeof pos[0]; p++) {
        memcpy(q, q0, sizeof q);
        memcpy(k, k0, sizeof k);
        fxt_wan_rope_apply(q, D, pos[p][0], pos[p][1], pos[p][2]);
        fxt_wan_rope_apply(k, D, pos[p][0], pos[p][1], pos[p][2]);
        double nq0 = sqrt(dot(q0, q0, D)), nk0 = sqrt(dot(k0, k0, D));
        check(fabs(sqrt(dot(q, q, D)) / nq0 - 1.0) < 1e-5, "rope preserves the norm");
        check(fabs(dot(q, k, D) - dot(q0, k0, D)) < 1e-4 * nq0 * nk0,
              "rope at one position preserves q.k (relative to |q||k|)");
        check(memcmp(q, q0, sizeof q) != 0, "rope away from the origin changes the vector");
    }
}

int main(void)
{
    test_args();
    test_determinism();
    test_rmsnorm();
    test_rope();
    if (n_failed) {
        printf("FAILED %d of %d checks\n", n_failed, n_checks);
        return 1;
    }
    printf("ok %d checks\n", n_checks);
    return 0;
}
