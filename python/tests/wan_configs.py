"""Tiny WanTransformer3DModel configs (built offline, a few thousand
parameters) shared by the diffusers tests."""

LAYERS = 2

T2V = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=12,
    in_channels=4,
    out_channels=4,
    text_dim=16,
    freq_dim=8,
    ffn_dim=32,
    num_layers=LAYERS,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=32,
)
# Wan2.1-I2V's config has image_dim 1280 (CLIP) and added_kv_proj_dim = the
# inner dim (5120); here image_dim 8 and added_kv_proj_dim = 2 x 12.
I2V = dict(T2V, image_dim=8, added_kv_proj_dim=24)
