"""Experiment 2: MEMSCALE Fig. 5 -- query time against hops, and the mesh predictions.

Writes ``sim_memscale.jsonl`` (``fig5a`` rows, one ``config`` row per mesh, a ``summary`` row)
and ``sim_memscale_fig5.png``: (a) query time relative to one hop, simulated on a chain and the
text's 1->2 hop line; (b) predicted increase against node count for 2D and 3D meshes (mean
distance under the same linear law), the simulated 16x16 and 6x6x6 points and the paper's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib.pyplot as plt

from .. import memscale
from farpool.repo import RESULTS
from ..fabric import Mesh
from . import provenance, write_jsonl


def write(r: dict, out: Path) -> list[Path]:
    prov = provenance()
    rows = [{"record": "fig5a", **x, **prov} for x in r["fig5a"]]
    rows += [{"record": "config", "name": k, **v, **prov} for k, v in r["configs"].items()]
    rows.append({"record": "summary", **{k: v for k, v in r.items()
                                          if k not in ("fig5a", "configs")}, **prov})
    files = [write_jsonl(out / "sim_memscale.jsonl", rows)]

    slope = r["paper"]["time_1_to_2_hops_pct_cache"] / 100
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    h = [x["hops"] for x in r["fig5a"]]
    a.plot(h, [x["relative"] for x in r["fig5a"]], "o", label="simulated (chain of nodes)")
    a.plot(h, [1 + slope * (x - 1) for x in h], "-", label="text: +20% per hop (caches)")
    a.plot([1, 2], [1, 1.2], "ks", mfc="none", ms=9, label="paper's 1- and 2-hop points")
    a.set(xlabel="hops to the data", ylabel="query time / one-hop query time",
          title="(a) query time vs hops")
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    for dims_of, label, ks in ((lambda k: (k, k), "2D mesh k x k", range(2, 17)),
                               (lambda k: (k, k, k), "3D mesh k x k x k", range(2, 7))):
        n = [k ** len(dims_of(k)) for k in ks]
        pct = [slope * (Mesh(dims_of(k)).mean_hops() - 1) * 100 for k in ks]
        b.plot(n, pct, "-", label=f"{label} (mean distance, +20%/hop)")
    for name, c in r["configs"].items():
        b.plot([c["nodes"]], [c["sim_pct"]], "r*", ms=11)
        b.plot([c["nodes"]], [c["paper_pct"]], "ks", mfc="none", ms=9)
        if "loaded_pct" in c:
            b.plot([c["nodes"]], [c["loaded_pct"]], "g^", ms=7)
    b.plot([], [], "r*", label="simulated, one query flow")
    b.plot([], [], "g^", label="simulated, 4 flows on every node")
    b.plot([], [], "ks", mfc="none", label="paper: +95% (16x16), +27% (6x6x6)")
    b.set(xlabel="nodes", ylabel="query time increase over two nodes (%)",
          title="(b) predicted query time vs cluster size")
    b.legend(fontsize=8)
    b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "sim_memscale_fig5.png", dpi=110)
    plt.close(fig)
    files.append(out / "sim_memscale_fig5.png")
    return files


def main() -> int:
    for f in write(memscale.predict(), RESULTS):
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
