#include "workloads/tpcw.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bench/histogram.h"
#include "bench/run_context.h"
#include "workloads/txn_helpers.h"

namespace farpool::workloads {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kInitialStock = 1000;
constexpr int64_t kMaxLines = 5;  // cart lines of a customer: 1..kMaxLines
constexpr int kAttempts = 1 << 30;

const Schema& CustomerSchema() {
  static const Schema s{{"name", ColumnType::kChar, 24},
                        {"cart_lines", ColumnType::kInt64},
                        {"orders", ColumnType::kInt64}};
  return s;
}
const Schema& CartSchema() {
  static const Schema s{{"iid", ColumnType::kInt64}, {"qty", ColumnType::kInt64}};
  return s;
}
const Schema& ItemSchema() {
  static const Schema s{{"stock", ColumnType::kInt64},
                        {"restocks", ColumnType::kInt64},
                        {"price", ColumnType::kInt64},
                        {"title", ColumnType::kChar, 24}};
  return s;
}
const Schema& OrderSchema() {
  static const Schema s{{"cid", ColumnType::kInt64},
                        {"lines", ColumnType::kInt64},
                        {"total", ColumnType::kInt64},
                        {"time", ColumnType::kInt64}};
  return s;
}
const Schema& OrderLineSchema() {
  static const Schema s{
      {"iid", ColumnType::kInt64}, {"qty", ColumnType::kInt64}, {"price", ColumnType::kInt64}};
  return s;
}

}  // namespace

Status LoadTpcw(Database& db, const TpcwOptions& o, TpcwTables* t) {
  FARPOOL_ASSIGN_OR_RETURN(
      t->item, LoadTable(db, "tw_item", ItemSchema(), {false, o.items}, o.items, [&](uint64_t i) {
        Row r(ItemSchema());
        r.SetInt64(0, kInitialStock);
        r.SetInt64(1, 0);
        r.SetInt64(2, 100 + int64_t(i % 900));
        r.SetChar(3, "item " + std::to_string(i));
        return r;
      }));
  FARPOOL_ASSIGN_OR_RETURN(auto customers,
                           db.NewLoader("tw_customer", CustomerSchema(), {false, o.customers}));
  FARPOOL_ASSIGN_OR_RETURN(auto carts,
                           db.NewLoader("tw_cart", CartSchema(), {false, o.customers * 3}));
  std::mt19937_64 rng(o.seed);
  for (uint64_t c = 0; c < o.customers; ++c) {
    const int64_t lines = 1 + int64_t(rng() % kMaxLines);
    Row r(CustomerSchema());
    r.SetChar(0, "customer " + std::to_string(c));
    r.SetInt64(1, lines);
    r.SetInt64(2, 0);
    FARPOOL_RETURN_IF_ERROR(customers->Add(int64_t(c), r));
    for (int64_t l = 0; l < lines; ++l) {
      Row cl(CartSchema());
      cl.SetInt64(0, int64_t(rng() % o.items));
      cl.SetInt64(1, 1 + int64_t(rng() % 5));
      FARPOOL_RETURN_IF_ERROR(carts->Add(int64_t(c) * 8 + l, cl));
    }
  }
  FARPOOL_ASSIGN_OR_RETURN(t->customer, customers->Finish());
  FARPOOL_ASSIGN_OR_RETURN(t->cart, carts->Finish());
  FARPOOL_ASSIGN_OR_RETURN(t->order, db.CreateTable("tw_order", OrderSchema(), {false, 1 << 20}));
  FARPOOL_ASSIGN_OR_RETURN(t->order_line,
                           db.CreateTable("tw_order_line", OrderLineSchema(), {false, 1 << 22}));
  return Status::Ok();
}

