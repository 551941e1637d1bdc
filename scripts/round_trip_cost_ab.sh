#!/bin/bash
# A developer A/B diagnostic, not one of bench/experiments/ (those are console scripts of the
# Python package that measure farpool against its peers).
# The cost of a round trip over TCP (docs/pool.md, "Measured: the cost of a round trip over
# TCP"): binary A against binary B, interleaved rounds, each on its own cluster of 2 memory
# servers over TCP in network namespaces with event progress (started by that binary, so the
# servers are A's and B's own).
#
#   scripts/round_trip_cost_ab.sh A_BINARY B_BINARY [ROUNDS] [SECONDS]
#
# Prints one line per measurement: the six social-network queries (scale 1), `bench ops` 64 B
# reads (one, and batches of 32), TPC-B at 1 and 4 client processes (a fresh cluster per run),
# and per query q1 and q3 the per-round-trip budget: client CPU (perf stat task-clock, the
# difference of a 1 s and a 4 s run, so start-up cancels), the client's context switches, the
# servers' CPU (/proc utime+stime) and their voluntary context switches (sleeps). Run as root
# (namespaces). The load average is printed with every round: read ratios within a round.
set -euo pipefail
A=$(realpath "$1"); B=$(realpath "$2"); ROUNDS=${3:-3}; SECONDS_EACH=${4:-2}
WORK=$(mktemp -d /tmp/rtcost.XXXXXX)
DIRS=()
cleanup() { for d in "${DIRS[@]}"; do "$A" cluster down --dir "$d" >/dev/null 2>&1 || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

up() {  # up BINARY DIR: a 2-server TCP cluster in namespaces
  "$1" cluster up --dir "$2" --servers 2 --memory 1GiB --transport tcp --netns --progress event --replicas 0 >/dev/null
  DIRS+=("$2")
}
down() { "$A" cluster down --dir "$1" >/dev/null 2>&1 || true; }
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print(' '.join('%s=%s' % (k, round(d[k], 1) if isinstance(d[k], float) else d[k]) for k in sys.argv[1:]))" "$@"; }
queries() {
  python3 -c "
import json, sys
for q in json.load(sys.stdin)['queries']:
    print(sys.argv[1], q['query'], 'p50_us=%.0f p99_us=%.0f mean_us=%.0f round_trips=%.2f' % (
        q['p50_us'], q['p99_us'], q['mean_us'], q['round_trips_per_query']))" "$1"
}

up "$A" "$WORK/a"; up "$B" "$WORK/b"
"$A" bench social --cluster "$WORK/a/cluster.json" --engine pool --scale 1 --load-only >/dev/null
"$B" bench social --cluster "$WORK/b/cluster.json" --engine pool --scale 1 --load-only >/dev/null

for round in $(seq "$ROUNDS"); do
  echo "round $round: $(uptime | sed 's/.*load/load/')"
  for side in a b; do
    bin=$A; [ $side = b ] && bin=$B
    "$bin" bench social --cluster "$WORK/$side/cluster.json" --engine pool --scale 1 --attach \
      --seconds "$SECONDS_EACH" --query all --json | queries "$side"
    for batch in 1 32; do
      echo "$side ops read 64 B batch $batch $("$bin" bench ops --cluster "$WORK/$side/cluster.json" \
        --op read --size 64 --batch $batch --seconds "$SECONDS_EACH" --json | field p50_us p99_us)"
    done
  done
  for clients in 1 4; do
    for side in a b; do
      bin=$A; [ $side = b ] && bin=$B
      up "$bin" "$WORK/t$side"
      echo "$side tpcb clients $clients $("$bin" bench txn --cluster "$WORK/t$side/cluster.json" \
        --engine pool --workload tpcb --clients $clients --threads 1 --seconds "$SECONDS_EACH" \
        --json | field tps p50_us p99_us abort_rate round_trips_per_txn)"
      down "$WORK/t$side"
    done
  done
done

# Per-round-trip budget of q1 and q3.
servers_counters() {  # CPU ticks, voluntary and involuntary switches, summed over the servers
  local pids
  pids=$(python3 -c "import json; print(' '.join(str(s['pid']) for s in json.load(open('$1'))['servers']))")
  for p in $pids; do
    cat /proc/"$p"/task/*/stat | awk '{s += $14 + $15} END {print s}'
    awk '$1 == "voluntary_ctxt_switches:" {v += $2} $1 == "nonvoluntary_ctxt_switches:" {n += $2} END {print v, n}' /proc/"$p"/task/*/status
  done | paste -sd' '
}
for query in q1 q3; do
  for side in a b; do
    bin=$A; [ $side = b ] && bin=$B
    for s in 1 4; do
      servers_counters "$WORK/$side/cluster.json" > "$WORK/before$s"
      perf stat -x, -e task-clock,context-switches -o "$WORK/perf$s" "$bin" bench social \
        --cluster "$WORK/$side/cluster.json" --engine pool --scale 1 --attach --seconds $s \
        --query $query --json > "$WORK/q$s.json"
      servers_counters "$WORK/$side/cluster.json" > "$WORK/after$s"
    done
    python3 - "$WORK" "$side" "$(getconf CLK_TCK)" <<'PY'
import json, sys
work, side, hz = sys.argv[1], sys.argv[2], int(sys.argv[3])
def run(s):
    q = json.load(open(f"{work}/q{s}.json"))["queries"][0]
    perf = {}
    for line in open(f"{work}/perf{s}"):
        f = line.strip().split(",")
        if len(f) > 3 and f[0][:1].isdigit():
            perf[f[2]] = float(f[0])
    b = list(map(int, open(f"{work}/before{s}").read().split()))
    a = list(map(int, open(f"{work}/after{s}").read().split()))
    d = [x - y for x, y in zip(a, b)]
    return (q, q["count"] * q["round_trips_per_query"], perf["task-clock"] * 1e-3,
            perf["context-switches"], sum(d[0::3]) / hz, sum(d[1::3]), sum(d[2::3]))
q1, r1, c1, x1, s1, v1, n1 = run(1)
q4, r4, c4, x4, s4, v4, n4 = run(4)
rt = r4 - r1
print(f"{side} budget {q4['query']}: p50_us={q4['p50_us']:.0f} round_trips={q4['round_trips_per_query']:.2f} "
      f"wall_us_per_rt={4e6 / r4:.0f} client_cpu_us_per_rt={(c4 - c1) * 1e6 / rt:.1f} "
      f"client_switches_per_rt={(x4 - x1) / rt:.2f} servers_cpu_us_per_rt={(s4 - s1) * 1e6 / rt:.1f} "
      f"servers_sleeps_per_rt={(v4 - v1) / rt:.2f} servers_preempted_per_rt={(n4 - n1) / rt:.2f}")
PY
  done
done
echo "end: $(uptime | sed 's/.*load/load/')"
