/*
 * Embedding fxattn: load a Wan2.2 checkpoint and run its self-attention
 * layer on x, through the installed libraries (libfxattn_wan, libfxattn_io).
 *
 *     wan_layer CHECKPOINT BLOCK HEADS F,H,W X.npy Y.npy
 *
 * CHECKPOINT is what fxa_wan_weights_load reads; X.npy is x [S, hidden]
 * ('<f4', S = F * H * W tokens of the latent grid); Y.npy gets y. Build it
 * with CMake (examples/CMakeLists.txt: find_package(fxattn CONFIG)) or with
 * pkg-config:
 *     cc wan_layer.c $(pkg-config --cflags --libs fxattn_wan fxattn_io)
 */
#include <stdio.h>
#include <stdlib.h>

#include "fxattn.h"
#include "fxattn_npy.h"
#include "fxattn_wan.h"

static int fail(const char *what, const char *msg)
{
    fprintf(stderr, "wan_layer: %s: %s\n", what, msg);
    return 1;
}

int main(int argc, char **argv)
{
    char err[700];
    long long f, h, w;
    if (argc != 7 || sscanf(argv[4], "%lld,%lld,%lld", &f, &h, &w) != 3)
        return fail("usage", "wan_layer CHECKPOINT BLOCK HEADS F,H,W X.npy Y.npy");

    fxa_wan_load_params lp;
    fxa_wan_load_params_init(&lp);
    lp.block = atoll(argv[2]);
    lp.heads = atoll(argv[3]);
    fxa_wan_weights weights;
    if (fxa_wan_weights_load(argv[1], &lp, &weights, err, sizeof err) != FXA_OK)
        return fail("weights", err);

    fxa_npy x;
    if (fxa_npy_read(argv[5], &x, err, sizeof err) != FXA_OK)
        return fail("x", err);
    const int64_t tokens = f * h * w;
    if (x.dtype != FXA_F32 || x.ndim != 2 || x.shape[0] != tokens || x.shape[1] != weights.hidden)
        return fail("x", "must be '<f4' [F*H*W, hidden]");

    fxa_ctx *ctx = NULL;
    if (fxa_ctx_create(NULL, &ctx) != FXA_OK)
        return fail("context", fxa_ctx_create_error());
    fxa_wan_desc d;
    fxa_wan_desc_init(&d);
    d.frames = f;
    d.height = h;
    d.width = w;
    d.heads = weights.heads;
    d.head_dim = weights.head_dim;
    fxa_wan_plan *plan = NULL;
    size_t bytes = 0;
    if (fxa_wan_plan_create(ctx, &d, &plan, &bytes) != FXA_OK)
        return fail("plan", fxa_ctx_last_error(ctx));

    void *workspace = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    float *y = malloc((size_t)(tokens * weights.hidden) * sizeof(float));
    fxa_wan_stats stats = {.struct_size = sizeof stats};
    if (!workspace || !y)
        return fail("memory", "out of memory");
    const fxa_wan_args args = {
        .struct_size = sizeof args, .weights = &weights, .x = x.data, .y = y};
    if (fxa_wan_layer_run(plan, &args, workspace, &stats) != FXA_OK)
        return fail("run", fxa_ctx_last_error(ctx));

    fxa_staged out;
    const int64_t shape[2] = {tokens, weights.hidden};
    if (fxa_npy_stage_f32(argv[6], 2, shape, y, &out, err, sizeof err) != FXA_OK ||
        fxa_staged_commit(&out, err, sizeof err) != FXA_OK)
        return fail("y", err);
    printf("wan_layer: %lld tokens, hidden %lld, %lld heads: %.3f s (%lld of %lld attention "
           "rows on online softmax)\n",
           (long long)tokens, (long long)weights.hidden, (long long)weights.heads,
           stats.qkv_seconds + stats.attention_seconds + stats.out_seconds,
           (long long)stats.fallback_rows, (long long)stats.rows);

    free(y);
    free(workspace);
    fxa_wan_plan_destroy(plan);
    fxa_ctx_destroy(ctx);
    fxa_npy_free(&x);
    fxa_wan_weights_free(&weights);
    return 0;
}
