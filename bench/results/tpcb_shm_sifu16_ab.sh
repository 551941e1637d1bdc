#!/bin/sh
# Interleaved A/B over shm: main's binary and sifu16's, fresh 2-server cluster per run.
out=$1; : > $out
cat /proc/loadavg > $out.load
for round in 1 2; do for w in "tpcb --for-update" "tpcb" "bank"; do
  for bin in /tmp/sifu16-bin/farpool-main /tmp/sifu16-bin/farpool-sifu16; do
    rm -rf /tmp/sifu16-shm
    $bin cluster up --dir /tmp/sifu16-shm --servers 2 --transport shm --progress event --replicas 0 >/dev/null 2>&1 || { echo "up failed $bin" >&2; continue; }
    set -- $w; extra="--threads 1 --scale 1"; [ $1 = bank ] && extra="--threads 8 --accounts 10000"
    $bin bench txn --cluster /tmp/sifu16-shm/cluster.json --engine pool --workload $w \
        $extra --seconds 3 --warmup 0.5 --json 2>/dev/null | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r['binary']='$bin'; r['round']=$round; r['w']='$w'; print(json.dumps(r))" >> $out
    $bin cluster down --dir /tmp/sifu16-shm >/dev/null 2>&1; rm -rf /tmp/sifu16-shm
done; done; done
cat /proc/loadavg >> $out.load
