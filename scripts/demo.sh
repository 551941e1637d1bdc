#!/usr/bin/env bash
# The main job (`make demo`): start a local cluster, show it, run the operations benchmark
# against its peers (local memory, raw UCX, Redis) and print the table, stop the cluster.
# Until the database lands this is the pool's own benchmark; see README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=$(mktemp -d /tmp/farpool-demo-XXXXXX)
trap './build/farpool cluster down --dir "$DIR" >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT

echo "== starting a local cluster: 4 memory servers x 256 MiB over shared memory"
./build/farpool cluster up --dir "$DIR" --servers 4 --memory 256MiB --transport shm --progress event
./build/farpool cluster status --dir "$DIR"
echo
echo "== one client: 64 B reads and fetch-and-adds on the pool (striped over the 4 servers)"
./build/farpool bench ops --cluster "$DIR/cluster.json" --op read --size 64 --seconds 1 --verify
./build/farpool bench ops --cluster "$DIR/cluster.json" --op faa --seconds 1 --verify
./build/farpool cluster status --dir "$DIR"
./build/farpool cluster down --dir "$DIR"
echo
echo "== farpool vs its peers, same machine, same run (bench/ops_vs_peers --quick)"
python3 bench/ops_vs_peers --quick --seconds 1 --out "$DIR/results"
