"""Experiment 1: seed 003's SCI ring -- the paper's Figs. 4-7 redrawn and Fig. 8 recomputed.

Writes ``sim_sci.jsonl`` (one ``point`` row per load point and mix, one ``summary`` row) and
``sim_sci_fig4.png`` (throughput vs latency per operation type, mix 2), ``sim_sci_fig5.png``
(read throughput vs read latency, with the knee and the paper's point), ``sim_sci_fig6.png``
(total throughput vs read latency) and ``sim_sci_fig7.png`` (the four mixes).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt

from .. import sci
from farpool.repo import RESULTS
from ..mixes import SCI_MIXES
from . import provenance, write_jsonl

LAT_CAP_NS = 1500  # beyond saturation latency grows without bound; plots stop here


def write(results: dict[str, dict], summary: dict, out: Path) -> list[Path]:
    prov = provenance()
    rows = []
    for m, r in results.items():
        for p in r["points"]:
            rows.append({"record": "point", **p, **prov})
    rows.append({"record": "summary", **summary, **prov})
    files = [write_jsonl(out / "sim_sci.jsonl", rows)]
    main = results.get("2") or next(iter(results.values()))
    pts = [p for p in main["points"] if p["latency_ns"]["read"] < LAT_CAP_NS]

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for op, label in (("read", "read"), ("rollout", "cache tag (rollout)"), ("lock", "lock"),
                      ("write", "write")):
        ax.plot([p["ops_per_s"][op] / 1e6 for p in pts], [p["latency_ns"][op] for p in pts],
                "o-", ms=3, label=label)
    ax.set(xlabel="operations per second (millions, 4 nodes)", ylabel="mean latency (ns)",
           title=f"Fig. 4 redrawn: throughput vs latency, mix {main['mix']}")
    ax.legend()
    ax.grid(alpha=0.3)
    files.append(_save(fig, out / "sim_sci_fig4.png"))

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot([p["read_mb_s"] for p in pts], [p["latency_ns"]["read"] for p in pts], "o-", ms=3,
            label="simulated (mean read latency)")
    ax.plot([main["knee_read_mb_s"]], [main["knee_latency_ns"]], "r*", ms=12,
            label=f"knee (2 x unloaded): {main['knee_read_mb_s']:.0f} MB/s, "
                  f"{main['knee_latency_ns']:.0f} ns")
    ax.plot([200], [400], "ks", ms=8, mfc="none", label="paper: 200 MB/s at ~400 ns")
    ax.set(xlabel="total read throughput (MB/s)", ylabel="read latency (ns)",
           title=f"Fig. 5 redrawn: read throughput vs latency, mix {main['mix']}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    files.append(_save(fig, out / "sim_sci_fig5.png"))

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot([p["total_mb_s"] for p in pts], [p["latency_ns"]["read"] for p in pts], "o-",
            ms=3, label="payload (64 B read/write, 16 B lock/tag)")
    ax.plot([p["wire_mb_s_per_link"] for p in pts], [p["latency_ns"]["read"] for p in pts],
            "^-", ms=3, label="on the wire, per link (headers, CRC, idles, echoes)")
    ax.plot([main["total_mb_s_at_knee"]], [main["knee_latency_ns"]], "r*", ms=12,
            label=f"knee: {main['total_mb_s_at_knee']:.0f} MB/s payload")
    ax.plot([400], [400], "ks", ms=8, mfc="none", label="paper: 400 MB/s total")
    ax.set(xlabel="throughput (MB/s)", ylabel="read latency (ns)",
           title=f"Fig. 6 redrawn: sum throughput, mix {main['mix']}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    files.append(_save(fig, out / "sim_sci_fig6.png"))

    if len(results) > 1:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for m, r in results.items():
            q = [p for p in r["points"] if p["latency_ns"]["read"] < LAT_CAP_NS]
            ax.plot([p["read_mb_s"] for p in q], [p["latency_ns"]["read"] for p in q], "o-",
                    ms=3, label=f"mix {m}: {SCI_MIXES[m].label} "
                                f"(knee {r['knee_read_mb_s']:.0f} MB/s)")
        ax.set(xlabel="total read throughput (MB/s)", ylabel="read latency (ns)",
               title="Fig. 7 redrawn: robustness to the traffic mix")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        files.append(_save(fig, out / "sim_sci_fig7.png"))
    return files


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    t = time.perf_counter()
    results = {m: sci.sweep(m, 20000, 1) for m in SCI_MIXES}
    wall = time.perf_counter() - t
    summary = {k: v for k, v in results["2"].items() if k != "points"}
    summary["wall_s"] = wall
    summary["mixes"] = {m: {k: r[k] for k in ("knee_read_mb_s", "knee_latency_ns",
                                               "total_mb_s_at_knee", "zero_load_read_ns")}
                        for m, r in results.items()}
    for f in write(results, summary, RESULTS):
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