// Two rounds of reads whatever the cart's size: the customer and every cart line it may have
// (lines past its count are simply not found), then every item of the cart. Two lines may name
// one item: they share its row. The customer's new order count, the order and its lines (price
// and total still 0) are written before the items are read, and the lines and the order again
// once the prices are known. With `for_update` both reads lock (LockIntent::kUpdate), and that
// order lets the commit skip its lock round (4 round trips on the pool engines, 6-7 without):
//  1. the customer is written; the cart lines are not (released unchanged at commit), and only
//     this customer's buys read them, which lock the customer in the same round anyway;
//  2. every item is written; the new order rows, Put before, go into the index in this round,
//     locked; and the commit skips its lock round only if this round covers every written
//     table (it reads their descriptors, NamTxn::CommitPrep): hence the customer's Put first.
Status TpcwBuy(Transaction& txn, const TpcwTables& t, int64_t cid, int64_t oid, bool for_update) {
  auto read = [&](std::span<const TableKey> keys, std::vector<Row>* rows,
                  std::vector<Status>* found) {
    return for_update ? txn.MultiGetForUpdate(keys, rows, found, LockIntent::kUpdate)
                      : txn.MultiGet(keys, rows, found);
  };
  std::vector<TableKey> keys{{t.customer, cid}};
  for (int64_t l = 0; l < kMaxLines; ++l) keys.push_back({t.cart, cid * 8 + l});
  std::vector<Row> rows;
  std::vector<Status> found;
  FARPOOL_RETURN_IF_ERROR(read(keys, &rows, &found));
  FARPOOL_RETURN_IF_ERROR(found[0]);
  Row& c = rows[0];
  const int64_t lines = c.GetInt64(1);
  if (lines < 1 || lines > kMaxLines) {
    return Status::Internal("tpcw: customer " + std::to_string(cid) + " has " +
                            std::to_string(lines) + " cart lines (expected 1.." +
                            std::to_string(kMaxLines) + ")");
  }
  std::vector<TableKey> item_keys;
  std::vector<size_t> item_of(lines);  // line -> index in item_keys
  std::vector<Row> order_lines(lines, Row(OrderLineSchema()));
  c.SetInt64(2, c.GetInt64(2) + 1);
  FARPOOL_RETURN_IF_ERROR(txn.Put(*t.customer, cid, c));
  Row order(OrderSchema());
  order.SetInt64(0, cid);
  order.SetInt64(1, lines);
  order.SetInt64(2, 0);
  order.SetInt64(3, oid);
  FARPOOL_RETURN_IF_ERROR(txn.Put(*t.order, oid, order));
  for (int64_t l = 0; l < lines; ++l) {
    FARPOOL_RETURN_IF_ERROR(found[1 + l]);
    const int64_t iid = rows[1 + l].GetInt64(0);
    auto same = std::find_if(item_keys.begin(), item_keys.end(),
                             [&](const TableKey& k) { return k.key == iid; });
    item_of[l] = size_t(same - item_keys.begin());
    if (same == item_keys.end()) item_keys.push_back({t.item, iid});
    order_lines[l].SetInt64(0, iid);
    order_lines[l].SetInt64(1, rows[1 + l].GetInt64(1));
    order_lines[l].SetInt64(2, 0);
    FARPOOL_RETURN_IF_ERROR(txn.Put(*t.order_line, oid * 8 + l, order_lines[l]));
  }
  std::vector<Row> items;
  FARPOOL_RETURN_IF_ERROR(read(item_keys, &items, &found));
  for (const Status& f : found) FARPOOL_RETURN_IF_ERROR(f);
  int64_t total = 0;
  for (int64_t l = 0; l < lines; ++l) {
    const int64_t iid = rows[1 + l].GetInt64(0), qty = rows[1 + l].GetInt64(1);
    Row& item = items[item_of[l]];
    int64_t stock = item.GetInt64(0);
    if (stock - qty < 10) {
      stock += kInitialStock;
      item.SetInt64(1, item.GetInt64(1) + 1);
    }
    item.SetInt64(0, stock - qty);
    FARPOOL_RETURN_IF_ERROR(txn.Put(*t.item, iid, item));
    order_lines[l].SetInt64(2, item.GetInt64(2));
    total += qty * item.GetInt64(2);
    FARPOOL_RETURN_IF_ERROR(txn.Put(*t.order_line, oid * 8 + l, order_lines[l]));
  }
  order.SetInt64(2, total);
  return txn.Put(*t.order, oid, order);
}

