"""One traced SIGKILL of the coordinator under TPC-B (tcp, netns, replicas 1), as the failover
harness runs it, with etcd polled every 5 ms: the times (ms after the kill) at which the victim's
alive key went, another coordinator key appeared, and the map reached epoch 2; the first commit
after the kill and the commits after it (from the bench's timeline).

Usage (the binary from $FARPOOL_BIN, else build/farpool):
  PYTHONPATH=$PWD/python FARPOOL_BIN=... .venv/bin/python -m farpool.harness.coordtrace
Prints one JSON line (times in ms after the kill; timeline_after: commits per 10 ms bucket in the
1.5 s after it), then the bench's stderr lines stamped as they arrived, then the tails of the
servers' logs. Not part of the failover harness's tables: a diagnostic (docs/pool.md "The
coordinator's death under load").
"""
import base64
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request

from farpool.harness import failover as fo

def b64(s): return base64.b64encode(s.encode()).decode()

def rng(ep, prefix):
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    req = urllib.request.Request(ep + "/v3/kv/range", data=json.dumps(
        {"key": b64(prefix), "range_end": b64(end)}).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=1) as r:
        kvs = json.load(r).get("kvs", [])
    return {base64.b64decode(k["key"]).decode(): base64.b64decode(k.get("value", "")).decode()
            for k in kvs}

def main():
    with fo.cluster("tcp", 1) as path:
        cfg = json.load(open(path))
        ep = cfg["etcd"]["endpoints"][0]; prefix = cfg["etcd"]["prefix"]
        victim = fo.coordinator_of(path)
        pid = cfg["servers"][victim]["pid"]
        events = {}; stop = False
        def poll():
            while not stop:
                try: kv = rng(ep, prefix)
                except Exception: time.sleep(0.005); continue
                t = time.time() * 1000
                coord = kv.get(prefix + "coordinator")
                alive = [k for k in kv if "/alive/" in k]
                m = kv.get(prefix + "map")
                epoch = json.loads(m)["epoch"] if m else 0
                events.setdefault("victim_alive_gone", None)
                if not any(k.endswith("/alive/%d" % victim) for k in alive) and events["victim_alive_gone"] is None:
                    events["victim_alive_gone"] = t
                if coord is None and "coordinator_key_gone" not in events: events["coordinator_key_gone"] = t
                if coord is not None and coord != str(victim) and "new_coordinator" not in events:
                    events["new_coordinator"] = t; events["new_coordinator_id"] = coord
                if epoch >= 2 and "map_epoch2" not in events: events["map_epoch2"] = t
                time.sleep(0.005)
        cmd = fo.bench_args(path, "tpcb", 8) + ["--timeline-ms", "10", "--warmup", "0.5"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = proc.stderr.readline()
        th = threading.Thread(target=poll); th.start()
        lines = []
        def read_err():
            for l in proc.stderr: lines.append((time.time() * 1000, l.rstrip()))
        te = threading.Thread(target=read_err); te.start()
        time.sleep(3)
        kill_ms = time.time() * 1000
        os.kill(pid, signal.SIGKILL)
        out = proc.stdout.read(); proc.wait(timeout=600); te.join()
        err = "\n".join(l for _, l in lines)
        stop = True; th.join()
        logs = {}
        for i in range(len(cfg["servers"])):
            try: logs[i] = open(os.path.join(os.path.dirname(path), "server-%d.log" % i)).read()[-1500:]
            except OSError: pass
    r = json.loads(out.strip().splitlines()[-1]); t = r["timeline"]
    k = (kill_ms - t["start_unix_ms"]) / t["bucket_ms"]
    commits = t["commits"]
    after = next(b for b in range(int(k) + 1, len(commits)) if commits[b] > 0)
    res = {"victim": victim, "load": open("/proc/loadavg").read().split()[:3],
           "first_commit_ms": after * t["bucket_ms"] - (kill_ms - t["start_unix_ms"]),
           "session_restarts": r.get("session_restarts"), "commits_cut": r.get("commits_cut"),
           "bench_stderr": [l for l in err.splitlines() if "session" in l][:10]}
    for key, v in events.items():
        res[key] = v - kill_ms if isinstance(v, float) else v
    # Commits per 10 ms bucket in the 1.5 s after the kill.
    res["timeline_after"] = commits[int(k) + 1:int(k) + 151]
    print(json.dumps(res))
    for t0, l in lines:
        if t0 >= kill_ms - 50: print("%+8.0f ms %s" % (t0 - kill_ms, l[:200]))
    for i, l in logs.items(): print("---- server", i, "\n", l)

if __name__ == "__main__":
    main()
