"""Plot a bound report: `python -m fxattn.plot report.json -o out.png`.

report.json is the output of `fxattn check --json` or of
fxattn.check(...).to_dict(). Two panels, per query head: the bound ceil(U)
(median and max, with and without centring) against the strict and the
centred gate, and the predicted share of rows that fall back to online
softmax. Needs matplotlib (an optional dependency: the `plot` extra).
"""

from __future__ import annotations

import argparse
import json
import sys


def plot_report(report: dict, path) -> None:
    """Draw report (the `fxattn check --json` object) into a PNG at path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("fxattn: plotting needs matplotlib (pip install matplotlib)") from e
    heads = report["heads"]
    x = [h["head"] for h in heads]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(max(6.0, 0.25 * len(x) + 3), 6.5))
    top.plot(x, [h["bound_max"] for h in heads], "o-", label="bound max (centred)")
    top.plot(x, [h["bound_median"] for h in heads], ".--", label="bound median (centred)")
    top.plot(x, [h["bound_raw_max"] for h in heads], "s:", alpha=0.6, label="bound max (raw)")
    top.step(x, [h["gate"] for h in heads], where="mid", color="k", label="strict gate")
    top.step(x, [h["gate_centered"] for h in heads], where="mid", color="r", label="centred gate")
    top.set_ylabel("base-2 units")
    top.set_title(
        f"fxattn check: Hq={report['heads_q']} Hkv={report['heads_kv']} Sq={report['seq_q']} Skv={report['seq_kv']} D={report['head_dim']}"
    )
    top.legend(fontsize="small", ncol=2)
    width = 0.4
    bottom.bar([i - width / 2 for i in x], [100 * h["fallback_share_centered"] for h in heads], width, label="centred")
    bottom.bar([i + width / 2 for i in x], [100 * h["fallback_share_raw"] for h in heads], width, label="raw")
    bottom.set_ylabel("predicted fallback rows (%)")
    bottom.set_xlabel("query head")
    bottom.set_xticks(x if len(x) <= 48 else x[:: (len(x) + 47) // 48])
    bottom.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fxattn.plot", description=__doc__.splitlines()[0])
    ap.add_argument("report", help="JSON of `fxattn check --json` or CheckReport.to_dict()")
    ap.add_argument("-o", "--output", required=True, help="PNG file to write")
    a = ap.parse_args(argv)
    if not a.output or "\0" in a.output:
        print(f"fxattn: error: -o {a.output!r}: not a file path", file=sys.stderr)
        return 2
    try:
        with open(a.report) as f:
            report = json.load(f)
        if not isinstance(report, dict) or not isinstance(report.get("heads"), list):
            raise ValueError("not a bound report (no 'heads' list)")
        plot_report(report, a.output)
    except OSError as e:  # the report unreadable or the PNG unwritable: e names the file
        print(f"fxattn: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, KeyError, TypeError) as e:
        print(f"fxattn: error: {a.report}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
