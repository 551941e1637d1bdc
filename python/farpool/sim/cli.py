"""``farpool-sim``: the simulator's command line.

Subcommands (each takes ``--seed`` and one of ``--events``/``--seconds`` to bound the run,
``--json`` for one JSON object on stdout, ``--write`` to store JSON lines and plots under
``bench/results/``):

* ``sci``       -- experiment 1, seed 003's SCI ring (``--mix 1a|1b|2|3|all``; ``--point MB_S``
  runs a single load point, e.g. the 10^6-packet speed run);
* ``memscale``  -- experiment 2, MEMSCALE Fig. 5 and its mesh predictions;
* ``calibrate`` -- experiment 3, TPC-B/bank throughput on this machine from ``ops.jsonl``;
* ``predict``   -- experiment 4, 8..4096 nodes, pool (RSI) against sharded 2PC.

Errors in the input (bad option values, missing or malformed result files) print one line
``farpool-sim: error: ...`` on stderr and exit with status 2 (usage) or 1 (everything else).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from farpool.repo import RESULTS, ROOT

from . import calibrate as cal
from . import memscale, predict, sci
from .mixes import SCI_MIXES


def _positive_int(s: str) -> int:
    try:
        v = int(float(s))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return v


def _positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}")
    return v


def _threads(s: str) -> tuple[int, ...]:
    try:
        if "-" in s:
            a, b = (int(x) for x in s.split("-"))
            out = tuple(range(a, b + 1))
        else:
            out = tuple(int(x) for x in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N-M or N,M,..., got {s!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"thread counts must be >= 1, got {s!r}")
    return out


def _common(p: argparse.ArgumentParser, events_help: str, seconds_help: str) -> None:
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--events", type=_positive_int, help=events_help)
    g.add_argument("--seconds", type=_positive_float, help=seconds_help)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--write", action="store_true",
                   help="also write bench/results/sim_*.jsonl and plots")
    p.add_argument("--out", type=Path, default=None,
                   help="results directory for --write (default: <repo>/bench/results)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="farpool-sim", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("sci", help="experiment 1: seed 003's 4-node SCI ring")
    p.add_argument("--mix", default="2", choices=[*SCI_MIXES, "all"],
                   help="traffic mix (default 2, Table 1); 'all' compares them (Fig. 7)")
    p.add_argument("--point", type=_positive_float, metavar="READ_MB_S",
                   help="run one load point at this offered total read throughput")
    _common(p, "send packets per load point (default 40000)",
            "simulated seconds per load point")

    p = sub.add_parser("memscale", help="experiment 2: MEMSCALE Fig. 5 predictions")
    _common(p, "remote loads per configuration (default 60000)",
            "not used (the experiment is bounded by loads); rejected")

    p = sub.add_parser("calibrate", help="experiment 3: predict TPC-B/bank from ops.jsonl")
    p.add_argument("--ops", type=Path, default=None,
                   help="ops results (default <repo>/bench/results/ops.jsonl)")
    p.add_argument("--txn", type=Path, default=None,
                   help="measured transaction results (farpool bench txn --json)")
    p.add_argument("--transport", default=None, help="transport rows to use (default shm)")
    p.add_argument("--size", type=_positive_int, default=64, help="record size, bytes")
    p.add_argument("--threads", type=_threads, default=tuple(range(1, 9)),
                   help="client threads, e.g. 1-8 (default) or 1,2,4,8")
    p.add_argument("--scale", type=_positive_int, default=1,
                   help="TPC-B branches of the modelled runs (default 1, as bench txn)")
    p.add_argument("--accounts", type=_positive_int, default=10_000,
                   help="bank accounts of the modelled runs (default 10000, as bench txn)")
    _common(p, "committed transactions per point (default 5000)",
            "not used (bounded by commits); rejected")

    p = sub.add_parser("predict", help="experiment 4: pool vs sharded 2PC on N nodes")
    p.add_argument("--nodes", type=_positive_int, nargs="+", required=True)
    p.add_argument("--design", choices=["pool", "sharded", "both"], default="both")
    p.add_argument("--workload", choices=["tpcb", "bank", "both"], default="tpcb")
    p.add_argument("--timestamp", choices=["vector", "counter", "free"], default="vector",
                   help="the pool's RSI timestamp source (default vector; the sharded design "
                        "uses its oracle); 'free' idealises it away in both designs")
    p.add_argument("--threads", type=_positive_int, default=8, help="client threads per node")
    p.add_argument("--link-gbit", type=_positive_float, default=200.0)
    p.add_argument("--switch-ns", type=float, default=200.0)
    p.add_argument("--nic-ns", type=float, default=350.0)
    p.add_argument("--rpc-cpu-ns", type=_positive_float, default=1000.0)
    p.add_argument("--scale", type=_positive_int, default=None,
                   help="TPC-B branches (default: one per client thread)")
    _common(p, "committed transactions per run (default max(20000, 8 x clients))",
            "simulated seconds per run")
    return ap


def _fail(msg: str) -> int:
    print(f"farpool-sim: error: {msg}", file=sys.stderr)
    return 1


def _out_dir(args) -> Path:
    return args.out if args.out is not None else RESULTS


def _emit(obj: dict, as_json: bool, lines: list[str]) -> None:
    if as_json:
        print(json.dumps(obj, indent=None, default=float))
    else:
        print("\n".join(lines))


def cmd_sci(args) -> int:
    if args.point is not None:
        if args.mix == "all":
            return _fail("--point needs one mix, not 'all'")
        n_ops = (args.events or 40000) // 2
        if args.seconds:
            m = SCI_MIXES[args.mix]
            n_ops = int(args.point * 1e6 / (64 * m.shares()["read"]) * args.seconds)
        t = time.perf_counter()
        r = sci.run_point(args.mix, args.point, n_ops, args.seed)
        wall = time.perf_counter() - t
        d = r.as_dict() | {"send_packets": 2 * r.ops, "wall_s": wall,
                           "events_per_s": r.events / wall}
        _emit(d, args.json, [
            f"mix {args.mix}, offered {args.point} MB/s read: {r.read_mb_s:.1f} MB/s read, "
            f"{r.total_mb_s:.1f} MB/s total, read latency {r.latency_ns['read']:.0f} ns",
            f"{2 * r.ops} send packets, {r.events} events in {wall:.1f} s "
            f"({r.events / wall:,.0f} events/s)"])
        return 0
    mixes = list(SCI_MIXES) if args.mix == "all" else [args.mix]
    n_ops = args.events // 2 if args.events else (None if args.seconds else 20000)
    t = time.perf_counter()
    results = {m: sci.sweep(m, n_ops, args.seed, sim_seconds=args.seconds) for m in mixes}
    wall = time.perf_counter() - t
    main = results["2"] if "2" in results else results[mixes[0]]
    summary = {k: v for k, v in main.items() if k != "points"}
    summary["wall_s"] = wall
    summary["events_per_s"] = sum(r["events"] for r in results.values()) / wall
    if len(results) > 1:
        summary["mixes"] = {m: {k: r[k] for k in (
            "knee_read_mb_s", "knee_latency_ns", "total_mb_s_at_knee", "zero_load_read_ns",
            "saturation_read_mb_s", "read_mb_s_at_400ns", "mix_printed_total_percent")}
            for m, r in results.items()}
    if args.write:
        from .experiments import sci_ring
        files = sci_ring.write(results, summary, _out_dir(args))
        summary["written"] = [str(f) for f in files]
    lines = [f"mix {main['mix']} ({main['mix_label']}): unloaded read "
             f"{main['zero_load_read_ns']:.0f} ns",
             f"knee: {main['knee_read_mb_s']:.0f} MB/s total read "
             f"({main['knee_read_mb_s_per_node']:.1f} per node) at "
             f"{main['knee_latency_ns']:.0f} ns; total {main['total_mb_s_at_knee']:.0f} MB/s "
             f"(paper: 200 MB/s at ~400 ns, 400 MB/s total)",
             "Fig. 8 (MB/s; rows far refs 25/50/75%, cols hit rate 25/50/75%): "
             + str(main["fig8"]) + (" = paper" if main["fig8_matches_paper"] else " != paper")]
    for m, r in summary.get("mixes", {}).items():
        lines.append(f"mix {m}: knee {r['knee_read_mb_s']:.0f} MB/s read at "
                     f"{r['knee_latency_ns']:.0f} ns")
    _emit(summary, args.json, lines)
    return 0


def cmd_memscale(args) -> int:
    if args.seconds:
        return _fail("memscale is bounded by --events (remote loads), not --seconds")
    r = memscale.predict(seed=args.seed, loads=args.events or 60000)
    if args.write:
        from .experiments import memscale_fig5
        r["written"] = [str(f) for f in memscale_fig5.write(r, _out_dir(args))]
    lines = [f"16x16 2D mesh: +{r['mesh2d_16x16_pct']:.0f}% (paper +95%); "
             f"6x6x6 3D mesh: +{r['mesh3d_6x6x6_pct']:.0f}% (paper +27%)"]
    for name, c in r["configs"].items():
        if "loaded_pct" in c:
            lines.append(f"{name} with 4 query flows on every node: +{c['loaded_pct']:.0f}%")
        else:
            lines.append(f"{name} loaded run skipped: {c.get('loaded_skipped', 'disabled')}")
    lines.append("not reproduced: " + r["why"])
    _emit(r, args.json, lines)
    return 0


def cmd_calibrate(args) -> int:
    if args.seconds:
        return _fail("calibrate is bounded by --events (commits per point), not --seconds")
    root = ROOT
    ops = args.ops or root / "bench" / "results" / "ops.jsonl"
    r = cal.calibrate(ops, args.txn, transport=args.transport, size=args.size,
                      threads=args.threads, scale=args.scale, accounts=args.accounts,
                      seed=args.seed, commits=args.events or 5000)
    if args.write:
        from .experiments import calibration
        r["written"] = [str(f) for f in calibration.write(r, _out_dir(args))]
    lines = [f"op costs from {r['ops_file']} ({r['transport']}):"]
    for o, c in r["op_costs"].items():
        lines.append(f"  {o}: 1-thread {c['latency_1thread_us']:.2f} us, station "
                     f"{c['service_us']:.3f} us, fit error <= {c['max_abs_error_pct']:.0f}%")
    for p in r["predicted"]:
        lines.append(f"  {p['workload']:5s} {p['threads']} threads: DES {p['des_tps']:,.0f} "
                     f"tps (aborts {p['des_abort_rate']:.0%}), MVA {p['mva_tps']:,.0f} tps")
    for c in r["measured_txn"] or []:
        lines.append(f"  measured {c['workload']:5s} {c['client_threads']} threads "
                     f"(keys {c['key_space']}): {c['measured_tps']:,.0f} tps; DES "
                     f"{c['des_error_pct']:+.0f}%, MVA {c['mva_error_pct']:+.0f}%")
    lines.append(r["message"])
    _emit(r, args.json, lines)
    return 0


def cmd_predict(args) -> int:
    designs = ["pool", "sharded"] if args.design == "both" else [args.design]
    workloads = ["tpcb", "bank"] if args.workload == "both" else [args.workload]
    rows = []
    for n in args.nodes:
        p = predict.ClusterParams(n, threads=args.threads, link_gbit=args.link_gbit,
                                  switch_ns=args.switch_ns, nic_ns=args.nic_ns,
                                  rpc_cpu_ns=args.rpc_cpu_ns)
        for w in workloads:
            for d in designs:
                r = predict.run_prediction(p, d, w, timestamp=args.timestamp, seed=args.seed,
                                           commits=args.events, sim_seconds=args.seconds,
                                           scale=args.scale)
                rows.append(r.as_dict())
    out = {"params": {"threads": args.threads, "link_gbit": args.link_gbit,
                      "switch_ns": args.switch_ns, "nic_ns": args.nic_ns,
                      "rpc_cpu_ns": args.rpc_cpu_ns, "timestamp": args.timestamp},
           "runs": rows}
    if args.write:
        from .experiments import prediction
        out["written"] = [str(f) for f in prediction.write(out, _out_dir(args))]
    lines = []
    for r in rows:
        lines.append(f"{r['nodes']:5d} nodes {r['workload']:4s} {r['design']:7s}: "
                     f"{r['tps']:>14,.0f} tps, aborts {r['abort_rate']:.0%}, "
                     f"latency {r['mean_latency_us']:.1f} us; limited by {r['limited_by']}; "
                     f"first bound: {r['saturates_on']}; {r['wall_s']:.0f} s")
    _emit(out, args.json, lines)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"sci": cmd_sci, "memscale": cmd_memscale, "calibrate": cmd_calibrate,
                "predict": cmd_predict}[args.cmd](args)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        return _fail(str(e))


if __name__ == "__main__":
    sys.exit(main())
