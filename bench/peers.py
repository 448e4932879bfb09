"""fxattn vs ONNX Runtime com.microsoft MultiHeadAttention (CPU, fp32, non-causal), side by side.

Run through the wrapper bench/peers (it provides the virtual environment). For each S and thread count:
  1. random q, k, v ~ N(0, 1) (numpy, fixed seed) of shape [1, S, H, D] fp32; written as .npy (BSHD) for fxattn
     and fed to ORT as [1, S, H*D] views of the same memory;
  2. one ORT warm-up run and one fxattn warm-up run whose outputs are compared (max |fxattn - ORT| < 1e-4, or
     2e-2 for the --bf16 / --bf16-compute rows), plus both against an fp64 reference on a sample of query rows;
     any failure stops the script with exit status 1 before anything is timed;
  3. --repeats timed repetitions alternating ORT's InferenceSession.run and fxattn (the CLI's --stats "seconds", which excludes
     process start and file I/O; `attn --repeats 2` runs a warm-up and two timed runs in one process, so that,
     like ORT's InferenceSession, fxattn is timed in its steady state: plan and workspace reused); medians are reported.
FLOP = 4*B*H*S*S*D. %peak uses the FMA peak that `fxattn bench` measures for the same thread count (bf16c rows:
its bf16 peak: AMX tdpbf16ps where the amx kernels run, else vdpbf16ps), taken before the run, after each row and at the end (the largest is used; a probe after a row
well below the best flags that row as disturbed). ORT's kernel (flash or unfused) is inferred from the growth of
peak RSS over its first run (the unfused path allocates the B*H*S*S score matrix).
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import identity, ort_mha_session

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
BUILD_HINT = "cd %s && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j2" % ROOT

TOL_F32 = 1e-4
TOL_BF16 = 2e-2

# fxattn variants: name -> (extra `fxattn attn` arguments, check tolerance vs ORT fp32, peak used for %peak).
VARIANTS = {
    "f32": ([], TOL_F32, "f32"),
    # inputs rounded to bf16, fp32 arithmetic (FMA peak)
    "bf16": (["--dtype", "bf16"], TOL_BF16, "f32"),
    # inputs rounded to bf16 and bf16 arithmetic (AMX or vdpbf16ps; peak measured by `fxattn bench --dtype bf16`)
    "bf16c": (["--dtype", "bf16", "--compute", "bf16"], TOL_BF16, "bf16"),
}


class Failure(Exception):
    """A benchmark or correctness failure (exit status 1)."""


def log(msg):
    print("peers: " + msg, file=sys.stderr, flush=True)


def int_list(text):
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError("expected a comma-separated list of integers, got %r" % text) from None
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError("expected positive integers, got %r" % text)
    return vals


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="bench/peers",
        description="fxattn vs ONNX Runtime MultiHeadAttention (fp32, CPU), B=1, non-causal, BSHD.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--seqs", type=int_list, default=[1024, 4096, 8192], help="sequence lengths S (comma list)")
    p.add_argument("--heads", type=int, default=40, help="number of heads H")
    p.add_argument("--dim", type=int, default=128, help="head dimension D")
    p.add_argument("--threads", type=int_list, default=[1, 2], help="thread counts (comma list)")
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions per configuration (medians reported)")
    p.add_argument("--seed", type=int, default=0, help="numpy seed for the inputs")
    p.add_argument(
        "--bf16",
        action="store_true",
        help="also time fxattn --dtype bf16 (bf16-rounded inputs, fp32 compute) against ORT fp32 "
        "(check tolerance %g); row 'bf16'" % TOL_BF16,
    )
    p.add_argument(
        "--bf16-compute",
        action="store_true",
        help="also time fxattn --dtype bf16 --compute bf16 (AMX or vdpbf16ps) against ORT fp32 (tolerance %g; "
        "%%%%peak vs the bf16 peak); row 'bf16c'" % TOL_BF16,
    )
    p.add_argument(
        "--ort-unfused", action="store_true", help="set ORT_DISABLE_FLASH_ATTENTION=1: ORT's unfused baseline (materializes H*S*S scores)"
    )
    p.add_argument(
        "--ort-spin",
        action="store_true",
        help="leave ORT's intra-op thread spinning on (default off so that idle ORT workers do not "
        "steal cycles from the fxattn process that runs right after)",
    )
    p.add_argument(
        "--peak-core",
        type=float,
        default=None,
        metavar="GFLOPS",
        help="use T * GFLOPS as the fp32 peak instead of measuring it (e.g. 117 on a 3.65 GHz Zen 4 "
        "core; useful when other work disturbs the measurement)",
    )
    p.add_argument(
        "--peak-core-bf16", type=float, default=None, metavar="GFLOPS", help="same for the bf16 peak (AMX or vdpbf16ps, e.g. 234)"
    )
    p.add_argument("--ref-rows", type=int, default=32, help="query rows checked against an fp64 numpy reference (0: skip)")
    p.add_argument("--fxattn", default=os.path.join(ROOT, "build", "fxattn"), help="fxattn binary")
    p.add_argument("--tmpdir", default=None, help="directory for the .npy files (default: system temp)")
    p.add_argument("--json", action="store_true", help="print one JSON object per row instead of the table")
    p.add_argument(
        "--machine",
        default=platform.node(),
        help="the results page's name in the JSON rows (bench/results/<machine>.md; default: host name)",
    )
    a = p.parse_args(argv)
    if a.heads <= 0 or a.dim <= 0 or a.repeats <= 0:
        p.error("--heads, --dim and --repeats must be positive")
    return a


# ---------------------------------------------------------------------------------------------- helpers


def proc_status(field):
    """kB value of a /proc/self/status field (VmRSS, VmHWM), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def run_fxattn(cmd, timeout=3600):
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failure("timed out after %d s: %s" % (timeout, " ".join(cmd))) from None
    except OSError as e:
        raise Failure("cannot run %s: %s" % (cmd[0], e)) from e
    if r.returncode != 0:
        raise Failure(
            "%s exited with status %d\n  stdout: %s\n  stderr: %s"
            % (" ".join(cmd), r.returncode, r.stdout.strip()[-2000:], r.stderr.strip()[-2000:])
        )
    objs = []
    for line in r.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                objs.append(json.loads(line))
            except ValueError:
                pass
    if not objs:
        raise Failure("no JSON in the output of %s:\n%s" % (" ".join(cmd), r.stdout[-2000:]))
    return objs


