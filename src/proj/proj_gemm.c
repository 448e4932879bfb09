/* The QKV projection's GEMM: the workspace layout, the choice of backend
 * (OpenBLAS, oneDNN, AMX tiles) and the blockwise multiply. */
#include <cblas.h>
#include <pthread.h>
#include <string.h>

#include "../base/alloc.h"
#include "../base/cpu.h"
#include "../core/ctx_api.h"
#include "gemm_amx.h"
#include "proj_internal.h"

/* Bytes of decoded weight per block. Each block's GEMM reads all of x
 * again, so blocks must be wide: at S = 4096, H = 5120 (FP8 operands, bf16
 * GEMM, 2 threads) 4 MiB blocks cost 1.07x the bf16 time, 16 MiB 1.004x,
 * 32 MiB 0.97-1.00x, the whole weight 1.004x. */
#define W_BLOCK_BYTES ((size_t)32 << 20)

static int64_t w_block_rows(const fxa_proj_desc *d, size_t elem)
{
    int64_t rows = (int64_t)(W_BLOCK_BYTES / ((size_t)d->in_features * elem)) / 64 * 64;
    if (rows < 64)
        rows = 64;
    return rows < fxa_proj_out_features(d) ? rows : fxa_proj_out_features(d);
}

static size_t take(size_t *at, size_t bytes)
{
    const size_t here = *at;
    *at += fxa_align_up(bytes);
    return here;
}

/* The automatic choice, made once per process: the CPU and the loaded
 * OpenBLAS do not change. */
static int g_auto_onednn;
static pthread_once_t g_auto_once = PTHREAD_ONCE_INIT;

static void decide_auto(void)
{
    static const char *const avx512_cores[] = {"skylakex", "cooperlake", "sapphirerapids"};
    const char *core = openblas_get_corename();
    char lower[32] = "";
    for (size_t i = 0; core && core[i] && i + 1 < sizeof lower; i++)
        lower[i] = (char)(core[i] >= 'A' && core[i] <= 'Z' ? core[i] - 'A' + 'a' : core[i]);
    int known = 0;
    for (size_t i = 0; i < sizeof avx512_cores / sizeof avx512_cores[0]; i++)
        known |= strstr(lower, avx512_cores[i]) != NULL;
    g_auto_onednn = fxa_cpu_get()->avx512f && !known;
}

/* Whether fp32 GEMMs go to oneDNN's matmul (1), OpenBLAS (0), or neither
 * (-1: FXA_PROJ_GEMM names no backend). force: FXA_PROJ_GEMM as the
 * context read it at its creation. FXA_PROJ_GEMM=openblas|onednn
 * forces one (tests pin OpenBLAS's bytes; benchmarks compare the two);
 * unset or "auto": oneDNN on AVX-512 CPUs when the OpenBLAS loaded at run
 * time picked a kernel set without AVX-512 (a DYNAMIC_ARCH OpenBLAS older
 * than the CPU: 0.3.21 runs its Haswell kernels on Zen 5, 136 GFLOP/s
 * against 255 with its SkylakeX ones and ~235 on oneDNN, S 4096 x 5120 x
 * 15360 on 2 threads), OpenBLAS otherwise. */
static int gemm_f32_on_onednn(const char *force)
{
    if (strcmp(force, "openblas") == 0)
        return 0;
    if (strcmp(force, "onednn") == 0)
        return 1;
    if (*force && strcmp(force, "auto") != 0)
        return -1;
    pthread_once(&g_auto_once, decide_auto);
    return g_auto_onednn;
}

/* *faster = 1 where 16-bit operands multiply faster as bf16 than in fp32: the CPU has
 * AVX512-BF16 (oneDNN has no bf16 matmul without it) and the context's bf16 products run
 * faster than its fp32 ones, as the attention's automatic compute measures them
 * (fxa_ctx_compute_choice: vdpbf16ps on AMD Zen 4 and 5, AMX tiles; not Intel cores whose
 * vdpbf16ps runs at half the FMA rate, where an fp32 GEMM of the same exact products is
 * faster). */
fxa_status fxa_proj_bf16_gemm_faster(fxa_ctx *ctx, int64_t head_dim, int *faster)
{
    *faster = 0;
    if (!fxa_cpu_get()->avx512bf16)
        return FXA_OK;
    fxa_compute_choice c = {.struct_size = sizeof c};
    const fxa_status st = fxa_ctx_compute_choice(ctx, FXA_BF16, head_dim, &c);
    *faster = st == FXA_OK && c.compute == FXA_COMPUTE_BF16;
    return st;
}

