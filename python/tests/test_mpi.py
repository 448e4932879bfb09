"""fxattn.mpi and fxattn.diffusers.parallelize under mpirun.

Each test launches a script of mpi_scripts/ under
`timeout -k 5 120 mpirun --allow-run-as-root --oversubscribe -np P` with
this interpreter (which must have mpi4py: a missing mpi4py or mpirun fails,
it does not skip) and FXATTN_LIBRARY_PATH / PYTHONPATH passed through; the
scripts compare every rank's shard with one process (their tolerances are
justified in their docstrings) and exit non-zero (MPI_Abort) on the first
mismatch. 1 thread per rank, small sizes: np 2 runs take ~6 s, np 4 ~20 s on
2 cores.
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "mpi_scripts"
SRC = Path(__file__).resolve().parents[1] / "src"


def _mpirun() -> str:
    path = os.environ.get("MPIRUN") or shutil.which("mpirun") or shutil.which("mpiexec")
    if not path:
        for cand in ("/usr/bin/mpirun", "/usr/local/bin/mpirun", "/opt/openmpi/bin/mpirun"):
            if os.access(cand, os.X_OK):
                path = cand
                break
    if not path:
        pytest.fail("mpirun not found (set MPIRUN or put Open MPI's mpirun on PATH)")
    return path


def _require_mpi4py():
    if importlib.util.find_spec("mpi4py") is None:
        pytest.fail(f"mpi4py is not installed in {sys.executable}; `pip install mpi4py` (fxattn[mpi])")


def mpi_command(script: str, np_: int, *args, timeout: int = 120, hosts: str = "") -> tuple[list, dict]:
    """The command line and environment that run mpi_scripts/<script> on np_
    ranks under timeout -k (the installed package, or python/src when the
    caller set PYTHONPATH or nothing is installed).
    hosts: libfxattn_mpi's test-only FXA_MPI_TEST_HOSTS (host labels by rank)."""
    _require_mpi4py()
    env = dict(os.environ)
    env.pop("FXA_MPI_TEST_HOSTS", None)
    if hosts:
        env["FXA_MPI_TEST_HOSTS"] = hosts
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("FXA_MPI_TIMEOUT", "60")
    if importlib.util.find_spec("fxattn") is None or "PYTHONPATH" in env:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    exports = []
    for name in ("FXATTN_LIBRARY_PATH", "PYTHONPATH", "OMP_NUM_THREADS", "FXA_MPI_TIMEOUT", "FXA_MPI_TEST_HOSTS"):
        if name in env:
            exports += ["-x", name]
    cmd = [
        "timeout",
        "-k",
        "5",
        str(timeout),
        _mpirun(),
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        str(np_),
        *exports,
        sys.executable,
        str(SCRIPTS / script),
        *args,
    ]
    return cmd, env


def run_mpi(script: str, np_: int, *args, timeout: int = 120, hosts: str = "") -> subprocess.CompletedProcess:
    """Run mpi_scripts/<script> on np_ ranks and require exit 0; the outer
    timeout -k bounds a hang."""
    cmd, env = mpi_command(script, np_, *args, timeout=timeout, hosts=hosts)
    # a working directory without stray modules that could shadow the stdlib
    proc = subprocess.run(cmd, env=env, cwd=str(SCRIPTS), capture_output=True, text=True, timeout=timeout + 30)
    assert proc.returncode not in (124, 137), f"mpirun hung (timeout):\n{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_mpi4py_present():
    _require_mpi4py()
    from mpi4py import MPI  # noqa: F401


