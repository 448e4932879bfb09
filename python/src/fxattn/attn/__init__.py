"""The attention operator on one process (libfxattn): its public entries
and everything between them and the C call.

    interface     fxattn.attention, the entry for numpy arrays and torch tensors
    sdpa          fxattn.scaled_dot_product_attention, torch's SDPA call
    varlen        fxattn.varlen_attention, packed variable-length sequences
    bound_report  fxattn.check: does the fixed-max bound suit these inputs?
    options       the Options bundle of one call; what compute="auto" runs
    inputs        q, k, v and a mask as the C API takes them (Inputs, Mask)
    masks         torch's causal biases, SDPA's masks, the operator's masks
    run           the forward and the backward on caller memory; the numpy path
    torch_op      torch.ops.fxattn.attention and attention_backward, autograd
"""

from .bound_report import CheckReport, check
from .interface import attention
from .sdpa import scaled_dot_product_attention
from .varlen import varlen_attention

__all__ = ["CheckReport", "attention", "check", "scaled_dot_product_attention", "varlen_attention"]