Status VerifyTpcw(Database& db, const TpcwOptions& o, const TpcwTables& t,
                  const std::vector<uint64_t>& orders_per_flow) {
  FARPOOL_ASSIGN_OR_RETURN(auto s, db.NewSession());
  std::unordered_map<int64_t, int64_t> sold;
  std::unordered_map<int64_t, int64_t> price;  // item -> the price its order lines name
  uint64_t orders = 0;
  for (int f = 0; f < int(orders_per_flow.size()); ++f) {
    for (uint64_t n = 0; n < orders_per_flow[f]; ++n) {
      const int64_t oid = (int64_t(f) << 32) | int64_t(n);
      FARPOOL_RETURN_IF_ERROR(RunTransaction(*s, [&](Transaction& txn) -> Status {
        Row order;
        FARPOOL_RETURN_IF_ERROR(txn.Get(*t.order, oid, &order));
        int64_t total = 0;
        for (int64_t l = 0; l < order.GetInt64(1); ++l) {
          Row ol;
          FARPOOL_RETURN_IF_ERROR(txn.Get(*t.order_line, oid * 8 + l, &ol));
          sold[ol.GetInt64(0)] += ol.GetInt64(1);
          total += ol.GetInt64(1) * ol.GetInt64(2);
          auto [seen, first] = price.emplace(ol.GetInt64(0), ol.GetInt64(2));
          if (!first && seen->second != ol.GetInt64(2)) {
            return Status::Internal(
                "tpcw verify: order lines sell item " + std::to_string(ol.GetInt64(0)) + " at " +
                std::to_string(seen->second) + " and at " + std::to_string(ol.GetInt64(2)));
          }
        }
        if (total != order.GetInt64(2)) {
          return Status::Internal("tpcw verify: order " + std::to_string(oid) + " totals " +
                                  std::to_string(order.GetInt64(2)) + ", its lines " +
                                  std::to_string(total));
        }
        return Status::Ok();
      }));
      ++orders;
    }
  }
  int64_t customer_orders = 0;
  Status st = RunTransaction(*s, [&](Transaction& txn) -> Status {
    customer_orders = 0;
    for (uint64_t i = 0; i < o.items; ++i) {
      Row item;
      FARPOOL_RETURN_IF_ERROR(txn.Get(*t.item, int64_t(i), &item));
      const int64_t taken = kInitialStock + kInitialStock * item.GetInt64(1) - item.GetInt64(0);
      auto sold_at = price.find(int64_t(i));
      if (sold_at != price.end() && sold_at->second != item.GetInt64(2)) {
        return Status::Internal("tpcw verify: item " + std::to_string(i) + " costs " +
                                std::to_string(item.GetInt64(2)) + " but was sold at " +
                                std::to_string(sold_at->second));
      }
      if (taken != sold[int64_t(i)]) {
        return Status::Internal("tpcw verify: item " + std::to_string(i) + " lost " +
                                std::to_string(taken) + " from stock but order lines hold " +
                                std::to_string(sold[int64_t(i)]));
      }
    }
    for (uint64_t c = 0; c < o.customers; ++c) {
      Row r;
      FARPOOL_RETURN_IF_ERROR(txn.Get(*t.customer, int64_t(c), &r));
      customer_orders += r.GetInt64(2);
    }
    return Status::Ok();
  });
  FARPOOL_RETURN_IF_ERROR(st);
  if (uint64_t(customer_orders) != orders) {
    return Status::Internal("tpcw verify: customers count " + std::to_string(customer_orders) +
                            " orders, the order table holds " + std::to_string(orders));
  }
  return Status::Ok();
}

