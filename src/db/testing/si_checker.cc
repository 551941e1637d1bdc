#include "db/testing/si_checker.h"

#include <algorithm>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>

namespace farpool::db::testing {
namespace {

constexpr size_t kExamplesPerType = 5;

std::string_view OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kCommitted:
      return "committed";
    case Outcome::kAborted:
      return "aborted";
    case Outcome::kUnknown:
      return "unknown";
  }
  return "unknown";
}

// A list for a report: long lists show their first and last few elements.
std::string ListText(const std::vector<int64_t>& list) {
  std::string s = "[";
  for (size_t i = 0; i < list.size(); ++i) {
    if (list.size() > 8 && i == 3) {
      s += "(" + std::to_string(list.size() - 6) + " more),";
      i = list.size() - 4;
      continue;
    }
    s += std::to_string(list[i]) + (i + 1 < list.size() ? "," : "");
  }
  return s + "]";
}

bool IsPrefix(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

enum class EdgeType : uint8_t { kWW, kWR, kRW };

std::string_view EdgeName(EdgeType t) {
  return t == EdgeType::kWW ? "ww" : t == EdgeType::kWR ? "wr" : "rw";
}

struct Edge {
  uint32_t to;
  EdgeType type;
  int64_t key;
};

// Where an appended element came from.
struct ElementOwner {
  uint32_t txn;
  int64_t key;
  bool last;  // the writer's last element appended to that key
};

class Checker {
 public:
  explicit Checker(const std::vector<Txn>& h) : h_(h) {}

  CheckReport Run() {
    IndexElements();
    ResolveOutcomes();
    for (const auto& [key, _] : keys_) CheckKey(key);
    FindCycles();
    return std::move(report_);
  }

 private:
  void Report(const std::string& type, const std::string& explanation) {
    if (report_.counts[type]++ < kExamplesPerType) report_.anomalies.push_back({type, explanation});
  }
  std::string Name(uint32_t t) const {
    const Txn& x = h_[t];
    return "T" + std::to_string(x.id) + "(session " + std::to_string(x.session) + ", " +
           std::string(OutcomeName(x.outcome)) + ")";
  }
  const std::vector<int64_t>* AppendsOf(uint32_t t, int64_t key) const {
    for (const auto& a : h_[t].appends)
      if (a.key == key) return &a.elements;
    return nullptr;
  }
  const std::vector<int64_t>* ReadOf(uint32_t t, int64_t key) const {
    for (const auto& r : h_[t].reads)
      if (r.key == key) return &r.list;
    return nullptr;
  }

  void IndexElements() {
    for (uint32_t t = 0; t < h_.size(); ++t) {
      for (const auto& a : h_[t].appends) {
        keys_[a.key];
        for (size_t i = 0; i < a.elements.size(); ++i) {
          const int64_t e = a.elements[i];
          auto [it, fresh] = owner_.emplace(e, ElementOwner{t, a.key, i + 1 == a.elements.size()});
          if (!fresh) {
            Report("duplicate-elements", "element " + std::to_string(e) + " appended by both " +
                                             Name(it->second.txn) + " and " + Name(t));
          }
        }
      }
      for (const auto& r : h_[t].reads) keys_[r.key];
    }
  }

  // Committed transactions, and unknown ones whose elements a committed read observed.
  void ResolveOutcomes() {
    committed_.assign(h_.size(), false);
    for (uint32_t t = 0; t < h_.size(); ++t) {
      committed_[t] = h_[t].outcome == Outcome::kCommitted;
      if (h_[t].outcome == Outcome::kCommitted) ++report_.committed;
      if (h_[t].outcome == Outcome::kAborted) ++report_.aborted;
      if (h_[t].outcome == Outcome::kUnknown) ++report_.unknown;
    }
    for (uint32_t t = 0; t < h_.size(); ++t) {
      if (!committed_[t]) continue;
      for (const auto& r : h_[t].reads) {
        for (int64_t e : r.list) {
          auto it = owner_.find(e);
          if (it != owner_.end() && h_[it->second.txn].outcome == Outcome::kUnknown)
            committed_[it->second.txn] = true;
        }
      }
    }
    index_.assign(h_.size(), -1);
    for (uint32_t t = 0; t < h_.size(); ++t) {
      if (committed_[t]) {
        index_[t] = static_cast<int>(nodes_.size());
        nodes_.push_back(t);
      }
    }
    adj_.resize(nodes_.size());
  }

  void AddEdge(uint32_t from, uint32_t to, EdgeType type, int64_t key) {
    if (from == to) return;
    adj_[index_[from]].push_back({static_cast<uint32_t>(index_[to]), type, key});
    if (type == EdgeType::kWW) ++report_.ww_edges;
    if (type == EdgeType::kWR) ++report_.wr_edges;
    if (type == EdgeType::kRW) ++report_.rw_edges;
  }

  void CheckKey(int64_t key) {
    const std::string k = "key " + std::to_string(key);
    // Observed lists of this key: committed reads, and read + appends of committed writers.
    struct Observed {
      uint32_t txn;
      std::vector<int64_t> list;
      bool written;
    };
    std::vector<Observed> obs;
    for (uint32_t t = 0; t < h_.size(); ++t) {
      if (!committed_[t]) continue;
      const auto* read = ReadOf(t, key);
      if (!read) continue;
      obs.push_back({t, *read, false});
      if (const auto* app = AppendsOf(t, key)) {
        std::vector<int64_t> w = *read;
        w.insert(w.end(), app->begin(), app->end());
        obs.push_back({t, std::move(w), true});
      }
    }
    // Element-level checks of what committed transactions read.
    for (const auto& o : obs) {
      if (o.written) continue;
      std::set<int64_t> seen;
      for (int64_t e : o.list) {
        if (!seen.insert(e).second) {
          Report("duplicate-elements", Name(o.txn) + " read " + k + " = " + ListText(o.list) +
                                           " with element " + std::to_string(e) + " twice");
        }
        auto it = owner_.find(e);
        if (it == owner_.end() || it->second.key != key) {
          Report("garbage-read", Name(o.txn) + " read " + k + " = " + ListText(o.list) +
                                     ": no transaction appended " + std::to_string(e) + " to it");
        } else if (h_[it->second.txn].outcome == Outcome::kAborted) {
          Report("G1a", Name(o.txn) + " read " + k + " = " + ListText(o.list) + " containing " +
                            std::to_string(e) + ", appended by aborted " + Name(it->second.txn));
        }
      }
      if (!o.list.empty()) {
        auto it = owner_.find(o.list.back());
        if (it != owner_.end() && it->second.key == key && !it->second.last &&
            h_[it->second.txn].outcome != Outcome::kAborted && it->second.txn != o.txn) {
          Report("G1b", Name(o.txn) + " read " + k + " = " + ListText(o.list) +
                            ", an intermediate state of " + Name(it->second.txn) +
                            " (which appended " + ListText(*AppendsOf(it->second.txn, key)) + ")");
        }
      }
    }
    // Version order: the longest observed list; every other must be its prefix.
    const std::vector<int64_t>* longest = nullptr;
    for (const auto& o : obs)
      if (!longest || o.list.size() > longest->size()) longest = &o.list;
    static const std::vector<int64_t> kEmpty;
    const std::vector<int64_t>& order = longest ? *longest : kEmpty;
    // Lost updates: committed read-modify-writes of the same version. Their written lists
    // disagree by construction, so those are not reported again as incompatible orders.
    std::map<int64_t, std::vector<uint32_t>> rmw_by_version;  // read version's last element
    constexpr int64_t kInitial = INT64_MIN;
    for (const auto& o : obs) {
      if (!o.written && AppendsOf(o.txn, key))
        rmw_by_version[o.list.empty() ? kInitial : o.list.back()].push_back(o.txn);
    }
    std::set<uint32_t> lost;
    for (const auto& [last, txns] : rmw_by_version) {
      if (txns.size() < 2) continue;
      std::string who;
      for (uint32_t t : txns) {
        who += (who.empty() ? "" : ", ") + Name(t);
        lost.insert(t);
      }
      Report("lost-update",
             std::to_string(txns.size()) + " committed transactions read the same version of " + k +
                 " (ending " + (last == kInitial ? "initial" : std::to_string(last)) +
                 ") and appended to it: " + who);
    }
    for (const auto& o : obs) {
      if (o.written && lost.count(o.txn)) continue;
      if (!IsPrefix(o.list, order)) {
        Report("incompatible-order", Name(o.txn) + (o.written ? " wrote " : " read ") + k + " = " +
                                         ListText(o.list) + ", not a prefix of " + ListText(order) +
                                         " (another observed order)");
      }
    }
    // Versions: prefixes ending with a committed writer's last element.
    std::vector<uint32_t> writers;                   // version i+1's writer (0 = initial)
    std::unordered_map<int64_t, size_t> version_of;  // last element → version number
    for (int64_t e : order) {
      auto it = owner_.find(e);
      if (it == owner_.end() || it->second.key != key || !it->second.last) continue;
      if (!committed_[it->second.txn]) continue;
      writers.push_back(it->second.txn);
      version_of[e] = writers.size();
    }
    for (size_t i = 1; i < writers.size(); ++i)
      AddEdge(writers[i - 1], writers[i], EdgeType::kWW, key);
    // Reads: wr from the version's writer, rw to the next version's writer.
    for (const auto& o : obs) {
      if (o.written || !IsPrefix(o.list, order)) continue;
      size_t v = 0;
      if (!o.list.empty()) {
        auto it = version_of.find(o.list.back());
        if (it == version_of.end()) continue;  // not a committed version (reported above)
        v = it->second;
        AddEdge(writers[v - 1], o.txn, EdgeType::kWR, key);
      }
      if (v < writers.size()) AddEdge(o.txn, writers[v], EdgeType::kRW, key);
    }
  }

  // Strongly connected components (Tarjan, iterative) of the subgraph with edges `keep`.
  // Components come out in reverse topological order (sinks first).
  std::vector<int> Scc(const std::function<bool(const Edge&)>& keep, int* count) const {
    const size_t n = nodes_.size();
    std::vector<int> comp(n, -1), low(n, 0), num(n, -1);
    std::vector<uint32_t> stack;
    std::vector<bool> on(n, false);
    int next = 0, comps = 0;
    struct Frame {
      uint32_t v;
      size_t edge;
    };
    for (uint32_t root = 0; root < n; ++root) {
      if (num[root] >= 0) continue;
      std::vector<Frame> call{{root, 0}};
      num[root] = low[root] = next++;
      stack.push_back(root);
      on[root] = true;
      while (!call.empty()) {
        Frame& f = call.back();
        if (f.edge < adj_[f.v].size()) {
          const Edge& e = adj_[f.v][f.edge++];
          if (!keep(e)) continue;
          if (num[e.to] < 0) {
            num[e.to] = low[e.to] = next++;
            stack.push_back(e.to);
            on[e.to] = true;
            call.push_back({e.to, 0});
          } else if (on[e.to]) {
            low[f.v] = std::min(low[f.v], num[e.to]);
          }
          continue;
        }
        const uint32_t v = f.v;
        call.pop_back();
        if (!call.empty()) low[call.back().v] = std::min(low[call.back().v], low[v]);
        if (low[v] == num[v]) {
          for (;;) {
            const uint32_t w = stack.back();
            stack.pop_back();
            on[w] = false;
            comp[w] = comps;
            if (w == v) break;
          }
          ++comps;
        }
      }
    }
    *count = comps;
    return comp;
  }

  // A path from `from` to `to` over edges `keep` (breadth first), as "Ta -ww(key 3)-> Tb ...".
  std::string Path(uint32_t from, uint32_t to, const std::function<bool(const Edge&)>& keep) const {
    std::vector<int> prev(nodes_.size(), -1);
    std::vector<const Edge*> via(nodes_.size(), nullptr);
    std::deque<uint32_t> q{from};
    prev[from] = static_cast<int>(from);
    while (!q.empty() && prev[to] < 0) {
      const uint32_t v = q.front();
      q.pop_front();
      for (const Edge& e : adj_[v]) {
        if (!keep(e) || prev[e.to] >= 0) continue;
        prev[e.to] = static_cast<int>(v);
        via[e.to] = &e;
        q.push_back(e.to);
      }
    }
    if (prev[to] < 0) return "(no path)";
    std::vector<uint32_t> hops;
    for (uint32_t v = to; v != from; v = static_cast<uint32_t>(prev[v])) hops.push_back(v);
    std::string s = Name(nodes_[from]);
    for (auto it = hops.rbegin(); it != hops.rend(); ++it) {
      s += " -" + std::string(EdgeName(via[*it]->type)) + "(key " + std::to_string(via[*it]->key) +
           ")-> " + Name(nodes_[*it]);
    }
    return s;
  }

  void FindCycles() {
    const size_t n = nodes_.size();
    auto ww = [](const Edge& e) { return e.type == EdgeType::kWW; };
    auto wwwr = [](const Edge& e) { return e.type != EdgeType::kRW; };
    auto all = [](const Edge&) { return true; };
    // G0: an edge of a ww cycle.
    int count = 0;
    std::vector<int> comp = Scc(ww, &count);
    for (uint32_t v = 0; v < n; ++v) {
      for (const Edge& e : adj_[v]) {
        if (e.type == EdgeType::kWW && comp[v] == comp[e.to]) {
          Report("G0", "write cycle: " + Name(nodes_[v]) + " -ww(key " + std::to_string(e.key) +
                           ")-> " + Path(e.to, v, ww));
        }
      }
    }
    // G1c: a wr edge on a ww/wr cycle.
    std::vector<int> c1 = Scc(wwwr, &count);
    for (uint32_t v = 0; v < n; ++v) {
      for (const Edge& e : adj_[v]) {
        if (e.type == EdgeType::kWR && c1[v] == c1[e.to]) {
          Report("G1c", "circular information flow: " + Name(nodes_[v]) + " -wr(key " +
                            std::to_string(e.key) + ")-> " + Path(e.to, v, wwwr));
        }
      }
    }
    // G-single: an rw edge a→b with b reaching a over ww/wr edges. Reachability between the
    // components of the ww/wr graph, one bit set per component, sinks first.
    const size_t words = (static_cast<size_t>(count) + 63) / 64;
    std::vector<std::vector<uint64_t>> reach(count, std::vector<uint64_t>(words, 0));
    std::vector<std::vector<uint32_t>> members(count);
    for (uint32_t v = 0; v < n; ++v) members[c1[v]].push_back(v);
    for (int c = 0; c < count; ++c) {
      reach[c][c / 64] |= 1ull << (c % 64);
      for (uint32_t v : members[c]) {
        for (const Edge& e : adj_[v]) {
          if (!wwwr(e) || c1[e.to] == c) continue;
          const auto& r = reach[c1[e.to]];
          for (size_t w = 0; w < words; ++w) reach[c][w] |= r[w];
        }
      }
    }
    std::vector<int> c2 = Scc(all, &count);
    for (uint32_t a = 0; a < n; ++a) {
      for (const Edge& e : adj_[a]) {
        if (e.type != EdgeType::kRW) continue;
        const int from = c1[e.to], to = c1[a];
        if (reach[from][to / 64] >> (to % 64) & 1) {
          Report("G-single", "read skew (one anti-dependency): " + Name(nodes_[a]) + " -rw(key " +
                                 std::to_string(e.key) + ")-> " + Path(e.to, a, wwwr));
        } else if (c2[a] == c2[e.to]) {
          ++report_.allowed_g2_edges;
        }
      }
    }
  }

  const std::vector<Txn>& h_;
  CheckReport report_;
  std::map<int64_t, bool> keys_;
  std::unordered_map<int64_t, ElementOwner> owner_;
  std::vector<bool> committed_;
  std::vector<int> index_;       // txn → node (-1: not in the graph)
  std::vector<uint32_t> nodes_;  // node → txn
  std::vector<std::vector<Edge>> adj_;
};

}  // namespace

