"""Experiment 4: pool (RSI) against sharded 2PC on 8, 64, 512 and 4096 nodes.

Writes ``sim_predict.jsonl`` (one ``run`` row per nodes x workload x design x timestamp
source, a ``summary`` row with the parameters) and ``sim_predict.png``: transactions/s against
nodes, with the analytic saturation bound of each resource class dashed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib.pyplot as plt

from .. import predict
from ..calibrate import repo_root
from . import provenance, write_jsonl

NODES = (8, 64, 512, 4096)


def write(out_obj: dict, out: Path, name: str = "sim_predict") -> list[Path]:
    prov = provenance()
    rows = [{"record": "run", **r, **prov} for r in out_obj["runs"]]
    rows.append({"record": "summary", "params": out_obj["params"], **prov})
    files = [write_jsonl(out / f"{name}.jsonl", rows)]
    workloads = sorted({r["workload"] for r in out_obj["runs"]})
    fig, axes = plt.subplots(1, len(workloads), figsize=(6.2 * len(workloads), 4.4),
                             squeeze=False)
    for ax, w in zip(axes[0], workloads):
        runs = [r for r in out_obj["runs"] if r["workload"] == w]
        for key in sorted({(r["design"], r["timestamp"]) for r in runs}):
            pts = sorted((r for r in runs if (r["design"], r["timestamp"]) == key),
                         key=lambda r: r["nodes"])
            n = [r["nodes"] for r in pts]
            line, = ax.plot(n, [r["tps"] for r in pts], "o-",
                            label=f"{key[0]} ({key[1]} timestamps)")
            ax.plot(n, [min(r["bounds_tps"].values()) for r in pts], ":",
                    color=line.get_color(), alpha=0.7)
            for r in pts:
                ax.annotate(r["saturates_on"].replace("timestamp_source", "ts"),
                            (r["nodes"], r["tps"]), fontsize=6, xytext=(3, -9),
                            textcoords="offset points")
        ax.set(xscale="log", yscale="log", xlabel="nodes (8 client threads each)",
               ylabel="committed transactions / s", title=f"{w}: simulated (dotted: bound)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    plt.close(fig)
    files.append(out / f"{name}.png")
    return files


def run_all(nodes=NODES, workloads=("tpcb", "bank"), timestamps=("vector", "counter"),
            seed: int = 1) -> dict:
    runs = []
    for n in nodes:
        p = predict.ClusterParams(n)
        for w in workloads:
            runs.append(predict.run_prediction(p, "sharded", w, seed=seed).as_dict())
            for ts in timestamps:
                r = predict.run_prediction(p, "pool", w, timestamp=ts, seed=seed)
                runs.append(r.as_dict())
                print(f"{n} {w} pool/{ts}: {r.tps:,.0f} tps ({r.wall_s:.0f} s)", flush=True)
    return {"params": {k: v for k, v in predict.ClusterParams(1).__dict__.items()
                       if k != "nodes"}, "runs": runs}


def main() -> int:
    out = run_all()
    for f in write(out, repo_root() / "bench" / "results"):
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
