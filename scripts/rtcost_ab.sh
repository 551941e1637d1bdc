#!/bin/bash
# A developer A/B diagnostic (docs/pool.md, "Measured: the cost of a round trip over TCP"):
# binary A against binary B, interleaved rounds, each on clusters of its own servers.
#
#   scripts/rtcost_ab.sh A_BINARY B_BINARY [ROUNDS] [SECONDS] > OUT.jsonl
#
# Per round and side: `bench ops --op read --size 64`, batch 1 and 32, on a 1-server cluster
# over TCP in a network namespace (event progress), with the client's and the server's CPU and
# context switches per round trip (perf stat, the server attached for the measured window); the
# six social-network queries at scale 10 over TCP on a 2-server cluster in namespaces (event
# progress, replicas 0; loaded once per side); and the same over shm (`--transport shm`), where
# nothing may get slower. One JSON object per measurement, with the load average at its start.
# Run as root (namespaces).
set -euo pipefail
A=$(realpath "$1"); B=$(realpath "$2"); ROUNDS=${3:-3}; SECONDS_EACH=${4:-2}
WORK=$(mktemp -d /tmp/rtcost-ab.XXXXXX)
DIRS=()
cleanup() { for d in "${DIRS[@]}"; do "$A" cluster down --dir "$d" >/dev/null 2>&1 || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
bin_of() { if [ "$1" = a ]; then echo "$A"; else echo "$B"; fi; }
load() { cut -d' ' -f1 /proc/loadavg; }

for side in a b; do
  bin=$(bin_of $side)
  "$bin" cluster up --dir "$WORK/$side-ops" --servers 1 --memory 256MiB --transport tcp --netns \
    --progress event --replicas 0 >/dev/null
  DIRS+=("$WORK/$side-ops")
  for fabric in tcp shm; do
    netns=""; [ $fabric = tcp ] && netns="--netns"
    "$bin" cluster up --dir "$WORK/$side-$fabric" --servers 2 --memory 1GiB --transport $fabric \
      $netns --progress event --replicas 0 >/dev/null
    DIRS+=("$WORK/$side-$fabric")
    "$bin" bench social --engine pool --cluster "$WORK/$side-$fabric/cluster.json" --scale 10 \
      --load-only >/dev/null
  done
done

ops() {  # ops SIDE BATCH
  local bin dir pids
  bin=$(bin_of "$1"); dir=$WORK/$1-ops
  pids=$(python3 -c "import json; print(','.join(str(s['pid']) for s in json.load(open('$dir/cluster.json'))['servers']))")
  local l; l=$(load)
  perf stat -x, -e task-clock,context-switches -p "$pids" -o "$WORK/srv.txt" -- \
    sleep "$(python3 -c "print($SECONDS_EACH + 0.4)")" &
  local perf_pid=$!
  perf stat -x, -e task-clock,context-switches -o "$WORK/cli.txt" "$bin" bench ops \
    --cluster "$dir/cluster.json" --op read --size 64 --batch "$2" --seconds "$SECONDS_EACH" \
    --warmup 0.3 --working-set 65536 --json > "$WORK/ops.json"
  wait $perf_pid
  python3 - "$1" "$2" "$l" "$SECONDS_EACH" "$WORK" <<'EOF'
import json, sys
side, batch, load, secs, work = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5]
d = json.load(open(work + '/ops.json'))
def perf(f):
    out = {}
    for line in open(f):
        p = line.strip().split(',')
        if len(p) > 3 and p[0] and p[0][0].isdigit():
            out[p[2]] = float(p[0])
    return out
c, s = perf(work + '/cli.txt'), perf(work + '/srv.txt')
rt = d['ops_per_s'] / batch  # round trips per second while measured
# The client's counters cover its whole run (connect, warm-up, measured time, teardown): per
# round trip over the warm-up and measured time. The server's cover the measured time and 0.4 s.
client_rts, server_rts = rt * (secs + 0.3), rt * secs
print(json.dumps({'side': side, 'what': 'ops read 64 B', 'fabric': 'tcp netns', 'batch': batch,
                  'p50_us': round(d['p50_us'], 2), 'p99_us': round(d['p99_us'], 2),
                  'mean_us': round(d['mean_us'], 2),
                  'client_cpu_us_per_rt': round(c['task-clock'] * 1e3 / client_rts, 2),
                  'client_cs_per_rt': round(c['context-switches'] / client_rts, 2),
                  'server_cpu_us_per_rt': round(s['task-clock'] * 1e3 / server_rts, 2),
                  'server_cs_per_rt': round(s['context-switches'] / server_rts, 2),
                  'loadavg': load}))
EOF
}

social() {  # social SIDE FABRIC
  local bin l
  bin=$(bin_of "$1"); l=$(load)
  "$bin" bench social --engine pool --cluster "$WORK/$1-$2/cluster.json" --scale 10 --attach \
    --query all --json --seconds "$SECONDS_EACH" --warmup 2 |
    python3 -c "
import json, sys
for q in json.load(sys.stdin)['queries']:
    print(json.dumps({'side': sys.argv[1], 'what': 'social ' + q['query'], 'fabric': sys.argv[2],
                      'p50_us': round(q['p50_us'], 1), 'p99_us': round(q['p99_us'], 1),
                      'mean_us': round(q['mean_us'], 1),
                      'round_trips': round(q['round_trips_per_query'], 2), 'loadavg': sys.argv[3]}))
" "$1" "$2" "$l"
}

for round in $(seq "$ROUNDS"); do
  for side in a b; do
    ops $side 1
    ops $side 32
    social $side tcp
    social $side shm
  done
done
