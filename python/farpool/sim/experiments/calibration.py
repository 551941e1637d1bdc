"""Experiment 3: TPC-B and bank throughput on this machine, predicted from ``ops.jsonl``.

Writes ``sim_calibrate.jsonl`` (``op_cost`` rows with the fit check, ``prediction`` rows per
workload and thread count, ``comparison`` rows when measured transaction results were given,
a ``summary`` row) and ``sim_calibrate.png`` (predicted, and measured if any, transactions/s
against client threads). Needs ``bench/results/ops.jsonl`` from ``farpool bench ops --json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib.pyplot as plt

from farpool.repo import ROOT

from .. import calibrate as cal
from . import provenance, write_jsonl


def write(r: dict, out: Path) -> list[Path]:
    prov = provenance()
    rows = [{"record": "op_cost", **c, **prov} for c in r["op_costs"].values()]
    rows += [{"record": "prediction", **p, **prov} for p in r["predicted"]]
    rows += [{"record": "comparison", **c, **prov} for c in (r["measured_txn"] or [])]
    rows.append({"record": "summary", **{k: v for k, v in r.items()
                                          if k not in ("op_costs", "predicted")}, **prov})
    files = [write_jsonl(out / "sim_calibrate.jsonl", rows)]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for w, color in (("tpcb", "C0"), ("bank", "C1")):
        pts = [p for p in r["predicted"] if p["workload"] == w]
        t = [p["threads"] for p in pts]
        ax.plot(t, [p["des_tps"] for p in pts], "o-", color=color, label=f"{w}: DES (RSI)")
        ax.plot(t, [p["mva_tps"] for p in pts], "--", color=color, label=f"{w}: MVA")
        meas = [c for c in (r["measured_txn"] or []) if c["workload"] == w]
        if meas:
            t = [c["client_threads"] for c in meas]
            ax.plot(t, [c["measured_tps"] for c in meas], "s", color=color, mfc="none", ms=9,
                    label=f"{w}: measured (bench txn)")
            ax.plot(t, [c["des_tps"] for c in meas], "x", color=color, ms=8,
                    label=f"{w}: DES for the measured configuration")
            for c in meas:
                ax.annotate(f"keys {c['key_space']}: {c['des_error_pct']:+.0f}%",
                            (c["client_threads"], c["measured_tps"]), fontsize=6,
                            xytext=(4, 4), textcoords="offset points")
    ax.set(xlabel="client threads", ylabel="transactions / s",
           title=f"Calibration from {Path(r['ops_file']).name} ({r['transport']})")
    if not r["measured_txn"]:
        ax.text(0.02, 0.02, "no measured transaction runs yet (txn.jsonl)",
                transform=ax.transAxes, fontsize=8)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "sim_calibrate.png", dpi=110)
    plt.close(fig)
    files.append(out / "sim_calibrate.png")
    return files


def main() -> int:
    """Uses bench/results/ops.jsonl, or else sim_calibrate_ops.jsonl (op costs measured for
    the simulator, see docs/simulator.md), and txn.jsonl when it exists."""
    root = ROOT
    res = root / "bench" / "results"
    ops = res / "ops.jsonl"
    if not ops.exists() and (res / "sim_calibrate_ops.jsonl").exists():
        ops = res / "sim_calibrate_ops.jsonl"
    txn = res / "txn.jsonl"
    try:
        r = cal.calibrate(ops, txn if txn.exists() else None)
    except (FileNotFoundError, ValueError) as e:
        print(f"calibration: {e}", file=sys.stderr)
        return 1
    for f in write(r, root / "bench" / "results"):
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
