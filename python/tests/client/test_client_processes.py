"""Several Python processes on one database: the bank invariant (money is conserved, and every
snapshot sees it conserved) under concurrent transfers with conflicts."""
import json
import random
import subprocess
import sys

import farpool

ACCOUNTS, START = 16, 1000

# One worker process: random transfers between the accounts (retried on Aborted by run()),
# and every 25 transfers a read-only snapshot of every account, whose total must be the
# bank's. Prints what it did as JSON; exits non-zero, saying why, on a broken invariant.
WORKER = r"""
import json, random, sys
import farpool
cluster_file, table, seed, transfers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
accounts, total = int(sys.argv[5]), int(sys.argv[6])
rng = random.Random(seed)
db = farpool.Database.open(cluster=cluster_file)
t = db.open_table(table)
attempts = 0
for i in range(transfers):
    src, dst, amount = rng.randrange(accounts), rng.randrange(accounts), rng.randint(1, 50)
    def transfer(txn):
        global attempts
        attempts += 1
        a, b = txn.multi_get([(t, src), (t, dst)])
        if src != dst:
            txn.put(t, src, {"balance": a["balance"] - amount})
            txn.put(t, dst, {"balance": b["balance"] + amount})
    db.run(transfer)
    if i % 25 == 0:
        with db.transaction() as txn:
            seen = sum(r["balance"] for r in txn.multi_get([(t, k) for k in range(accounts)]))
        if seen != total:
            sys.exit(f"seed {seed}: a snapshot after {i} transfers holds {seen}, not {total}")
print(json.dumps({"seed": seed, "transfers": transfers, "attempts": attempts}))
"""


def test_processes_keep_the_bank_invariant(cluster, db):
    t = db.create_table("bank_processes", [("balance", "int64")])
    with db.transaction() as txn:
        for k in range(ACCOUNTS):
            txn.put(t, k, {"balance": START})
    total = ACCOUNTS * START
    seed = random.randrange(1 << 30)
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, cluster.cluster_file, t.name,
                                 str(seed + w), "200", str(ACCOUNTS), str(total)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for w in range(3)]
    reports = []
    for w in workers:
        out, err = w.communicate(timeout=600)  # a guard against a hang, not a speed check
        assert w.returncode == 0, f"worker (seeds from {seed}) failed: {err}"
        reports.append(json.loads(out))
    assert sum(r["transfers"] for r in reports) == 600
    with db.transaction() as txn:
        balances = [r["balance"] for r in txn.multi_get([(t, k) for k in range(ACCOUNTS)])]
    assert sum(balances) == total, f"seeds from {seed}: {balances}"
    assert balances != [START] * ACCOUNTS  # the transfers did move money