std::string FormatTxn(const Txn& txn) {
  nlohmann::json j;
  j["id"] = txn.id;
  j["session"] = txn.session;
  j["outcome"] = OutcomeName(txn.outcome);
  j["begin_ns"] = txn.begin_ns;
  j["end_ns"] = txn.end_ns;
  j["reads"] = nlohmann::json::array();
  for (const auto& r : txn.reads) j["reads"].push_back({r.key, r.list});
  j["appends"] = nlohmann::json::array();
  for (const auto& a : txn.appends) j["appends"].push_back({a.key, a.elements});
  return j.dump();
}

Result<Txn> ParseTxn(std::string_view line) {
  try {
    auto j = nlohmann::json::parse(line);
    Txn t;
    t.id = j.at("id").get<uint64_t>();
    t.session = j.at("session").get<uint64_t>();
    const std::string o = j.at("outcome").get<std::string>();
    if (o == "committed") {
      t.outcome = Outcome::kCommitted;
    } else if (o == "aborted") {
      t.outcome = Outcome::kAborted;
    } else if (o == "unknown") {
      t.outcome = Outcome::kUnknown;
    } else {
      return Status::InvalidArgument("history: outcome '" + o +
                                     "' is none of committed, "
                                     "aborted, unknown");
    }
    t.begin_ns = j.value("begin_ns", int64_t{0});
    t.end_ns = j.value("end_ns", int64_t{0});
    for (const auto& r : j.at("reads"))
      t.reads.push_back({r.at(0).get<int64_t>(), r.at(1).get<std::vector<int64_t>>()});
    for (const auto& a : j.at("appends"))
      t.appends.push_back({a.at(0).get<int64_t>(), a.at(1).get<std::vector<int64_t>>()});
    return t;
  } catch (const std::exception& e) {
    return Status::InvalidArgument("history: bad line '" + std::string(line.substr(0, 120)) +
                                   "': " + e.what());
  }
}

