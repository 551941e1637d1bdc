#!/bin/bash
# A developer diagnostic, not one of bench/experiments/: one 64 B read over TCP, farpool against
# raw UCX like for like (docs/pool.md, "Measured: the cost of a round trip over TCP").
#
#   scripts/read_vs_rawucx.sh FARPOOL_BINARY RAWUCX_BINARY [ROUNDS] [SECONDS] [BATCH] > OUT.jsonl
#
# Per round, for each place (loopback: the target on 127.0.0.1; netns: the target in its own
# network namespace, reached over a veth pair and a bridge, as `cluster up --netns` places
# servers) and each progress mode of the target (busy: it polls without pause; event: it
# sleeps on its worker's event descriptor whenever a progress finds nothing):
#   - farpool: a 1-server cluster over TCP in that mode, `bench ops --op read --size 64`
#     (farpool's client always sleeps between messages: pool.cc AwaitReply);
#   - rawucx-<client mode>: `farpool-rawucx` get of 64 B, its target in the same mode and place,
#     the client in event mode (like farpool's) and, for busy targets, in busy mode too.
# A busy target spins on a core: each configuration has its own cluster, up only while it is
# measured. Prints one JSON object per measurement (with the load average at its start). Run as
# root (namespaces).
set -euo pipefail
FP=$(realpath "$1"); RAW=$(realpath "$2"); ROUNDS=${3:-3}; SECONDS_EACH=${4:-2}; BATCH=${5:-1}
WORK=$(mktemp -d /tmp/rtcost-raw.XXXXXX)
UP=""
cleanup() { [ -n "$UP" ] && "$FP" cluster down --dir "$UP" >/dev/null 2>&1; rm -rf "$WORK"; }
trap cleanup EXIT

emit() {  # emit SYSTEM PLACE PROGRESS JSON: the measurement with its labels and the load
  python3 -c "
import json, sys
d = json.loads(sys.argv[4])
print(json.dumps({'system': sys.argv[1], 'place': sys.argv[2], 'target_progress': sys.argv[3],
                  'batch': int(sys.argv[6]), 'p50_us': round(d['p50_us'], 2),
                  'p99_us': round(d['p99_us'], 2), 'mean_us': round(d['mean_us'], 2),
                  'loadavg': sys.argv[5]}))" "$1" "$2" "$3" "$4" "$(cut -d' ' -f1 /proc/loadavg)" "$BATCH"
}

for round in $(seq "$ROUNDS"); do
  for place in loopback netns; do
    for progress in event busy; do
      dir=$WORK/$place-$progress
      netns_flag=""; [ $place = netns ] && netns_flag="--netns"
      "$FP" cluster up --dir "$dir" --servers 1 --memory 256MiB --transport tcp $netns_flag \
        --progress $progress --replicas 0 >/dev/null
      UP=$dir
      emit farpool $place $progress "$("$FP" bench ops --cluster "$dir/cluster.json" --op read \
        --size 64 --batch "$BATCH" --seconds "$SECONDS_EACH" --json)"
      # The raw target where the farpool server is (its namespace). A busy farpool server would
      # take a core: the cluster is brought up again in event progress (its server then sleeps).
      if [ $place = loopback ] || [ $progress = busy ]; then
        "$FP" cluster down --dir "$dir" >/dev/null 2>&1 || true
        UP=""
      fi
      if [ $place = netns ]; then
        if [ $progress = busy ]; then
          "$FP" cluster up --dir "$dir" --servers 1 --memory 64MiB --transport tcp --netns \
            --progress event --replicas 0 >/dev/null
          UP=$dir
        fi
        read -r ns host < <(python3 -c "
import json; s = json.load(open('$dir/cluster.json'))['servers'][0]
print(s['netns'], s['address'].rsplit(':', 1)[0])")
        srv_dev=$(ip netns exec "$ns" ip -o -4 addr show | awk -v h="$host" '$4 ~ "^"h"/" {print $2}')
        cli_dev=$(ip -o -4 route get "$host" | sed -n 's/.* dev \([^ ]*\).*/\1/p')
        prefix=(ip netns exec "$ns" env UCX_TLS=tcp,self UCX_NET_DEVICES="$srv_dev")
        client_env=(env UCX_TLS=tcp,self UCX_NET_DEVICES="$cli_dev")
      else
        host=127.0.0.1
        prefix=(env UCX_TLS=tcp,self)
        client_env=(env UCX_TLS=tcp,self)
      fi
      clients=(event); [ $progress = busy ] && clients=(event busy)
      for client in "${clients[@]}"; do
        port=$((19700 + RANDOM % 200))
        "${prefix[@]}" "$RAW" server --listen "$host" --port $port --progress $progress \
          > "$WORK/raw.out" 2>&1 &
        raw_pid=$!
        for _ in $(seq 50); do grep -q ready "$WORK/raw.out" 2>/dev/null && break; sleep 0.1; done
        # Bounded: under heavy load a raw UCX client was once seen never to get its first reply
        # (its target spinning, its socket silent); such a run is reported as lost.
        out=$("${client_env[@]}" timeout $((SECONDS_EACH + 30)) "$RAW" client --host "$host" \
          --port $port --op get --size 64 --batch "$BATCH" --progress $client \
          --seconds "$SECONDS_EACH" || true)
        if [ -n "$out" ]; then
          emit rawucx-client-$client $place $progress "$out"
        else
          echo "{\"system\": \"rawucx-client-$client\", \"place\": \"$place\", \"target_progress\": \"$progress\", \"lost\": true}"
          kill $raw_pid 2>/dev/null || true
        fi
        wait $raw_pid || true
      done
      if [ -n "$UP" ]; then "$FP" cluster down --dir "$dir" >/dev/null 2>&1 || true; fi
      UP=""
    done
  done
done