@pytest.mark.parametrize("np_", [2, 4])
def test_attention_grids(np_):
    """Every U x R grid of np_ ranks (np 4: 1x4, 2x2, 4x1): uneven S, GQA/MQA,
    Skv != Sq, both layouts, numpy and torch, fp32/bf16/fp16, strided views,
    an empty shard; LSE too; then the collective errors."""
    out = run_mpi("attn.py", np_).stdout
    # the ranks' lines may run together in mpirun's merged stdout
    ok = re.findall(r"OK rank (\d+) cases (\d+)", out)
    assert sorted(int(r) for r, _ in ok) == list(range(np_)), out
    # 8 cases on every grid: np 2 has 2 grids, np 4 has 3
    assert all(int(n) == 8 * (2 if np_ == 2 else 3) for _, n in ok), out
    for what in (
        "wrong shard length",
        "wrong k/v shard length",
        "dtype on one rank",
        "NaN on one rank",
        "grid",
        "float16 overflow on one rank",
    ):
        assert f"error [{what}]" in out, out
    assert "are not fxattn.mpi.shard's split of their sum" in out, out


@pytest.mark.parametrize("np_", [2, 4])
def test_reproducible_grids(np_):
    """reproducible=True: every U x R grid of np_ ranks returns one process's
    bytes (numpy, torch, GQA, bf16 compute, ranks without tokens); other
    shards and autograd are refused on every rank."""
    out = run_mpi("reproducible.py", np_).stdout
    ok = re.findall(r"OK rank (\d+) cases (\d+)", out)
    assert sorted(int(r) for r, _ in ok) == list(range(np_)), out
    assert all(int(n) == 4 * (2 if np_ == 2 else 3) for _, n in ok), out


@pytest.mark.parametrize("np_", [2, 4])
def test_attention_grad(np_):
    """fxattn.mpi.attention under autograd on every U x R grid of np_ ranks
    (mpi_scripts/grad.py): gradients bit for bit one process's on Ulysses
    grids with whole kv heads, within 1e-5 max|grad| on ring, 2-D and
    replicated-kv-head grids, within test_autograd's fp64 envelope on all;
    GQA, MQA, both layouts, lse's gradient, bf16 inputs in fp32 compute
    (vs fp64 within 2^-6) and in bf16 compute (within 2^-5), one process's
    bytes on Ulysses with whole kv heads; saturated softmax (scale 1e4, 1e6:
    the backward on the forward's lse parts); requires_grad on one rank only
    raises the same error on every rank; a sequence shorter than the ranks
    (empty shards contribute nothing); a double backward raises "fxattn has
    no second-order gradients" on every rank. ~20 s (np 2), ~40 s (np 4)."""
    out = run_mpi("grad.py", np_, timeout=180).stdout
    ok = re.findall(r"OK rank (\d+) cases (\d+)", out)
    assert sorted(int(r) for r, _ in ok) == list(range(np_)), out
    assert all(int(n) == 9 * (2 if np_ == 2 else 3) for _, n in ok), out
    assert "error [grad on one rank] ranks disagree on requires_grad" in out, out
    for r in range(np_):
        assert f"error [double backward] rank {r} fxattn has no second-order gradients" in out, out


def test_attention_hosts_interleaved():
    """Placement by hosts with the ranks of two hosts interleaved (as
    mpirun --map-by node gives; faked by FXA_MPI_TEST_HOSTS=0,1,0,1): every
    grid of 4 ranks still matches one process when each rank shards by
    fxattn.mpi.rank(comm), which puts world ranks 0, 2 (host 0) before 1, 3.
    ~20 s."""
    out = run_mpi("attn.py", 4, hosts="0,1,0,1").stdout
    assert "placement by hosts [0, 1, 0, 1]: grid ranks [0, 2, 1, 3]" in out, out
    ok = re.findall(r"OK rank (\d+) cases (\d+)", out)
    assert sorted(int(r) for r, _ in ok) == list(range(4)), out
    assert "error [placement]" in out, out


def test_shard_matches_c_split():
    """fxattn.mpi.shard is fxa_mpi_shard: contiguous, covering, the first
    n mod size shards one token longer."""
    _require_mpi4py()
    import fxattn
    import fxattn.mpi as fm

    for n in (0, 1, 5, 13, 64, 1001):
        for size in (1, 2, 3, 4, 7):
            pos = 0
            for r in range(size):
                start, length = fm.shard(n, r, size)
                assert start == pos
                assert length == n // size + (1 if r < n % size else 0)
                pos += length
            assert pos == n
    with pytest.raises(fxattn.InvalidArgumentError):
        fm.shard(10, 2, 2)


