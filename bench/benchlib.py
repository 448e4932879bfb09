"""Pieces the benchmark scripts share (bench/peers.py, python_attention.py,
python_wan.py; each imports this file from its own folder)."""

import platform


def cpu_name():
    """The CPU's model name from /proc/cpuinfo (else what platform knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def ort_mha_session(batch, seq, heads, head_dim, threads, spin=False):
    """An ONNX Runtime CPU session of com.microsoft MultiHeadAttention on fp32
    q, k, v [batch, seq, heads head_dim] (output "o"), on `threads` intra-op
    threads, sequential, its workers spinning only when `spin`. Needs onnx
    and onnxruntime (ImportError otherwise)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def vi(n):
        return helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, seq, heads * head_dim])

    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"], domain="com.microsoft", num_heads=heads)
    graph = helper.make_graph([node], "mha", [vi("q"), vi("k"), vi("v")], [vi("o")])
    model = helper.make_model(graph, ir_version=8,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