Result<nlohmann::json> RunTpcwBench(const TpcwOptions& o) {
  if (o.flows < 1 || o.customers < 1 || o.items < 1) {
    return Status::InvalidArgument("--flows, --customers and --items must be at least 1");
  }
  DatabaseOptions dopts;
  dopts.engine = o.engine;
  dopts.cluster_file = o.cluster_file;
  dopts.max_sessions = std::max<uint32_t>(256, uint32_t(o.flows + 8));
  FARPOOL_ASSIGN_OR_RETURN(auto db, Database::Open(dopts));
  TpcwTables t;
  FARPOOL_RETURN_IF_ERROR(LoadTpcw(*db, o, &t));
  struct Flow {
    Histogram lat;
    uint64_t commits = 0, aborts = 0, orders = 0;
    TxnCounters from, to;  // the session's counts when measuring started and ended
    Status status;
  };
  std::vector<Flow> flows(o.flows);
  std::vector<std::thread> threads;
  const uint64_t clock_ns = ClockOverheadNs();
  // One measured window for every flow (a flow that starts late still counts in it only), so
  // the sum of commits over the window is a throughput.
  const auto from = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(0.2 + o.warmup_seconds));
  const auto until =
      from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  for (int f = 0; f < o.flows; ++f) {
    threads.emplace_back([&, f] {
      Flow& st = flows[f];
      auto session = db->NewSession();
      if (!session.ok()) {
        st.status = session.status();
        return;
      }
      std::mt19937_64 rng(o.seed * 31 + f);
      uint64_t aborts_from = 0;
      bool measuring = false;
      for (;;) {
        const auto t0 = Clock::now();
        if (t0 >= until) break;
        if (!measuring && t0 >= from) {
          measuring = true;
          st.from = (*session)->counters();
          aborts_from = st.from.aborts;
        }
        const int64_t cid = int64_t(rng() % o.customers);
        const int64_t oid = (int64_t(f) << 32) | int64_t(st.orders);
        Status s = RunTransaction(
            **session, [&](Transaction& txn) { return TpcwBuy(txn, t, cid, oid, o.for_update); },
            kAttempts);
        const auto t1 = Clock::now();
        if (!s.ok()) {
          st.status = s;
          return;
        }
        ++st.orders;
        if (measuring && t1 <= until) {
          ++st.commits;
          const uint64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
          st.lat.Record(ns > clock_ns ? ns - clock_ns : 0);
        }
      }
      if (!measuring) st.from = (*session)->counters();
      st.to = (*session)->counters();
      st.aborts = st.to.aborts - aborts_from;
    });
  }
  for (auto& th : threads) th.join();
  Histogram lat;
  uint64_t commits = 0, aborts = 0;
  TxnCounters ops;  // over the measured window, every flow
  std::vector<uint64_t> orders;
  for (auto& f : flows) {
    FARPOOL_RETURN_IF_ERROR(f.status);
    lat.Merge(f.lat);
    commits += f.commits;
    aborts += f.aborts;
    ops.reads += f.to.reads - f.from.reads;
    ops.writes += f.to.writes - f.from.writes;
    ops.cas += f.to.cas - f.from.cas;
    ops.faa += f.to.faa - f.from.faa;
    ops.messages += f.to.messages - f.from.messages;
    ops.round_trips += f.to.round_trips - f.from.round_trips;
    orders.push_back(f.orders);
  }
  const double per = commits > 0 ? double(commits) : 1.0;
  nlohmann::json r = RunContext();
  r["bench"] = "tpcw";
  r["engine"] = std::string(EngineName(o.engine));
  r["customers"] = o.customers;
  r["items"] = o.items;
  r["flows"] = o.flows;
  r["for_update"] = o.for_update;
  r["seconds"] = o.seconds;
  r["commits"] = commits;
  r["tps"] = commits / o.seconds;
  r["p50_us"] = lat.Percentile(0.5) / 1000.0;
  r["p99_us"] = lat.Percentile(0.99) / 1000.0;
  r["abort_rate"] = commits + aborts ? double(aborts) / double(commits + aborts) : 0.0;
  r["round_trips_per_txn"] = ops.round_trips / per;
  r["reads_per_txn"] = ops.reads / per;
  r["writes_per_txn"] = ops.writes / per;
  r["cas_per_txn"] = ops.cas / per;
  r["faa_per_txn"] = ops.faa / per;
  r["messages_per_txn"] = ops.messages / per;
  r["seed"] = o.seed;
  if (o.verify) {
    FARPOOL_RETURN_IF_ERROR(VerifyTpcw(*db, o, t, orders));
    r["verify"] = "ok";
  }
  return r;
}

}  // namespace farpool::workloads