@pytest.mark.parametrize(
    "np_,ulysses,ring,hosts", [(2, 1, 2, ""), (2, 2, 1, ""), (4, 2, 2, ""), (3, 1, 3, "0,1,0"), (2, "auto", "auto", "")]
)
def test_parallelize_wan(np_, ulysses, ring, hosts):
    """fxattn.diffusers.parallelize on a tiny random WanTransformer3DModel
    (9 tokens, uneven over 2 and 4 ranks) equals one process's forward with
    diffusers' default processor (rtol 1e-4, justified in mpi_scripts/wan.py),
    every rank returns the same output, attn1 sees only the rank's shard,
    and remove() restores the model bit for bit; with hosts (FXA_MPI_TEST_HOSTS)
    the ranks shard and gather by their grid ranks, 0, 2, 1 for "0,1,0";
    grid="auto" runs the planner's grid. ~25 s (np 2), ~50 s (np 4)."""
    out = run_mpi("wan.py", np_, str(ulysses), str(ring), timeout=240, hosts=hosts).stdout
    ok = re.findall(r"OK rank (\d+) err ([0-9.e+-]+) tol ([0-9.e+-]+)", out)
    assert sorted(int(r) for r, _, _ in ok) == list(range(np_)), out
    assert all(float(e) <= float(t) for _, e, t in ok), out


def test_absent_peer_times_out_every_caller():
    """One rank of 3 never calls (it sleeps 600 s): fxattn.mpi.attention's
    agreement and parallelize's token gather, each with timeout=2, raise
    PeerTimeoutError on both calling ranks within the deadline (+ 3 s of
    slack for a loaded machine), and the job ends (rank 0 aborts it) long
    before the sleeper would: the whole run is bounded by timeout -k 60."""
    cmd, env = mpi_command("absent_peer.py", 3, "2", timeout=60)
    proc = subprocess.run(cmd, env=env, cwd=str(SCRIPTS), capture_output=True, text=True, timeout=90)
    out = proc.stdout + proc.stderr
    assert proc.returncode not in (124, 137), f"mpirun hung (timeout):\n{out}"
    assert "WRONG" not in out, out
    # each message ends with "end the job"; two ranks' lines may reach mpirun's
    # stdout run together, so a line break is not relied on
    lines = re.findall(r"TIMEOUT (\w+) rank (\d+) after ([0-9.]+) s: (.*?end the job)", proc.stdout)
    got = sorted((what, int(r)) for what, r, _, _ in lines)
    assert got == [("attention", 0), ("attention", 1), ("gather", 0), ("gather", 1)], out
    assert all(2.0 <= float(t) <= 5.0 for _, _, t, _ in lines), out
    assert all("not every rank of the communicator took part within 2 s" in m for _, _, _, m in lines), out
    assert "ALL CALLERS TIMED OUT" in proc.stdout, out


def test_ranks_that_disagree_get_one_message():
    """Options that differ on some ranks: every rank raises the same
    message, naming rank 0's value and the first rank that differs."""
    out = run_mpi("attn.py", 3, "disagree").stdout
    assert "error [options on two ranks]" in out, out
    assert "error [a dtype on one rank]" in out, out
    assert "error [float64 on one rank]" in out, out
    assert "error [inputs requiring grad on one rank]" in out, out


def test_plan_and_grid_auto():
    """fxattn.mpi.plan (given and measured figures) and attention(grid="auto")
    (mpi_scripts/plan.py)."""
    out = run_mpi("plan.py", 2).stdout
    assert out.count(" plan") >= 2 and "OK rank 0 plan" in out and "OK rank 1 plan" in out, out


