"""fxattn.check: the report equals `fxattn check --json` on the same files
(both come from fxa_attn_check; the CLI prints 4-6 significant digits, so
floats are compared to that precision and integers exactly), takes strided
torch views, and plots to a PNG, also from the CLI's JSON."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fxattn


def cli():
    wheel = Path(fxattn.__file__).parent / "bin" / "fxattn"
    return wheel if wheel.exists() else Path(os.environ["FXATTN_LIBRARY_PATH"]).parent / "fxattn"


def data(seed=0):
    rng = np.random.default_rng(seed)
    q = (3 * rng.standard_normal((2, 90, 4, 32))).astype(np.float32)
    k = (3 * rng.standard_normal((2, 110, 2, 32))).astype(np.float32)
    v = rng.standard_normal((2, 110, 2, 32)).astype(np.float32)
    q[:, :, 1] *= 4  # a hot head: rows past the strict gate
    return q, k, v


def cli_report(tmp_path, q, k, v=None, extra=()):
    args = [str(cli()), "check", "--json"]
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t is not None:
            np.save(tmp_path / f"{name}.npy", t)
            args += [f"-{name}", str(tmp_path / f"{name}.npy")]
    out = subprocess.run(args + list(extra), capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def same(a, b, path="report"):
    if isinstance(a, dict):
        assert set(a) <= set(b), path
        for key in a:
            same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, bool) or isinstance(a, int) and isinstance(b, int):
        assert a == b, path
    else:
        assert b == pytest.approx(a, rel=2e-4, abs=1e-4), path


def test_report_equals_the_cli(tmp_path):
    q, k, v = data()
    report = fxattn.check(q, k, v, scale=0.2)
    want = cli_report(tmp_path, q, k, v, ["--scale", "0.2"])
    same(want, report.to_dict())
    hot = report.heads[1]
    assert hot["fallback_share_raw"] > 0 and hot["bound_max"] > hot["gate"]
    assert all(h["overshoot_max"] >= h["overshoot_median"] >= 0 for h in report.heads)
    assert report.fallback_share_centered <= report.fallback_share_raw


def test_without_v_takes_vmax_as_one(tmp_path):
    q, k, _ = data(1)
    report = fxattn.check(q, k)
    assert not report.to_dict()["has_v"] and all(h["vmax"] == 1.0 for h in report.heads)
    same(cli_report(tmp_path, q, k), report.to_dict())  # the CLI without -v passes no V too


def test_torch_views_and_bhsd_give_the_same_report():
    q, k, v = data(2)
    a = fxattn.check(q, k, v).to_dict()
    tq, tk, tv = (torch.from_numpy(t).transpose(1, 2) for t in (q, k, v))  # BHSD views, no copy
    b = fxattn.check(tq, tk, tv, layout="bhsd").to_dict()
    assert a == b  # the library's results do not depend on strides, bit for bit


def test_errors():
    q, k, v = data(3)
    with pytest.raises(ValueError, match="non-finite"):
        fxattn.check(q, k * np.inf, v)
    with pytest.raises(ValueError, match="sample_rows"):
        fxattn.check(q, k, v, sample_rows=0)


def is_png(path):
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_plot_from_report_and_from_cli_json(tmp_path):
    q, k, v = data(4)
    fxattn.check(q, k, v).plot(tmp_path / "a.png")
    assert is_png(tmp_path / "a.png")
    (tmp_path / "r.json").write_text(json.dumps(cli_report(tmp_path, q, k, v)))
    run = subprocess.run([sys.executable, "-m", "fxattn.plot", str(tmp_path / "r.json"), "-o", str(tmp_path / "b.png")])
    assert run.returncode == 0 and is_png(tmp_path / "b.png")
    (tmp_path / "bad.json").write_text("[1, 2]")
    bad = subprocess.run(
        [sys.executable, "-m", "fxattn.plot", str(tmp_path / "bad.json"), "-o", str(tmp_path / "c.png")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "fxattn: error:" in bad.stderr and not (tmp_path / "c.png").exists()
