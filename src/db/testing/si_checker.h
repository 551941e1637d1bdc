// A checker of snapshot isolation for list-append histories (the ideas of Jepsen's Elle,
// Kingsbury & Alvaro, VLDB 2020, on Adya's dependency graphs; our own code).
//
// The workload it judges: every key holds a list of int64 elements; a transaction's operations
// are reads of a key (the whole list) and appends of elements unique across the run. Each
// element names the transaction that appended it, and every list a read returns shows the
// order of the versions before it, so the version order of each key is recovered from the
// longest list observed, and every read is attributed to the write that produced it.
//
// What a history records per transaction (see Txn): its session, its outcome as the client saw
// it, for each key it read the list it observed BEFORE its own appends to that key (its external
// read; reads after its own appends are internal and not recorded), and for each key the
// elements it appended, in order. A transaction that read a key and appended to it wrote the
// list read + appends (the workload's appends are read-modify-writes).
//
// How it works:
//   1. Elements → (writer, key). Duplicates, garbage (an element no one appended) and elements
//      of aborted writers (G1a) in a read are reported.
//   2. Version order per key: every observed list (reads, and read + appends of committed
//      writers) must be a prefix of the longest one; otherwise "incompatible-order". A
//      version is the prefix ending with a committed writer's last element appended to the
//      key; a read ending with a writer's earlier element is an intermediate read (G1b).
//   3. Lost update: two committed transactions read the same version of a key and both
//      appended to it (first committer wins forbids it).
//   4. Dependency graph on committed transactions: ww (consecutive versions), wr (writer of
//      the version read → reader), rw (reader of a version → writer of the next version).
//   5. Cycles: G0 = a cycle of ww edges; G1c = a cycle of ww/wr edges with a wr edge;
//      G-single (read skew) = a cycle with exactly one rw edge (found as: an rw edge a→b with
//      b reaching a over ww/wr edges). Cycles with two or more rw edges (G2, write skew) are
//      allowed under snapshot isolation: counted, never reported as an anomaly.
//
// Transactions whose outcome is unknown (Commit failed with an error other than Aborted)
// count as committed if any of their elements was observed, else they are left out.
//
// Thread-safety: functions of values; no shared state.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "farpool/status.h"

namespace farpool::db::testing {

enum class Outcome : uint8_t { kCommitted, kAborted, kUnknown };

struct KeyRead {
  int64_t key = 0;
  std::vector<int64_t> list;  // as observed, before this transaction's own appends
};

struct KeyAppend {
  int64_t key = 0;
  std::vector<int64_t> elements;  // in the order appended
};

struct Txn {
  uint64_t id = 0;       // unique in the history
  uint64_t session = 0;  // the client session (process and thread) that ran it
  Outcome outcome = Outcome::kUnknown;
  // The client's view of when it ran (CLOCK_MONOTONIC ns, comparable across processes of a
  // host): informational, for reports.
  int64_t begin_ns = 0, end_ns = 0;
  std::vector<KeyRead> reads;      // at most one per key
  std::vector<KeyAppend> appends;  // at most one per key
};

// One JSON object per line:
//   {"id":1,"session":3,"outcome":"committed","begin_ns":..,"end_ns":..,
//    "reads":[[key,[e,...]],...],"appends":[[key,[e,...]],...]}
std::string FormatTxn(const Txn& txn);
Result<Txn> ParseTxn(std::string_view line);
// Reads every line of every file (a history is the union of per-session files). A later line
// with the same transaction id replaces the earlier one (an attempt is written as unknown
// before its Commit, so that a process killed in Commit leaves it, then with its outcome). A
// file's last line without its newline (a process killed while writing it) is skipped.
Result<std::vector<Txn>> LoadHistory(const std::vector<std::string>& paths);

struct Anomaly {
  // "G0", "G1a", "G1b", "G1c", "G-single", "lost-update", "incompatible-order",
  // "garbage-read", "duplicate-elements".
  std::string type;
  std::string explanation;  // the transactions, keys and edges involved
};

struct CheckReport {
  std::vector<Anomaly> anomalies;          // at most a few examples of each type
  std::map<std::string, uint64_t> counts;  // every anomaly found, by type
  uint64_t committed = 0, aborted = 0, unknown = 0;
  uint64_t ww_edges = 0, wr_edges = 0, rw_edges = 0;
  // rw edges on cycles with two or more rw edges and none with one: write skew (G2), which
  // snapshot isolation allows. Not an anomaly.
  uint64_t allowed_g2_edges = 0;

  bool ok() const { return counts.empty(); }
  bool Has(std::string_view type) const { return counts.count(std::string(type)) != 0; }
  // A multi-line summary: the counts, then the examples.
  std::string ToString() const;
};

CheckReport CheckSnapshotIsolation(const std::vector<Txn>& history);

}  // namespace farpool::db::testing
