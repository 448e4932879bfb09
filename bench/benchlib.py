"""Pieces the benchmark scripts share (bench/peers.py, python_attention.py,
python_sdpa.py, python_wan.py, python_diffusers.py, long_seq.py; each
imports this file from its own folder)."""

import os
import platform


def cpu_name():
    """The CPU's model name from /proc/cpuinfo (else what platform knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def fxattn_cli():
    """The fxattn CLI next to the imported fxattn package: the wheel's
    (fxattn/bin/fxattn), else a build tree's (FXATTN_LIBRARY_PATH=build/lib
    gives build/fxattn)."""
    from pathlib import Path

    import fxattn

    cli = Path(fxattn.__file__).parent / "bin" / "fxattn"
    if not cli.exists():
        cli = Path(os.environ["FXATTN_LIBRARY_PATH"]).parent / "fxattn"
    return cli


def peak_gflops(threads, kind):
    """The machine's peak GFLOP/s on `threads` threads from `fxattn bench`'s
    throughput probe: kind "fp32" the FMA peak, "bf16" the peak of the units
    fxattn's bf16 compute runs on (AMX tdpbf16ps, else vdpbf16ps; 0 where
    the CPU has neither)."""
    import json
    import subprocess

    args = [str(fxattn_cli()), "bench", "--seq", "256", "--heads", "1", "--repeats", "1", "--json", "--threads", str(threads)]
    if kind == "bf16":
        args += ["--dtype", "bf16", "--compute", "bf16"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return next(r["peak_gflops"] for r in rows if "peak_gflops" in r)


def ort_mha_session(batch, seq, heads, head_dim, threads, spin=False):
    """An ONNX Runtime CPU InferenceSession of com.microsoft MultiHeadAttention on fp32
    q, k, v [batch, seq, heads head_dim] (output "o"), on `threads` intra-op
    threads, sequential, its workers spinning only when `spin`. Needs onnx
    and onnxruntime (ImportError otherwise)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def vi(n):
        return helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, seq, heads * head_dim])

    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"], domain="com.microsoft", num_heads=heads)
    graph = helper.make_graph([node], "mha", [vi("q"), vi("k"), vi("v")], [vi("o")])
    model = helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if not spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _git_head(root):
    """The tree's short HEAD, with "+dirty" when tracked files differ from it
    (None outside a git checkout)."""
    import subprocess

    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--"], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.returncode == 1 else "")


def build_compiler(build_dir):
    """The C compiler and build type CMake recorded in build_dir ("GNU 12.2.0,
    Release"), or None when build_dir holds no CMake tree."""
    import glob
    import re

    found = sorted(glob.glob(os.path.join(str(build_dir), "CMakeFiles", "*", "CMakeCCompiler.cmake")))
    if not found:
        return None
    text = open(found[-1]).read()
    ident = re.search(r'CMAKE_C_COMPILER_ID "([^"]*)"', text)
    ver = re.search(r'CMAKE_C_COMPILER_VERSION "([^"]*)"', text)
    out = " ".join(m.group(1) for m in (ident, ver) if m)
    try:
        cache = open(os.path.join(str(build_dir), "CMakeCache.txt")).read()
        bt = re.search(r"^CMAKE_BUILD_TYPE:STRING=(.*)$", cache, re.M)
        if bt and bt.group(1):
            out += ", " + bt.group(1)
    except OSError:
        pass
    return out or None


def identity(machine, build_dir, versions):
    """The fields every JSON line of a benchmark carries (bench/README.md,
    "Raw results"): machine, cpu, compiler, versions, commit, command, date.
    machine: the results page's name (bench/results/<machine>.md); versions:
    {library: version} of what the run used."""
    import datetime
    import shlex
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {
        "machine": machine,
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "compiler": build_compiler(build_dir),
        "versions": dict(sorted({"python": platform.python_version(), **versions}.items())),
        "commit": _git_head(root),
        "command": shlex.join([os.path.relpath(sys.argv[0], root) if sys.argv[0].startswith(root) else sys.argv[0], *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
    }


def append_jsonl(path, records):
    """Appends each record as one JSON line to path ("-": stdout)."""
    import json
    import sys

    lines = "".join(json.dumps(r, sort_keys=False) + "\n" for r in records)
    if path == "-":
        sys.stdout.write(lines)
        sys.stdout.flush()
    else:
        with open(path, "a") as f:
            f.write(lines)


def _status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def cold_peak_rss_mib(call):
    """The growth of the peak resident set (VmHWM) over the resident set
    (VmRSS) while call() runs once, in MiB; the peak is reset first where
    /proc/self/clear_refs allows it. The result is dropped before returning."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident set
    except OSError:
        pass
    rss0 = _status_kib("VmRSS")
    out = call()
    del out
    return (_status_kib("VmHWM") - rss0) / 1024.0