/* 16- and 8-bit operands on both sides multiply as bf16 (exact: every E4M3
 * value is a bf16 value), read in place when bf16, decoded when E4M3, where
 * bf16_gemm (bf16_gemm_faster); otherwise the GEMM is fp32, reading fp32 in
 * place and decoding the rest (every bf16 and E4M3 value is an fp32 value:
 * the same products). */
void fxa_proj_ws_layout(const fxa_proj_desc *d, int n_threads, int bf16_gemm, proj_ws *l)
{
    const size_t s = (size_t)d->tokens;
    const size_t x_elems = s * (size_t)d->in_features;
    *l = (proj_ws){0};
    l->bf16_path = d->x_format != FXA_PROJ_X_F32 && d->w_format != FXA_PROJ_W_F32 && bf16_gemm;
    const int decode_w16 = l->bf16_path && d->w_format == FXA_PROJ_W_E4M3;
    const int decode_w32 = !l->bf16_path && d->w_format != FXA_PROJ_W_F32;
    l->w_block = decode_w16   ? w_block_rows(d, sizeof(uint16_t))
                 : decode_w32 ? w_block_rows(d, sizeof(float))
                              : fxa_proj_out_features(d);
    const size_t w_elems = (size_t)l->w_block * (size_t)d->in_features;
    size_t at = FXA_ALIGN; /* offset 0 means "none" */
    if (l->bf16_path && d->x_format == FXA_PROJ_X_E4M3_ROWS)
        l->x16 = take(&at, x_elems * sizeof(uint16_t));
    else if (!l->bf16_path && d->x_format != FXA_PROJ_X_F32)
        l->x32 = take(&at, x_elems * sizeof(float));
    if (decode_w16)
        l->w16 = take(&at, w_elems * sizeof(uint16_t));
    else if (decode_w32)
        l->w32 = take(&at, w_elems * sizeof(float));
    l->xs = take(&at, s * sizeof(float));
    l->y = take(&at, s * (size_t)fxa_proj_out_features(d) * sizeof(float));
    l->sums = take(&at, (2 * s + 1) * sizeof(double));
    l->bad = take(&at, ((s + 15) / 16 + 1) * sizeof(int64_t));
    /* Staging's per-item results (up to every output channel, when the
     * epilogue traces an overflow to a weight) and per-thread rows. */
    const size_t rows = s > (size_t)fxa_proj_out_features(d) ? s : (size_t)fxa_proj_out_features(d);
    l->stage_bad = take(&at, (2 * ((rows + STAGE_ROWS - 1) / STAGE_ROWS) + 2) * sizeof(int64_t));
    l->stage_tmp = take(&at, (size_t)n_threads * (size_t)d->in_features * sizeof(float));
    l->total = at;
}

/* OpenBLAS (0.3.21) has one process-wide thread count and no per-call
 * one. Each fp32 GEMM sets it to the context's threads and restores the
 * host program's setting while holding this lock, so that projections on
 * other threads never take one call's setting for the host's. */
static pthread_mutex_t g_blas_threads_lock = PTHREAD_MUTEX_INITIALIZER;

/* y [m][ldy] = x [m][k] w [n][k]^T on OpenBLAS with n_threads threads. */
static void sgemm_on_threads(int n_threads, int64_t m, int64_t n, int64_t k, const float *x,
                             const float *w, float *y, int64_t ldy)
{
    pthread_mutex_lock(&g_blas_threads_lock);
    const int host_threads = openblas_get_num_threads();
    if (host_threads != n_threads)
        openblas_set_num_threads(n_threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f, x, (int)k, w,
                (int)k, 0.0f, y, (int)ldy);
    if (host_threads != n_threads)
        openblas_set_num_threads(host_threads);
    pthread_mutex_unlock(&g_blas_threads_lock);
}

/* y [S][I] = x W^T, W staged and multiplied l->w_block output channels at
 * a time: on AMX tiles where the plan has their scratch and the block fits
 * (gemm_amx.h: faster than Debian's oneDNN on them), else on oneDNN or
 * OpenBLAS; in a process forked after oneDNN ran, fp32 GEMMs go to
 * OpenBLAS and bf16 ones are refused. */
