// A TPC-W-buy-like transaction (seed 004, NAM-DB's distributed-transaction benchmark) on any
// engine of include/farpool/db.h: `farpool bench tpcw`.
//
// Schema (hash tables keyed by int64):
//   tw_customer  cid                 name char(24), cart_lines (1..5), orders
//   tw_cart      cid*8 + line        iid, qty (1..5)
//   tw_item      iid                 stock (initially 1000), restocks, price, title char(24)
//   tw_order     oid                 cid, lines, total, time
//   tw_order_line oid*8 + line       iid, qty, price
// Sizes: `customers` customers (each with 1..5 cart lines of uniform items), `items` items.
//
// The transaction (one per operation, retried on Aborted): pick a uniform customer; read it
// and its cart lines (one MultiGet, with the keys of all 5 possible lines); write the
// customer's order count + 1, the order and its order lines (oid unique per flow) with the
// prices still 0; read the cart's items (one MultiGet); for each line take `qty` from its
// item's stock (when the stock would fall below 10, restock it by 1000 as TPC-W does and count
// the restock), write it back; write the order lines again with the items' prices and the
// order with its total. 2 + 2·lines reads, 2 + 2·lines writes; items are spread over every
// server/partition, so most transactions are distributed. `for_update` (--for-update): both
// reads are MultiGetForUpdate with LockIntent::kUpdate; on the pool engines that is 2 rounds of
// lookup-lock-reads (the new rows inserted, locked, in the second) and the commit's 2 (no lock
// round): 4 round trips, against 6-7.
//
// Run: `flows` threads, one session each, warm-up then `seconds`; tps, p50/p99 latency of a
// committed transaction including its retries, abort rate, and per committed transaction the
// round trips (round_trips_per_txn, see TxnCounters) and operations (pool, local) or messages
// (sharded) of all its attempts. --verify: for every item,
// 1000 + 1000·restocks − stock == the quantity of it in all order lines, and every order line
// names its item's price; every order's total is that of its lines; the customers' order
// counts add up to the orders.
//
// Thread-safety: RunTpcwBench is a whole benchmark run; call it from one thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "farpool/db.h"
#include "farpool/status.h"

namespace farpool::workloads {

struct TpcwOptions {
  std::string cluster_file;
  Engine engine = Engine::kPool;
  uint64_t customers = 10000;
  uint64_t items = 10000;
  int flows = 1;
  double seconds = 2.0;
  double warmup_seconds = 0.3;
  uint64_t seed = 42;
  bool verify = false;
  // Read the rows the buy writes for update (LockIntent::kUpdate; see TpcwBuy).
  bool for_update = false;
};

Result<nlohmann::json> RunTpcwBench(const TpcwOptions& options);

// The parts of a run, for tests.
struct TpcwTables {
  const Table *customer, *cart, *item, *order, *order_line;
};
// Creates and loads the tables: options.customers customers with their carts (seeded by
// options.seed), options.items items. AlreadyExists if they exist.
Status LoadTpcw(Database& db, const TpcwOptions& options, TpcwTables* tables);
// One buy of customer `cid` as order `oid` (unique in the database) inside `txn`;
// `for_update`: its reads lock what it writes (TpcwOptions::for_update).
Status TpcwBuy(Transaction& txn, const TpcwTables& tables, int64_t cid, int64_t oid,
               bool for_update);
// The --verify checks, after orders_per_flow[f] orders with oids (f << 32) | 0..n-1 of each
// flow f; Internal naming what does not add up.
Status VerifyTpcw(Database& db, const TpcwOptions& options, const TpcwTables& tables,
                  const std::vector<uint64_t>& orders_per_flow);

}  // namespace farpool::workloads