def measure_peak(fxattn, threads, dtype):
    objs = run_fxattn(
        [fxattn, "bench", "--seq", "256", "--heads", "1", "--repeats", "1", "--json", "--threads", str(threads)]
        + (["--dtype", dtype] if dtype != "f32" else [])
    )
    peaks = [o["peak_gflops"] for o in objs if "peak_gflops" in o]
    if not peaks:
        raise Failure("fxattn bench printed no peak_gflops (threads=%d, dtype=%s)" % (threads, dtype))
    return max(peaks)


def ref_rows(np, q, k, v, rows):
    """fp64 exact attention for the query rows `rows` of q [1,S,H,D]; returns [len(rows), H, D]."""
    _, S, H, D = q.shape
    scale = 1.0 / np.sqrt(D)
    out = np.empty((len(rows), H, D))
    for h in range(H):
        qh = q[0, rows, h, :].astype(np.float64)
        kh = k[0, :, h, :].astype(np.float64)
        vh = v[0, :, h, :].astype(np.float64)
        s = (qh @ kh.T) * scale
        s -= s.max(axis=1, keepdims=True)
        p = np.exp(s)
        out[:, h, :] = (p @ vh) / p.sum(axis=1, keepdims=True)
    return out


class CpuMeter:
    """Cores used by *other* processes during an interval: system-wide busy CPU time from /proc/stat (including
    steal) minus this process's and its waited-for children's CPU time, divided by the wall time."""

    def __init__(self):
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _busy(self):
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
        return (sum(v[:8]) - v[3] - v[4]) / self.hz

    @staticmethod
    def _own():
        import resource

        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    def start(self):
        return (time.perf_counter(), self._busy(), self._own())

    def others(self, t):
        wall, busy, own = time.perf_counter() - t[0], self._busy(), self._own() - t[2]
        if busy is None or t[1] is None or wall <= 0:
            return None
        return max(0.0, (busy - t[1] - own) / wall)