@pytest.mark.parametrize("np_,ulysses,ring", [(2, 1, 2), (2, 2, 1), (4, 2, 2)])
def test_parallelize_cp_plan(np_, ulysses, ring):
    """fxattn.diffusers.parallelize split and gathered by the model's own
    _cp_plan on tiny random Flux, Qwen-Image, LTX-Video and Wan (the plan
    path) models
    (9 to 13 tokens, uneven over the ranks): every rank's output within
    rtol 1e-5 of a float64 one-process forward, as the fp32 one-process
    forward is (justified in mpi_scripts/cp_plan.py); the ranks return the
    same bytes, block 0's attention saw only the rank's shard, remove()
    restores the model bit for bit; a bad grid, heads not divisible by U
    and a mask raise clear errors, as do a model
    without a plan and a second parallelize of the same model; Flux and
    Qwen-Image with text and image lengths both not divisible by P, or a
    text shorter than P, raise ValueError on every rank before the forward.
    ~10-30 s (np 2), ~20-60 s (np 4), by the machine's load."""
    out = run_mpi("cp_plan.py", np_, str(ulysses), str(ring), timeout=240).stdout
    ok = re.findall(r"OK rank (\d+) model (\w+) err ([0-9.e+-]+) tol ([0-9.e+-]+)", out)
    for model in ("flux", "qwen", "ltx", "wan"):
        ranks = sorted(int(r) for r, m, _, _ in ok if m == model)
        assert ranks == list(range(np_)), (model, out)
    assert all(float(e) <= float(t) for _, _, e, t in ok), out
    for what in ("grid", "heads", "wan grid", "twice"):
        assert f"error [{what}] " in out, out
    assert "error [no plan] parallelize takes a diffusers model with a context-parallel plan" in out, out
    assert "error [mask] fxattn.diffusers.parallelize: masked attention is not supported" in out, out
    # joint attention with lengths no rank can run: ValueError on every rank, before the forward
    for model in ("flux", "qwen"):
        for r in range(np_):
            assert re.search(
                rf"error \[text length\] {model} rank {r} .*joint attention .*text "
                rf"\(encoder_hidden_states, 5 tokens\).*the {np_} ranks",
                out,
            ), out
            assert re.search(
                rf"error \[empty shard\] {model} rank {r} fxattn.diffusers.parallelize: \w+'s "
                rf"(encoder_hidden_states|txt_ids) has 1 tokens, fewer than the {np_} ranks",
                out,
            ), out


@pytest.mark.parametrize("ulysses,ring", [(2, 1), (1, 2)])
def test_parallelize_cp_plan_train(ulysses, ring):
    """Training through parallelize (its Wan path and the plan path) on a
    tiny fp32 Wan transformer on 2 ranks, one timestep, a timestep per
    token, LoRA adapters (mpi_scripts/cp_train.py): forward, MSE loss,
    backward, reduce_gradients() and one SGD step against one process with
    diffusers' default attention: the loss within 1e-5 relative, every
    parameter's gradient within 1e-4 of its max|grad| and the weights after
    the step within lr times that (justified in the script); the ranks hold
    the same gradient bytes; a grad None on one rank is summed as zeros,
    gradients cut across buckets exactly; ranks whose models differ raise
    ValueError on every rank, a plan that splits again after a gather
    NotImplementedError under autograd. ~10-25 s by
    the machine's load."""
    out = run_mpi("cp_train.py", 2, str(ulysses), str(ring)).stdout
    ok = re.findall(r"OK rank (\d+) path ([\w-]+) grads (\d+) err ([0-9.e+-]+)", out)
    paths = ("plan", "plan-ti2v", "wan", "wan-lora", "wan-ti2v")
    assert sorted((p, int(r)) for r, p, _, _ in ok) == [(p, r) for p in paths for r in (0, 1)], out
    assert all((int(n) == 32 if p == "wan-lora" else int(n) > 50) and float(e) <= 1e-4 for _, p, n, e in ok), out
    assert out.count("none-on-one-rank") == 2 and out.count("buckets") == 2, out
    assert out.count("error [split after gather]") == 2 and "plan splits again after a gather" in out, out
    assert out.count("error [models differ]") == 2 and "the ranks' models differ" in out, out
