"""The backward of fxattn.mpi.attention for torch tensors that require grad.

A torch.autograd.Function, not a torch.library custom operator as
torch.ops.fxattn.attention is: the call is collective over an mpi4py
communicator and runs on a libfxattn_mpi handle, and an operator's schema
carries only tensors and scalars; a collective call must also run exactly
once per call on every rank, which a traced or re-run operator would not
guarantee. The forward saves this rank's q, k, v shards, its output as
returned (rounded to the output dtype, as fxattn.attention's backward takes
it), its lse and its rows' softmax state (lse_parts, from which the backward
rebuilds the forward's P at any score magnitude); the backward runs
fxa_mpi_attn_bwd_run on the forward's
handle in the forward's compute
(collective: every rank's backward must run, as autograd does when every
rank calls backward on a loss that uses the output).
"""

from __future__ import annotations

import ctypes

import torch

from .. import _capi
from .._capi.mpi import mpi


class Saved:
    """What the backward of one call needs: the forward's handle (its
    communicator and grid), the lock that guards the handles, its context,
    the global descriptor, the layout and whether lse was returned (then
    its gradient enters the backward); until the autograd node keeps them,
    this rank's contiguous q, k, v shards, the output and the lse, as
    returned, and the rows' lse_parts (flat, the library's row order)."""

    def __init__(self, handle, lock, ctx, desc, qkv, out, lse, parts, layout: str, return_lse: bool):
        self.handle, self.lock, self.ctx, self.layout, self.return_lse = handle, lock, ctx, layout, return_lse
        self.desc = _capi.AttnDesc.from_buffer_copy(desc)
        self.qkv, self.out, self.lse, self.parts = qkv, out, lse, parts
        self.outputs = None

    def backward(self, saved, g_out, g_lse):
        """Collective: (dq, dk, dv) of this rank's shards in q's, k's, v's
        dtypes, in the forward's compute; saved: (q, k, v, out, lse, parts) as the
        node kept them (out in its own dtype: D = dO . O on the rounded
        output, as fxattn.attention's backward). g_lse (the lse output's
        gradient, None: not returned) enters as fxattn's single-process
        backward takes it: q, k, v get a zero
        feature, O gets -g_lse and dO gets 1, so that D = dO . O becomes
        dO . O - g_lse and dS = P (dO . v - D) carries g_lse P exactly."""
        q, k, v, out, lse, parts = saved
        d = _capi.AttnDesc.from_buffer_copy(self.desc)
        out = out.to(torch.float32).contiguous()  # exact: the descriptor's fp32 O
        dout = torch.zeros_like(out) if g_out is None else g_out.to(torch.float32).contiguous()
        dim = d.head_dim
        if g_lse is not None:
            d.scale = d.scale or dim**-0.5  # the scale of the unpadded head_dim
            d.head_dim = dim + 1
            g = g_lse.to(torch.float32)
            g = (g if self.layout == "bhsd" else g.transpose(1, 2)).unsqueeze(-1)
            q, k, v = (torch.nn.functional.pad(t, (0, 1)).contiguous() for t in (q, k, v))
            out = torch.cat([out, -g], -1).contiguous()
            dout = torch.cat([dout, torch.ones_like(g)], -1).contiguous()
        lse = lse.contiguous()
        grads = [torch.empty(t.shape, dtype=torch.float32) for t in (q, k, v)]
        with self.lock, self.ctx.lock:
            h = self.handle
            if not h.handle:
                raise _capi.InvalidArgumentError(
                    "fxattn.mpi.attention's backward after fxattn.mpi.release() of its communicator",
                    _capi.INVALID_ARG,
                )
            plan = h.plan(d, backward=True)
            args = _capi.new(
                _capi.AttnBwdArgs,
                q=q.data_ptr(),
                k=k.data_ptr(),
                v=v.data_ptr(),
                out=out.data_ptr(),
                dout=dout.data_ptr(),
                lse=lse.data_ptr(),
                dq=grads[0].data_ptr(),
                dk=grads[1].data_ptr(),
                dv=grads[2].data_ptr(),
                lse_parts=parts.data_ptr(),
            )
            status = mpi.fxa_mpi_attn_bwd_run(plan, ctypes.byref(args), None)
            _capi.raise_status(status, h.last_error())
        if g_lse is not None:
            grads = [t[..., :dim] for t in grads]
        return tuple(t.to(x.dtype) for t, x in zip(grads, saved[:3]))


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, state: Saved):
        ctx.state = state
        # through save_for_backward: an in-place change before the backward raises; the
        # inputs themselves (no copies) for a double backward's error (_FirstOrder)
        ctx.save_for_backward(*state.qkv, state.out, state.lse, state.parts, q, k, v)
        state.qkv = state.out = state.lse = state.parts = None
        out, lse = state.outputs
        state.outputs = None
        return out, lse

    @staticmethod
    def backward(ctx, g_out, g_lse):
        state = ctx.state
        saved = ctx.saved_tensors
        grads = state.backward(saved[:6], g_out, g_lse if state.return_lse else None)
        if torch.is_grad_enabled():  # create_graph=True: a backward of these gradients raises
            grads = _FirstOrder.apply(*saved[6:], *grads)
        return (*grads, None)


class _FirstOrder(torch.autograd.Function):
    """(dq, dk, dv) as they are, recorded over q, k, v with a backward that
    raises: fxattn has no second-order gradients."""

    @staticmethod
    def forward(ctx, q, k, v, dq, dk, dv):
        return dq.clone(), dk.clone(), dv.clone()

    @staticmethod
    def backward(ctx, *grads):
        from ..attn.torch_op import second_order_error

        raise second_order_error()


def record(q, k, v, out, lse, state: Saved):
    """(out, lse) as outputs of an autograd node over q, k, v whose
    backward is state.backward."""
    state.outputs = (out, lse)
    return _Attention.apply(q, k, v, state)