def fmt_cores(x):
    return "?" if x is None else "%.2f" % x


def max_or_none(xs):
    xs = [x for x in xs if x is not None]
    return max(xs) if xs else None


def file_sha(path):
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def fxattn_identity(fxattn):
    """What binary is being measured: sha256 prefix, mtime, `fxattn info` kernel line, git HEAD of the tree."""
    ident = {
        "fxattn_sha256": file_sha(fxattn),
        "fxattn_mtime": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(os.path.getmtime(fxattn))),
    }
    try:
        r = subprocess.run([fxattn, "info"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=60)
        if r.returncode == 0:
            ident["fxattn_info"] = " | ".join(line.strip() for line in r.stdout.splitlines() if line.strip())
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:  # read-only
        r = subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=30
        )
        if r.returncode == 0:
            ident["git_head"] = r.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return ident


def loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------- main


def main(argv):
    a = parse_args(argv)

    if not (os.path.isfile(a.fxattn) and os.access(a.fxattn, os.X_OK)):
        log("error: fxattn binary not found or not executable: %s\n  build it with: %s" % (a.fxattn, BUILD_HINT))
        return 2

    if a.ort_unfused:
        # Read by the MultiHeadAttention kernel constructor, i.e. at InferenceSession creation.
        os.environ["ORT_DISABLE_FLASH_ATTENTION"] = "1"
    else:
        os.environ.pop("ORT_DISABLE_FLASH_ATTENTION", None)

    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
    except ImportError as e:
        log("error: %s (the venv is incomplete; delete bench/.venv and rerun bench/peers)" % e)
        return 3

    B, H, D = 1, a.heads, a.dim
    E = H * D
    if a.ort_unfused:
        need = B * H * max(a.seqs) ** 2 * 4 + 8 * B * max(a.seqs) * E * 4
        avail = None
        try:
            with open("/proc/meminfo") as f:
                avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
        except (OSError, StopIteration, ValueError):
            pass
        if avail is not None and need > 0.8 * avail:
            log(
                "error: --ort-unfused at S=%d H=%d needs about %.1f GB (the S*S score matrix); %.1f GB available"
                % (max(a.seqs), H, need / 1e9, avail / 1e9)
            )
            return 2
    ort_mode = "unfused" if a.ort_unfused else "flash"
    meta = {
        "onnxruntime": ort.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    log("onnxruntime %s, numpy %s, fxattn %s, ORT mode requested: %s" % (ort.__version__, np.__version__, a.fxattn, ort_mode))
    ident = fxattn_identity(a.fxattn)
    versions = {k: meta[k] for k in ("onnxruntime", "onnx", "numpy")}
    if ident.get("fxattn_info", "").startswith("fxattn "):
        versions["fxattn"] = ident["fxattn_info"].split()[1]
    run_ident = identity(a.machine, os.path.dirname(os.path.abspath(a.fxattn)), versions)
    log(
        "fxattn binary: sha256 %s, built %s, tree HEAD %s; %s"
        % (ident["fxattn_sha256"], ident["fxattn_mtime"], ident.get("git_head", "?"), ident.get("fxattn_info", ""))
    )
    load_start = loadavg()
    log("load average at start: %s (cpus: %s)" % (load_start, os.cpu_count()))

    # Peaks (FMA for fp32; AMX or vdpbf16ps for bf16), measured by fxattn for each thread count.
    dtypes = ["f32"] + (["bf16"] if a.bf16 else []) + (["bf16c"] if a.bf16_compute else [])
    peak_kinds = sorted({VARIANTS[dt][2] for dt in dtypes}, key=lambda k: k != "f32")
    peaks = {}
    fixed_peak = {"f32": a.peak_core, "bf16": a.peak_core_bf16}
    probes = {T: [] for T in a.threads}  # fp32 FMA-peak probes after each row
    for T in a.threads:
        for dt in peak_kinds:
            if fixed_peak[dt] is not None:
                peaks[(T, dt)] = [T * fixed_peak[dt]]
                continue
            peaks[(T, dt)] = [measure_peak(a.fxattn, T, dt)]
            log("peak %s, %d thread(s): %.1f GFLOP/s" % (dt, T, peaks[(T, dt)][0]))

    def make_session(S, T):
        return ort_mha_session(B, S, H, D, T, spin=a.ort_spin)

    meter = CpuMeter()
    rows_out = []
    tmp = tempfile.mkdtemp(prefix="fxattn-peers-", dir=a.tmpdir)
    try:
        for S in a.seqs:
            flop = 4.0 * B * H * S * S * D
            log(
                "S=%d H=%d D=%d: generating inputs (%.0f MB per tensor), %.1f GFLOP per attention"
                % (S, H, D, B * S * E * 4 / 1e6, flop / 1e9)
            )
            rng = np.random.default_rng(a.seed)
            qkv = {n: rng.standard_normal((B, S, H, D), dtype=np.float32) for n in "qkv"}
            paths = {n: os.path.join(tmp, n + ".npy") for n in "qkv"}
            for n in "qkv":
                np.save(paths[n], qkv[n])
            feeds = {n: qkv[n].reshape(B, S, E) for n in "qkv"}  # views, same memory
            out_path = os.path.join(tmp, "out.npy")
            sample = (
                np.sort(np.random.default_rng(a.seed + 1).choice(S, size=min(a.ref_rows, S), replace=False)) if a.ref_rows > 0 else None
            )
            ref = ref_rows(np, qkv["q"], qkv["k"], qkv["v"], sample) if sample is not None else None

            for T in a.threads:
                sha_before = file_sha(a.fxattn)
                sess = make_session(S, T)
                fx_cmd = {
                    dt: [
                        a.fxattn,
                        "attn",
                        "-q",
                        paths["q"],
                        "-k",
                        paths["k"],
                        "-v",
                        paths["v"],
                        "-o",
                        out_path,
                        "--threads",
                        str(T),
                        "--stats",
                        "--repeats",
                        "2",
                    ]
                    + VARIANTS[dt][0]
                    for dt in dtypes
                }

                # ---- warm-up runs double as the correctness check (before any timing)
                rss0 = proc_status("VmRSS")
                have_hwm = reset_peak_rss()
                (o_ort,) = sess.run(None, feeds)
                hwm = proc_status("VmHWM")
                scratch = (hwm - rss0) if (have_hwm and hwm is not None and rss0 is not None) else None
                o_ort = o_ort.reshape(B, S, H, D)
                scores_bytes = B * H * S * S * 4
                # Which kernel did ORT run? Both paths allocate Q/K/V transposed to BNSH plus the output (4 tensors)
                # and the flash path adds only per-thread tiles (~1 MB each); the unfused path adds the B*H*S*S
                # fp32 score matrix. Measured growth of peak RSS over the first run tells them apart.
                base_bytes = 4 * B * S * E * 4
                if scratch is None or scores_bytes < 16e6:
                    ort_path = "?"  # no /proc, or the score matrix too small to stand out of allocator noise
                else:
                    ort_path = "unfused" if scratch > base_bytes + 0.5 * scores_bytes else "flash"
                checks = {}
                stats0 = {}
                for dt in dtypes:
                    st = [o for o in run_fxattn(fx_cmd[dt]) if "seconds" in o]
                    if not st:
                        raise Failure("fxattn attn --stats printed no 'seconds': %s" % " ".join(fx_cmd[dt]))
                    stats0[dt] = st[-1]
                    o_fx = np.load(out_path)
                    if o_fx.shape != o_ort.shape:
                        raise Failure("fxattn output shape %s != %s" % (o_fx.shape, o_ort.shape))
                    diff = float(np.max(np.abs(o_fx.astype(np.float64) - o_ort)))
                    c = {"max_abs_diff": diff}
                    if ref is not None:
                        c["ref_err_fxattn"] = float(np.max(np.abs(o_fx[0, sample] - ref)))
                        c["ref_err_ort"] = float(np.max(np.abs(o_ort[0, sample] - ref)))
                    tol = VARIANTS[dt][1]
                    c["tol"] = tol
                    checks[dt] = c
                    log(
                        "S=%d T=%d check fxattn(%s) vs ORT(fp32, %s): max|diff| = %.3g (tol %g)%s"
                        % (
                            S,
                            T,
                            dt,
                            ort_path,
                            diff,
                            tol,
                            "; vs fp64 ref on %d rows: fxattn %.3g, ORT %.3g" % (len(sample), c["ref_err_fxattn"], c["ref_err_ort"])
                            if ref is not None
                            else "",
                        )
                    )
                    if not (diff < tol):  # also catches NaN
                        raise Failure(
                            "CORRECTNESS CHECK FAILED: S=%d H=%d D=%d threads=%d dtype=%s: "
                            "max |fxattn - ORT| = %r >= %g%s"
                            % (
                                S,
                                H,
                                D,
                                T,
                                dt,
                                diff,
                                tol,
                                " (fp64 ref errors on %d sampled rows: fxattn %.3g, ORT %.3g)"
                                % (len(sample), c["ref_err_fxattn"], c["ref_err_ort"])
                                if ref is not None
                                else "",
                            )
                        )
                    del o_fx
                del o_ort

                # ---- timed rounds, alternating ORT and fxattn
                t_ort, t_fx, wall_fx = [], {dt: [] for dt in dtypes}, {dt: [] for dt in dtypes}
                oth_ort, oth_fx = [], {dt: [] for dt in dtypes}
                last_stats = dict(stats0)
                for r in range(a.repeats):
                    m0 = meter.start()
                    t0 = time.perf_counter()
                    (o,) = sess.run(None, feeds)
                    t_ort.append(time.perf_counter() - t0)
                    oth_ort.append(meter.others(m0))
                    del o
                    for dt in dtypes:
                        m0 = meter.start()
                        t0 = time.perf_counter()
                        st = [o for o in run_fxattn(fx_cmd[dt]) if "seconds" in o][-1]
                        wall_fx[dt].append(time.perf_counter() - t0)
                        oth_fx[dt].append(meter.others(m0))
                        t_fx[dt].append(float(st["seconds"]))
                        last_stats[dt] = st
                    log(
                        "S=%d T=%d round %d/%d: ORT %.4f s (others %s cores), %s"
                        % (
                            S,
                            T,
                            r + 1,
                            a.repeats,
                            t_ort[-1],
                            fmt_cores(oth_ort[-1]),
                            ", ".join(
                                "fxattn(%s) %.4f s (others %s cores)" % (dt, t_fx[dt][-1], fmt_cores(oth_fx[dt][-1])) for dt in dtypes
                            ),
                        )
                    )
                del sess
                # An FMA-peak probe right after the row: contention from outside this kernel (co-tenant VMs) does
                # not show in /proc/stat but does pull this number down.
                row_peak = measure_peak(a.fxattn, T, "f32")
                probes[T].append(row_peak)
                if fixed_peak["f32"] is None:
                    peaks[(T, "f32")].append(row_peak)
                if file_sha(a.fxattn) != sha_before or sha_before != ident["fxattn_sha256"]:
                    raise Failure("%s changed during the run (someone rebuilt it); the timings mix two binaries, rerun" % a.fxattn)

                ort_s = statistics.median(t_ort)
                for dt in dtypes:
                    fx_s = statistics.median(t_fx[dt])
                    pk_ort = max(peaks[(T, "f32")])
                    pk_fx = max(peaks[(T, VARIANTS[dt][2])])
                    st = last_stats[dt]
                    rows_out.append(
                        {
                            "S": S,
                            "B": B,
                            "H": H,
                            "D": D,
                            "threads": T,
                            "gflop": flop / 1e9,
                            "ort_path": ort_path,
                            "ort_mode_requested": ort_mode,
                            "ort_scratch_mb": None if scratch is None else round(scratch / 1e6, 1),
                            "ort_seconds": ort_s,
                            "ort_gflops": flop / ort_s / 1e9,
                            "ort_pct_peak": 100.0 * flop / ort_s / 1e9 / pk_ort,
                            "fxattn_dtype": dt,
                            "fxattn_seconds": fx_s,
                            "fxattn_gflops": flop / fx_s / 1e9,
                            "fxattn_pct_peak": 100.0 * flop / fx_s / 1e9 / pk_fx,
                            "speed_fxattn_over_ort": ort_s / fx_s,
                            "max_abs_diff": checks[dt]["max_abs_diff"],
                            "tol": checks[dt]["tol"],
                            "ref_err_fxattn": checks[dt].get("ref_err_fxattn"),
                            "ref_err_ort": checks[dt].get("ref_err_ort"),
                            "peak_gflops_f32": pk_ort,
                            "peak_gflops_fxattn_dtype": pk_fx,
                            "ort_seconds_all": t_ort,
                            "fxattn_seconds_all": t_fx[dt],
                            "fxattn_process_wall_median": statistics.median(wall_fx[dt]),
                            "others_cores_ort": oth_ort,
                            "others_cores_fxattn": oth_fx[dt],
                            "others_cores_max": max_or_none(oth_ort + oth_fx[dt]),
                            "peak_probe_after_row": row_peak,
                            "fxattn_compute": st.get("compute"),
                            "fxattn_isa": st.get("isa"),
                            "fxattn_mode": st.get("mode"),
                            "fxattn_fallback_rows": st.get("fallback_rows"),
                            "fxattn_rows": st.get("rows"),
                            "repeats": a.repeats,
                            "seed": a.seed,
                        }
                    )
            del qkv, feeds
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    # Peaks again after the runs; the larger value is the less disturbed measurement.
    for T in a.threads:
        for dt in peak_kinds:
            if fixed_peak[dt] is None:
                peaks[(T, dt)].append(measure_peak(a.fxattn, T, dt))
    load_end = loadavg()
    log("load average at end: %s" % (load_end,))
    for row in rows_out:
        T = row["threads"]
        best = max(probes[T] + (peaks[(T, "f32")] if fixed_peak["f32"] is None else []))
        row["peak_probe_ratio"] = row["peak_probe_after_row"] / best
    disturbed = [r for r in rows_out if r["others_cores_max"] is not None and r["others_cores_max"] > 0.1]
    slow_probe = [r for r in rows_out if r["peak_probe_ratio"] < 0.9]
    if slow_probe:
        log(
            "WARNING: the FMA-peak probe after %d of %d rows ran at %.0f%% of the best probe: the machine was slowed "
            "by something (co-tenant load?); those rows' timings are suspect"
            % (len(slow_probe), len(rows_out), 100 * min(r["peak_probe_ratio"] for r in slow_probe))
        )
    if disturbed:
        log(
            "WARNING: other processes used up to %.2f cores during %d of %d rows' timed runs: timings and %%peak "
            "are disturbed; rerun on a quiet machine" % (max(r["others_cores_max"] for r in disturbed), len(disturbed), len(rows_out))
        )
    for row in rows_out:
        T, dt = row["threads"], row["fxattn_dtype"]
        pk_ort, pk_fx = max(peaks[(T, "f32")]), max(peaks[(T, VARIANTS[dt][2])])
        row["peak_gflops_f32"], row["peak_gflops_fxattn_dtype"] = pk_ort, pk_fx
        row["peak_gflops_f32_all"] = peaks[(T, "f32")]
        row["ort_pct_peak"] = 100.0 * row["ort_gflops"] / pk_ort
        row["fxattn_pct_peak"] = 100.0 * row["fxattn_gflops"] / pk_fx
        row["loadavg_start"], row["loadavg_end"] = load_start, load_end
        row.update(meta)
        row.update(ident)
        row.update(run_ident)

    if a.json:
        for row in rows_out:
            row["kind"] = "peers"
            print(json.dumps(row), flush=True)
    else:
        print_table(rows_out, peaks, peak_kinds, a, load_start, load_end, meta, ident)
    return 0


def print_table(rows, peaks, peak_kinds, a, load_start, load_end, meta, ident):
    print(
        "fxattn vs ONNX Runtime %s MultiHeadAttention (fp32), B=1 H=%d D=%d, median of %d, GFLOP = 4*B*H*S^2*D"
        % (meta["onnxruntime"], a.heads, a.dim, a.repeats)
    )
    print(
        "fxattn binary sha256 %s (built %s, tree HEAD %s)%s"
        % (
            ident["fxattn_sha256"],
            ident["fxattn_mtime"],
            ident.get("git_head", "?"),
            "; " + ident["fxattn_info"] if "fxattn_info" in ident else "",
        )
    )
    print(
        "peak GFLOP/s (measured by `fxattn bench` before the run, after each row and at the end; max used; "
        "or T * --peak-core*): "
        + "; ".join("%dT %s %s" % (T, dt, "/".join("%.1f" % p for p in peaks[(T, dt)])) for T in a.threads for dt in peak_kinds)
    )
    hdr = "%6s %3s %-8s %9s %8s %6s  %-5s %9s %8s %6s  %8s  %9s  %6s %5s" % (
        "S",
        "T",
        "ORT-path",
        "ORT s",
        "ORT GF/s",
        "ORT%pk",
        "fx",
        "fx s",
        "fx GF/s",
        "fx%pk",
        "fx/ORT",
        "max|diff|",
        "others",
        "probe",
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(
            "%6d %3d %-8s %9.4f %8.1f %5.1f%%  %-5s %9.4f %8.1f %5.1f%%  %7.3fx  %9.2e  %6s %4.0f%%"
            % (
                r["S"],
                r["threads"],
                r["ort_path"],
                r["ort_seconds"],
                r["ort_gflops"],
                r["ort_pct_peak"],
                r["fxattn_dtype"],
                r["fxattn_seconds"],
                r["fxattn_gflops"],
                r["fxattn_pct_peak"],
                r["speed_fxattn_over_ort"],
                r["max_abs_diff"],
                fmt_cores(r["others_cores_max"]),
                100 * r["peak_probe_ratio"],
            )
        )
    print(
        "fx/ORT = ORT seconds / fxattn seconds (> 1: fxattn faster). fx = fxattn variant: f32; bf16 = --dtype bf16 "
        "(rounded inputs, fp32 compute, %%pk vs the FMA peak); bf16c = --dtype bf16 --compute bf16 (%%pk vs the "
        "bf16 peak: AMX tdpbf16ps or vdpbf16ps); bf16 rows are checked against ORT fp32 with tol %g.\nothers = most cores used by other processes (incl. steal) during any timed run "
        "of the row (from /proc/stat); > ~0.1 means the timings are disturbed.\n"
        "probe = FMA-peak probe right after the row / best probe; < 90%% means the machine was slowed (co-tenants).\n"
        "load average start %s, end %s." % (TOL_BF16, load_start, load_end)
    )


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Failure as e:
        log("FAILED: %s" % e)
        sys.exit(1)
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)
