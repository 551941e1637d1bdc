"""Experiment 4: pool (RSI) against sharded 2PC on 8, 64, 512 and 4096 nodes.

Writes ``sim_predict.jsonl`` (one ``run`` row per nodes x workload x design x timestamp
source -- sharded with its oracle or a free source, the pool with the timestamp vector, a
global counter or a free source --, a ``summary`` row with the parameters) and
``sim_predict.png``: transactions/s against nodes, with the lowest analytic saturation bound
of each curve dotted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib.pyplot as plt

from .. import predict
from farpool.repo import RESULTS
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


VARIANTS = (("sharded", "oracle"), ("sharded", "free"), ("pool", "vector"), ("pool", "counter"),
            ("pool", "free"))


def run_all(nodes=NODES, workloads=("tpcb", "bank"), variants=VARIANTS, seed: int = 1,
            done: list[dict] | None = None) -> dict:
    """Every (nodes, workload, design, timestamp source); runs already in ``done`` (rows of
    an earlier ``sim_predict.jsonl`` with the same parameters) are reused, not re-run."""
    have = {(r["nodes"], r["workload"], r["design"], r["timestamp"]): r for r in done or []}
    runs = []
    for n in nodes:
        p = predict.ClusterParams(n)
        for w in workloads:
            for design, ts in variants:
                key = (n, w, design, ts)
                if key in have:
                    runs.append(have[key])
                    continue
                r = predict.run_prediction(p, design, w, timestamp=ts, seed=seed)
                runs.append(r.as_dict())
                print(f"{n} {w} {design}/{ts}: {r.tps:,.0f} tps ({r.wall_s:.0f} s)",
                      flush=True)
    return {"params": {k: v for k, v in predict.ClusterParams(1).__dict__.items()
                       if k != "nodes"}, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    """``--reuse``: keep the runs of an existing sim_predict.jsonl made with the same
    parameters and seed (runs are deterministic), simulate only the missing ones."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python3 -m farpool.sim.experiments.prediction")
    ap.add_argument("--reuse", action="store_true")
    args = ap.parse_args(argv)
    out_dir = RESULTS
    done = None
    if args.reuse and (out_dir / "sim_predict.jsonl").exists():
        rows = [json.loads(x) for x in (out_dir / "sim_predict.jsonl").read_text().splitlines()]
        params = {k: v for k, v in predict.ClusterParams(1).__dict__.items() if k != "nodes"}
        summary = [r for r in rows if r.get("record") == "summary"]
        if summary and summary[0]["params"] == params:
            done = [{k: v for k, v in r.items() if k not in ("record", "git_sha", "utc")}
                    for r in rows if r.get("record") == "run"]
    for f in write(run_all(done=done), out_dir):
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
