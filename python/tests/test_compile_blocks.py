"""diffusers' regional compilation, transformer.compile_repeated_blocks(
fullgraph=True), of a tiny WanTransformer3DModel whose attention runs in
fxattn, both ways: fxattn.diffusers.WanAttnProcessor (under compilation it
traces its per-op path, the fxattn::attention custom operator) and
diffusers' own processor on the "fxattn" attention backend. fullgraph=True
raises on any graph break; every WanTransformerBlock is compiled (each
module's compiled call set), and the backend below records every graph
dynamo captures, so the test also sees that fxattn's operator is in each
(not a fallback to eager). The
compiled model's output equals the eager model's: bit for bit on the
backend (the same operator calls), within fp32 rounding (FP32_TOL) with
the processor, whose eager self-attentions run the fused layer.

Backend: dynamo's capture (where graph breaks are decided) and AOT
autograd's tracing, then the captured graph run as traced (aot_eager's
split); inductor's code generation would add a minute on 2 cores and
decides nothing about graph breaks."""

import pytest
import torch
from diffusers import WanTransformer3DModel
from diffusers.models.transformers.transformer_wan import WanAttnProcessor as DefaultProcessor
from test_diffusers import FP32_TOL, LAYERS, inputs, model, rel

import fxattn.diffusers as fd
from fxattn.integrations.diffusers import processor


def recording_backend(graphs):
    """A torch.compile backend that appends each captured FX graph to
    graphs, then runs it with aot_eager."""
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    return backend


def fxattn_ops(gm) -> int:
    """How many fxattn custom-operator calls the FX graph holds."""
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and "fxattn" in str(n.target))


def eager_and_compiled(setup):
    """The eager output of a fresh tiny T2V model prepared by setup(m), and
    the output of the same model after compile_repeated_blocks(fullgraph=True),
    with the graphs captured."""
    assert "WanTransformerBlock" in WanTransformer3DModel._repeated_blocks
    m, args = model(False), inputs(False)
    setup(m)
    with torch.no_grad():
        eager = m(**args).sample.float()
    torch._dynamo.reset()
    graphs = []
    m.compile_repeated_blocks(fullgraph=True, backend=recording_backend(graphs))
    assert len(m.blocks) == LAYERS and all(b._compiled_call_impl is not None for b in m.blocks)
    with torch.no_grad():
        compiled = m(**args).sample.float()
    return eager, compiled, graphs


def test_processor_compiles_per_block():
    p = fd.WanAttnProcessor(threads=2)
    eager, compiled, graphs = eager_and_compiled(lambda m: m.set_attn_processor(p))
    # The eager model ran the fused layer on its self-attentions (where it is
    # the default); compiled, the blocks trace the per-op path (no fused
    # call while tracing or running).
    assert p.fused_calls == (LAYERS if processor._FUSED_AUTO else 0)
    # Each captured block graph holds a self- and a cross-attention call of
    # fxattn's operator.
    assert len(graphs) >= 1 and all(fxattn_ops(g) == 2 for g in graphs), [fxattn_ops(g) for g in graphs]
    assert rel(compiled, eager) < FP32_TOL
    # and diffusers' own processor, eager, within the same rounding.
    m = model(False)
    m.set_attn_processor(DefaultProcessor())
    with torch.no_grad():
        native = m(**inputs(False)).sample.float()
    assert rel(compiled, native) < FP32_TOL


def test_backend_compiles_per_block():
    eager, compiled, graphs = eager_and_compiled(lambda m: m.set_attention_backend("fxattn"))
    assert len(graphs) >= 1 and all(fxattn_ops(g) == 2 for g in graphs), [fxattn_ops(g) for g in graphs]
    assert rel(compiled, eager) == 0.0  # the same operator calls as eager: bit-identical


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_graph_break_fails(monkeypatch):
    """The check can fail: a graph break in the processor's traced path
    makes compile_repeated_blocks(fullgraph=True)'s first call raise."""
    per_op = fd.WanAttnProcessor._per_op

    def broken(self, *args):
        torch._dynamo.graph_break()
        return per_op(self, *args)

    monkeypatch.setattr(fd.WanAttnProcessor, "_per_op", broken)
    with pytest.raises(torch._dynamo.exc.Unsupported, match="graph_break"):
        eager_and_compiled(lambda m: m.set_attn_processor(fd.WanAttnProcessor(threads=2)))