Result<std::vector<Txn>> LoadHistory(const std::vector<std::string>& paths) {
  std::vector<Txn> out;
  std::map<uint64_t, size_t> at;  // transaction id -> its entry in `out`
  for (const auto& p : paths) {
    std::ifstream in(p);
    if (!in) return Status::IoError("history: cannot open " + p);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (line.empty()) continue;
      // A last line without its newline is the torn write of a process killed while writing
      // it (a long line takes several writes): that record never was.
      if (in.eof()) break;
      auto t = ParseTxn(line);
      if (!t.ok()) return t.status().WithContext(p + ":" + std::to_string(n));
      auto [it, added] = at.emplace(t->id, out.size());
      if (added) {
        out.push_back(std::move(*t));
      } else {
        out[it->second] = std::move(*t);  // the outcome, after the attempt written as unknown
      }
    }
  }
  return out;
}

std::string CheckReport::ToString() const {
  std::ostringstream s;
  s << committed << " committed, " << aborted << " aborted, " << unknown << " unknown; edges ww "
    << ww_edges << ", wr " << wr_edges << ", rw " << rw_edges << "; write-skew (G2, allowed) rw "
    << "edges on cycles " << allowed_g2_edges << "\n";
  if (counts.empty()) s << "no anomaly\n";
  for (const auto& [type, n] : counts) s << "  " << type << ": " << n << "\n";
  for (const auto& a : anomalies) s << "  [" << a.type << "] " << a.explanation << "\n";
  return s.str();
}

CheckReport CheckSnapshotIsolation(const std::vector<Txn>& history) {
  return Checker(history).Run();
}

}  // namespace farpool::db::testing