fxa_status fxa_proj_multiply(const fxa_proj_plan *p, unsigned char *ws, const void *xg,
                             const void *w, float *y, fxa_proj_gemm *gemm)
{
    const fxa_proj_desc *d = &p->d;
    const proj_ws *l = &p->l;
    fxa_ctx *ctx = p->ctx;
    const int64_t n_out = fxa_proj_out_features(d);
    const int64_t k = d->in_features;
    float *w32 = l->w32 ? (float *)(ws + l->w32) : NULL;
    uint16_t *w16 = l->w16 ? (uint16_t *)(ws + l->w16) : NULL;
    const int forked = fxa_gemm_onednn_forked(); /* OpenMP cannot run in this child */
    if (forked && l->bf16_path)
        return fxa_ctx_fail(
            ctx, FXA_ERR_UNSUPPORTED,
            "bf16 projections run on oneDNN (OpenMP), which cannot run in a process "
            "forked after its parent ran oneDNN; start workers with spawn or "
            "forkserver instead of fork");
    const int blas = !l->bf16_path && (!l->f32_onednn || forked);
    *gemm = blas           ? FXA_PROJ_GEMM_OPENBLAS
            : l->bf16_path ? FXA_PROJ_GEMM_ONEDNN_BF16
                           : FXA_PROJ_GEMM_ONEDNN_F32;
    char why[160];
    fxa_status st = FXA_OK;
    for (int64_t n0 = 0; st == FXA_OK && n0 < n_out; n0 += l->w_block) {
        const int64_t nb = n_out - n0 < l->w_block ? n_out - n0 : l->w_block;
        const void *wg = NULL;
        if ((st = fxa_proj_stage_w(p, ws, w, n0, nb, w32, w16, &wg, 0)) != FXA_OK)
            break;
        if (l->amx && fxa_gemm_amx_fits(ctx, k, nb, wg)) {
            fxa_gemm_amx_run(ctx, xg, d->tokens, k, wg, nb, y + n0, n_out, ws + l->amx);
            *gemm = FXA_PROJ_GEMM_AMX;
        } else if (blas)
            sgemm_on_threads(p->n_threads, d->tokens, nb, k, xg, wg, y + n0, n_out);
        else if ((st = fxa_gemm_onednn_run(p->g, xg, wg, nb, y + n0, ws + l->onednn, why,
                                           sizeof why)) != FXA_OK)
            st = fxa_ctx_fail(ctx, st, "%s", why);
    }
    return st;
}

/* The GEMM's backends for d: oneDNN's primitives (with their scratchpad in
 * the workspace) for bf16 GEMMs and fp32 ones on oneDNN, the AMX packing
 * scratch where the `amx` kernel set may take bf16 blocks. */
fxa_status fxa_proj_plan_gemm(fxa_proj_plan *p)
{
    fxa_ctx *ctx = p->ctx;
    proj_ws *l = &p->l;
    const int64_t n_out = fxa_proj_out_features(&p->d);
    const int64_t k = p->d.in_features;
    l->f32_onednn = l->bf16_path ? 0 : gemm_f32_on_onednn(fxa_ctx_proj_gemm(ctx));
    if (l->f32_onednn < 0)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "FXA_PROJ_GEMM=%s: unknown GEMM (choose openblas, onednn or auto)",
                            fxa_ctx_proj_gemm(ctx));
    if (fxa_gemm_onednn_forked()) { /* OpenMP cannot run in this child */
        if (l->bf16_path)
            return fxa_ctx_fail(ctx, FXA_ERR_UNSUPPORTED,
                                "bf16 projections run on oneDNN (OpenMP), which cannot run in a "
                                "process forked after its parent ran oneDNN; start workers with "
                                "spawn or forkserver instead of fork");
        l->f32_onednn = 0;
    }
    size_t at = l->total;
    if (l->bf16_path && fxa_gemm_amx_usable(ctx) && k % 32 == 0)
        l->amx = take(&at, fxa_gemm_amx_scratch_bytes(k, p->n_threads));
    if (l->bf16_path || l->f32_onednn) {
        const int64_t widths[2] = {l->w_block, n_out % l->w_block};
        char why[160];
        const fxa_status st =
            fxa_gemm_onednn_create(&p->g, l->bf16_path ? FXA_BF16 : FXA_F32, p->d.tokens, k, n_out,
                                   p->n_threads, widths, why, sizeof why);
        if (st != FXA_OK)
            return fxa_ctx_fail(ctx, st, "%s", why);
        l->onednn = take(&at, fxa_gemm_onednn_scratch_bytes(p->g));
    }
    l->total = at;
    return FXA_OK;
}
