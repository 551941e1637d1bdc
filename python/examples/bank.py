#!/usr/bin/env python3
"""A bank on farpool, from Python: a local cluster of two memory servers, a table of accounts,
two threads moving money with transactions that retry on conflicts, and a check that no money
was created or lost. Run it with the repository's environment (after `make build`):

    .venv/bin/python python/examples/bank.py
"""
import random
import threading

import farpool

ACCOUNTS, START, TRANSFERS = 10, 100, 500


def main() -> None:
    with farpool.LocalCluster(servers=2, memory="64MiB") as cluster:
        db = farpool.Database.open(cluster=cluster.cluster_file)
        accounts = db.create_table("accounts", [("balance", "int64"), ("owner", "char", 16)],
                                   ordered=True)
        with db.transaction() as txn:
            for k in range(ACCOUNTS):
                txn.put(accounts, k, {"balance": START, "owner": f"customer {k}"})

        def teller(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(TRANSFERS):
                src, dst, amount = rng.sample(range(ACCOUNTS), 2) + [rng.randint(1, 20)]

                def transfer(txn: farpool.Transaction) -> None:
                    a, b = txn.multi_get([(accounts, src), (accounts, dst)])
                    if a["balance"] >= amount:  # no overdrafts
                        txn.put(accounts, src, {**a, "balance": a["balance"] - amount})
                        txn.put(accounts, dst, {**b, "balance": b["balance"] + amount})

                db.run(transfer)  # retried while it loses conflicts (farpool.Aborted)

        tellers = [threading.Thread(target=teller, args=(seed,)) for seed in (1, 2)]
        for t in tellers:
            t.start()
        for t in tellers:
            t.join()

        with db.transaction() as txn:
            rows = txn.scan(accounts)
        for key, row in rows:
            print(f"{key:2d}  {row['owner']:<12} {row['balance']:5d}")
        total = sum(row["balance"] for _, row in rows)
        assert total == ACCOUNTS * START, f"total {total}, expected {ACCOUNTS * START}"
        print(f"total {total}: money conserved over {2 * TRANSFERS} transfers")


if __name__ == "__main__":
    main()
