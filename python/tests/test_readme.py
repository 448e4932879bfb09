"""The README's Python examples run as written: numpy and torch in this
process, diffusers with from_pretrained building a tiny random model from a
config (no hub access), and the mpirun one under `mpirun -np 4`."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

README = Path(__file__).resolve().parents[2] / "README.md"


def examples():
    text = README.read_text()
    section = text[text.index("\n## Python\n") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 4, "numpy, torch, diffusers and mpirun examples"
    return dict(zip(("numpy", "torch", "diffusers", "mpirun"), blocks))


def test_numpy_example():
    scope = {}
    exec(examples()["numpy"], scope)
    out, lse, q = scope["out"], scope["lse"], scope["q"]
    assert out.shape == q.shape and out.dtype == np.float32 and lse.shape == (1, 40, 4096)


def test_torch_example():
    scope = {}
    exec(examples()["torch"], scope)  # asserts the compiled result itself
    assert scope["out"].dtype == torch.bfloat16 and scope["out"].shape == (1, 40, 4096, 128)


def test_diffusers_example(monkeypatch):
    from diffusers import WanTransformer3DModel

    import fxattn.diffusers

    def tiny(cls, *args, **kwargs):
        return cls(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=4,
            out_channels=4,
            text_dim=16,
            freq_dim=8,
            ffn_dim=32,
            num_layers=1,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            rope_max_seq_len=32,
        )

    monkeypatch.setattr(WanTransformer3DModel, "from_pretrained", classmethod(tiny))
    scope = {}
    exec(examples()["diffusers"], scope)
    procs = scope["transformer"].attn_processors.values()
    assert procs and all(isinstance(p, fxattn.diffusers.WanAttnProcessor) for p in procs)


def test_mpirun_example(tmp_path):
    script = tmp_path / "example.py"
    # Each rank reports its shard in its own file (lines that ranks print on
    # the shared stdout can interleave mid-line).
    report = f"\nopen({str(tmp_path)!r} + f'/shard{{MPI.COMM_WORLD.rank}}', 'w').write(str(out.shape))\n"
    script.write_text(examples()["mpirun"] + report)
    mpirun = os.environ.get("MPIRUN") or shutil.which("mpirun")
    assert mpirun, "mpirun not found"
    cmd = [
        "timeout",
        "-k",
        "5",
        "300",
        mpirun,
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        "4",
        "-x",
        "PYTHONPATH",
        "-x",
        "FXATTN_LIBRARY_PATH",
        sys.executable,
        str(script),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    shapes = [(tmp_path / f"shard{r}").read_text() if (tmp_path / f"shard{r}").exists() else None for r in range(4)]
    assert shapes == ["(1, 1024, 40, 128)"] * 4, run.stdout
