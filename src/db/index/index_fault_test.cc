// The indexes under dying, fenced and stalled lock holders (TestOwner, index_test_util.h): a
// holder "dies" at a fault site (its memory stops, like SIGKILL, optionally after writing half
// a node), others must break its locks, repair what it tore from its redo entry and go on.
//   - concurrent inserts from 4 threads whose owners die at random fault sites (seeded);
//   - a crash at every B+tree fault site (splits and root growth included), met by a writer, a
//     reader or RecoverRedo;
//   - a session slot reused by a new epoch (same redo area) finishes the dead epoch's write
//     first, also when it dies doing so, generation after generation;
//   - a torn node repaired from the redo log, also when its repairers die in turn;
//   - two splitters racing on root growth (both orders, and with threads);
//   - fenced holders stop writing and report Unavailable; waits on live holders end in a clear
//     error.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "db/index/btree.h"
#include "db/index/hash_index.h"
#include "db/index/index_test_util.h"
#include "db/layout.h"
#include "db/memory.h"

namespace farpool::db {
namespace {

using Fault = TestOwner::Fault;
using namespace std::chrono_literals;

// Every fault site of a B+tree insert that no repair is involved in, in code order.
const std::vector<std::string> kInsertPoints = {
    "btree.insert.logged",     "btree.insert.written",     "btree.split.right-written",
    "btree.split.logged",      "btree.split.left-written", "btree.split.released",
    "btree.grow.root-written", "btree.grow.root-swapped"};
const std::vector<std::string> kTakeoverPoints = {"btree.takeover.logged", "btree.takeover.locked",
                                                  "btree.takeover.written"};

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

uint64_t Value(int64_t key) { return static_cast<uint64_t>(key) * 10 + 1; }

// A tree and a hash index in fresh local memory, and the registry of their owners.
struct Env {
  std::unique_ptr<Memory> memory;
  std::unique_ptr<OwnerRegistry> owners;
  std::unique_ptr<BTree> tree;
  std::unique_ptr<HashIndex> hash;
  GlobalAddress root_word;

  std::unique_ptr<TestOwner> Owner() {
    auto o = owners->NewOwner();
    EXPECT_TRUE(o.ok()) << o.status().ToString();
    return o.ok() ? std::move(*o) : nullptr;
  }
};

std::unique_ptr<Env> MakeEnv(std::chrono::milliseconds wait = BTree::kDefaultWaitLimit,
                             uint64_t buckets = 64) {
  auto env = std::make_unique<Env>();
  auto memory = NewLocalMemory(1, 256ull << 20);
  EXPECT_TRUE(memory.ok()) << memory.status().ToString();
  if (!memory.ok()) return nullptr;
  env->memory = std::move(*memory);
  env->owners = std::make_unique<OwnerRegistry>(*env->memory);
  OpCount c;
  Access a(*env->memory, c);
  auto creator = env->owners->NewOwner();
  if (!creator.ok()) {
    ADD_FAILURE() << creator.status().ToString();
    return nullptr;
  }
  auto root_word = a.Alloc(64);
  auto b = HashIndex::Create(a, **creator, buckets);
  if (!root_word.ok() || !b.ok() || !BTree::Create(a, **creator, *root_word).ok()) {
    ADD_FAILURE() << "cannot create the indexes";
    return nullptr;
  }
  env->root_word = *root_word;
  env->tree = std::make_unique<BTree>(*root_word, wait);
  env->hash = std::make_unique<HashIndex>(*b, buckets, 777, wait);
  return env;
}

// One thread's lock owner, replaced by a new one (a new process taking over the work, with a
// slot of its own) whenever it dies; every owner gets the same fault hook.
class OwnerChain {
 public:
  OwnerChain(Env& env, TestOwner::Hook hook) : env_(env), hook_(std::move(hook)) {}
  // The next owner; false if none could be made. Dead owners are kept (their slots stay).
  bool Next() {
    if (owner_) dead_.push_back(std::move(owner_));
    owner_ = env_.Owner();
    if (!owner_) return false;
    owner_->set_hook(hook_);
    return true;
  }
  TestOwner& operator*() { return *owner_; }
  TestOwner* operator->() { return owner_.get(); }

 private:
  Env& env_;
  TestOwner::Hook hook_;
  std::unique_ptr<TestOwner> owner_;
  std::vector<std::unique_ptr<TestOwner>> dead_;
};

// The hash index holds exactly `expect`: every key found by Lookup with its record, and no
// other entry.
void ExpectHash(Env& env, TestOwner& checker, const std::map<int64_t, GlobalAddress>& expect) {
  for (const auto& [k, rec] : expect) {
    auto got = env.hash->Lookup(checker.access(), k);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, rec) << "key " << k;
  }
  size_t entries = 0;
  ASSERT_TRUE(env.hash
                  ->ForEach(checker.access(),
                            [&](int64_t k, GlobalAddress rec) {
                              ++entries;
                              auto it = expect.find(k);
                              EXPECT_TRUE(it != expect.end() && it->second == rec)
                                  << "stray hash entry for key " << k;
                              return Status::Ok();
                            })
                  .ok());
  EXPECT_EQ(entries, expect.size());
}

// The tree holds exactly `expect`: a scan both ways, a lookup of every key (these read every
// node, so they repair whatever a dead holder tore) and the structure check.
void ExpectTree(Env& env, TestOwner& reader, const std::map<int64_t, uint64_t>& expect) {
  const Access& a = reader.access();
  std::map<int64_t, uint64_t> scanned;
  Status s = env.tree->Scan(a, reader, INT64_MIN, INT64_MAX - 1, false, [&](int64_t k, uint64_t v) {
    scanned[k] = v;
    return true;
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(scanned, expect);
  std::vector<int64_t> reversed;
  s = env.tree->Scan(a, reader, INT64_MIN, INT64_MAX - 1, true, [&](int64_t k, uint64_t) {
    reversed.push_back(k);
    return true;
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(reversed.size(), expect.size());
  EXPECT_TRUE(std::is_sorted(reversed.rbegin(), reversed.rend()));
  for (const auto& [k, v] : expect) {
    auto got = env.tree->Lookup(a, reader, k);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(*got, v) << "key " << k;
  }
  auto n = env.tree->CheckStructure(a);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, expect.size());
}

// The root node's level and entry count, read raw (layout: lock, checksum, level, count).
std::pair<uint32_t, uint32_t> RootShape(Env& env) {
  OpCount c;
  Access a(*env.memory, c);
  uint64_t raw = 0;
  uint32_t shape[2] = {0, 0};
  EXPECT_TRUE(a.Read(env.root_word, &raw, 8).ok());
  EXPECT_TRUE(a.Read(GlobalAddress::FromRaw(raw) + 16, shape, 8).ok());
  return {shape[0], shape[1]};
}

// ---------------------------------------------------------------- (1) random deaths

TEST(IndexFaultTest, ConcurrentInsertsWithDyingHolders) {
  const uint64_t seed = IndexTestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  auto env = MakeEnv();
  ASSERT_NE(env, nullptr);
  constexpr int kThreads = 4, kOps = 1500;
  std::mutex mu;
  std::map<int64_t, uint64_t> tree_model;
  std::map<int64_t, GlobalAddress> hash_model;
  std::atomic<int> failures{0};
  std::atomic<uint64_t> repairs{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed * 31 + t);
      OwnerChain owner(*env, [&](std::string_view p) {
        if (p == "btree.takeover.written") ++repairs;
        const bool structural = p.starts_with("btree.split") || p.starts_with("btree.grow") ||
                                p.starts_with("btree.takeover");
        if (rng() % (structural ? 8 : 600) != 0) return Fault::kNone;
        return EndsWith(p, ".logged") && (rng() & 1) ? Fault::kTearAndDie : Fault::kDie;
      });
      if (!owner.Next()) {
        ++failures;
        return;
      }
      for (int i = 0; i < kOps; ++i) {
        const int64_t key = static_cast<int64_t>(rng() % 6000) - 3000;
        const uint64_t value = (uint64_t(t + 1) << 32) | uint64_t(i + 1);
        const GlobalAddress fake(1, 4096 + 64 * ((value * 7) % 100000));
        // A dead owner's process is gone; a new one (new slot) retries the same insert.
        Result<GlobalAddress> h = Status::Unavailable("not run");
        Result<uint64_t> b = Status::Unavailable("not run");
        for (int attempt = 0; attempt < 100; ++attempt) {
          h = env->hash->GetOrInsert(owner->access(), *owner, key, fake);
          if (h.ok()) b = env->tree->GetOrInsert(owner->access(), *owner, key, value);
          if (h.ok() && b.ok()) break;
          if (!owner->dead()) break;
          if (!owner.Next()) break;
        }
        if (!h.ok() || !b.ok()) {
          ADD_FAILURE() << "key " << key << ": " << h.status().ToString() << " / "
                        << b.status().ToString();
          ++failures;
          return;
        }
        std::lock_guard<std::mutex> l(mu);
        auto [it, inserted] = tree_model.emplace(key, *b);
        if (!inserted && it->second != *b) ++failures;  // two winners for one key
        auto [hit, hinserted] = hash_model.emplace(key, *h);
        if (!hinserted && hit->second != *h) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  EXPECT_GT(env->owners->deaths(), 0u);
  std::cout << "[ stats    ] " << env->owners->deaths() << " owners died, " << repairs.load()
            << " torn nodes repaired, " << tree_model.size() << " keys\n";
  auto checker = env->Owner();
  ASSERT_NE(checker, nullptr);
  ExpectHash(*env, *checker, hash_model);
  ExpectTree(*env, *checker, tree_model);
}

// ---------------------------------------------------------------- (2) every fault site

TEST(IndexFaultTest, EveryInsertFaultPointIsReached) {
  auto env = MakeEnv();
  ASSERT_NE(env, nullptr);
  auto owner = env->Owner();
  std::set<std::string> seen;
  owner->set_hook([&](std::string_view p) {
    seen.emplace(p);
    return Fault::kNone;
  });
  std::mt19937_64 rng(1);
  std::vector<int64_t> keys(4000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<int64_t>(i);
  std::shuffle(keys.begin(), keys.end(), rng);
  for (int64_t k : keys) {
    ASSERT_TRUE(env->tree->GetOrInsert(owner->access(), *owner, k, Value(k)).ok());
  }
  const std::set<std::string> expected(kInsertPoints.begin(), kInsertPoints.end());
  EXPECT_EQ(seen, expected) << "a fault site was added or removed: update kInsertPoints";
  EXPECT_GE(RootShape(*env).first, 2u) << "the tree should have grown twice";
}

enum class Meet { kWriter, kReader, kRecover };

TEST(IndexFaultTest, CrashAtEveryFaultPoint) {
  const uint64_t seed = IndexTestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<int64_t> keys(3000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<int64_t>(i) * 3 - 4000;
  std::shuffle(keys.begin(), keys.end(), rng);
  std::map<std::string, int> reached;
  int cases = 0;
  for (const std::string& point : kInsertPoints) {
    for (int occurrence : {1, 2, 9, 60}) {
      for (bool tear : {false, true}) {
        if (tear && !EndsWith(point, ".logged")) continue;
        for (Meet meet : {Meet::kWriter, Meet::kReader, Meet::kRecover}) {
          SCOPED_TRACE(point + " #" + std::to_string(occurrence) + (tear ? " torn" : "") +
                       " met by " +
                       (meet == Meet::kWriter   ? "a writer"
                        : meet == Meet::kReader ? "a reader"
                                                : "RecoverRedo"));
          auto env = MakeEnv();
          ASSERT_NE(env, nullptr);
          auto a = env->Owner();
          int hits = 0;
          a->set_hook([&](std::string_view p) {
            if (p != point || ++hits != occurrence) return Fault::kNone;
            return tear ? Fault::kTearAndDie : Fault::kDie;
          });
          size_t i = 0;
          for (; i < keys.size(); ++i) {
            auto r = env->tree->GetOrInsert(a->access(), *a, keys[i], Value(keys[i]));
            if (!r.ok()) {
              ASSERT_TRUE(a->dead()) << r.status().ToString();
              break;
            }
            ASSERT_EQ(*r, Value(keys[i]));
          }
          if (i == keys.size()) break;  // this occurrence is never reached; nor are later ones
          ++reached[point];
          ++cases;
          auto b = env->Owner();
          int repairs = 0;
          b->set_hook([&](std::string_view p) {
            if (p == "btree.takeover.written") ++repairs;
            return Fault::kNone;
          });
          if (meet == Meet::kReader) {
            ASSERT_TRUE(env->tree
                            ->Scan(b->access(), *b, INT64_MIN, INT64_MAX - 1, false,
                                   [](int64_t, uint64_t) { return true; })
                            .ok());
          } else if (meet == Meet::kRecover) {
            Status s = BTree::RecoverRedo(b->access(), *b, a->index_log());
            ASSERT_TRUE(s.ok()) << s.ToString();
          }
          std::map<int64_t, uint64_t> expect;
          for (size_t j = 0; j < keys.size(); ++j) {
            if (j >= i) {
              auto r = env->tree->GetOrInsert(b->access(), *b, keys[j], Value(keys[j]));
              ASSERT_TRUE(r.ok()) << "key " << keys[j] << ": " << r.status().ToString();
              ASSERT_EQ(*r, Value(keys[j]));
            }
            expect[keys[j]] = Value(keys[j]);
          }
          ExpectTree(*env, *b, expect);
          if (tear) {
            EXPECT_GE(repairs, 1) << "the torn node was not repaired";
          }
          if (HasFatalFailure()) return;
        }
      }
    }
  }
  for (const std::string& point : kInsertPoints) {
    EXPECT_GT(reached[point], 0) << point << " was never reached";
  }
  std::cout << "[ stats    ] " << cases << " crash cases\n";
}

// ---------------------------------------------------------------- (3) torn nodes

// A inserts until it dies half-way through writing a leaf; returns how many keys it had
// inserted before (the next one was in flight).
size_t InsertUntilTorn(Env& env, TestOwner& a, int at_insert) {
  int hits = 0;
  a.set_hook([&hits, at_insert](std::string_view p) {
    return p == "btree.insert.logged" && ++hits == at_insert ? Fault::kTearAndDie : Fault::kNone;
  });
  for (int64_t k = 0;; ++k) {
    auto r = env.tree->GetOrInsert(a.access(), a, k * 7 % 1000, Value(k * 7 % 1000));
    if (!r.ok()) return static_cast<size_t>(k);
  }
}

std::map<int64_t, uint64_t> FirstKeys(size_t n) {
  std::map<int64_t, uint64_t> m;
  for (size_t k = 0; k < n; ++k) m[int64_t(k) * 7 % 1000] = Value(int64_t(k) * 7 % 1000);
  return m;
}

TEST(IndexFaultTest, TornNodeIsRepairedFromTheRedoLog) {
  auto env = MakeEnv(100ms);
  ASSERT_NE(env, nullptr);
  auto a = env->Owner();
  const size_t done = InsertUntilTorn(*env, *a, 150);
  ASSERT_TRUE(a->dead());
  // Without an owner to repair it, the torn leaf is reported, not spun on.
  OpCount c;
  Access raw(*env->memory, c);
  auto check = env->tree->CheckStructure(raw);
  ASSERT_FALSE(check.ok());
  EXPECT_EQ(check.status().code(), StatusCode::kUnavailable) << check.status().ToString();
  EXPECT_NE(check.status().ToString().find("did not verify"), std::string::npos)
      << check.status().ToString();
  // A reader meets it, finds its holder dead and rewrites it from the holder's redo entry:
  // the in-flight key is there (the entry held the image with it).
  auto b = env->Owner();
  int repairs = 0;
  b->set_hook([&](std::string_view p) {
    if (p == "btree.takeover.written") ++repairs;
    return Fault::kNone;
  });
  ExpectTree(*env, *b, FirstKeys(done + 1));
  EXPECT_EQ(repairs, 1);
}

TEST(IndexFaultTest, TornNodeIsRepairedEvenIfItsRepairersDie) {
  for (const std::string& point : kTakeoverPoints) {
    for (bool tear : {false, true}) {
      if (tear && !EndsWith(point, ".logged")) continue;
      SCOPED_TRACE(point + (tear ? " torn" : ""));
      auto env = MakeEnv();
      ASSERT_NE(env, nullptr);
      auto a = env->Owner();
      const size_t done = InsertUntilTorn(*env, *a, 150);
      auto b = env->Owner();
      b->set_hook([&](std::string_view p) {
        if (p != point) return Fault::kNone;
        return tear ? Fault::kTearAndDie : Fault::kDie;
      });
      auto r = env->tree->Lookup(b->access(), *b, int64_t(done) * 7 % 1000);
      ASSERT_FALSE(r.ok());
      ASSERT_TRUE(b->dead()) << "the repairer should have died at " << point;
      auto c = env->Owner();
      ExpectTree(*env, *c, FirstKeys(done + 1));
    }
  }
}

TEST(IndexFaultTest, ReusedRedoAreaFinishesTheDeadWriteFirst) {
  // Generation 1 tears a leaf; generation g + 1 inherits generation g's slot and area and runs
  // RecoverRedo, dying at a takeover fault site, for every site; the last one survives.
  for (const std::string& point : kTakeoverPoints) {
    for (bool tear : {false, true}) {
      if (tear && !EndsWith(point, ".logged")) continue;
      SCOPED_TRACE(point + (tear ? " torn" : ""));
      auto env = MakeEnv();
      ASSERT_NE(env, nullptr);
      std::vector<std::unique_ptr<TestOwner>> generations;
      generations.push_back(env->Owner());
      const size_t done = InsertUntilTorn(*env, *generations.back(), 150);
      for (int g = 0; g < 3; ++g) {
        auto next = env->owners->Inherit(*generations.back());
        ASSERT_TRUE(next.ok()) << next.status().ToString();
        TestOwner& n = **next;
        EXPECT_EQ(n.index_log(), generations.back()->index_log());
        n.set_hook([&](std::string_view p) {
          if (p != point) return Fault::kNone;
          return tear ? Fault::kTearAndDie : Fault::kDie;
        });
        Status s = BTree::RecoverRedo(n.access(), n, n.index_log());
        generations.push_back(std::move(*next));
        if (s.ok() && g > 0 && point == "btree.takeover.written") {
          // The node was whole after generation 2's repair: nothing left to replay, so no
          // fault site is met. This generation dies later, with nothing in flight.
          generations.back()->Kill();
          continue;
        }
        ASSERT_FALSE(s.ok()) << "generation " << g + 2 << " should have died at " << point;
        ASSERT_TRUE(generations.back()->dead());
      }
      auto last = env->owners->Inherit(*generations.back());
      ASSERT_TRUE(last.ok());
      int repairs = 0;
      (*last)->set_hook([&](std::string_view p) {
        if (p == "btree.takeover.written") ++repairs;
        return Fault::kNone;
      });
      Status s = BTree::RecoverRedo((*last)->access(), **last, (*last)->index_log());
      ASSERT_TRUE(s.ok()) << s.ToString();
      // Only now does the survivor write (its entries overwrite the inherited ones).
      auto r = env->tree->GetOrInsert((*last)->access(), **last, 5000, Value(5000));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      auto expect = FirstKeys(done + 1);
      expect[5000] = Value(5000);
      ExpectTree(*env, **last, expect);
      if (point != "btree.takeover.written") {
        EXPECT_EQ(repairs, 1);
      }
    }
  }
}

// ---------------------------------------------------------------- (4) root growth races

// A fills the root leaf with keys 0..61; its split of the root pauses at `pause`, where B
// inserts keys below A's separator until B's split of the left half grows the root.
void RaceOnRootGrowth(const std::string& pause) {
  auto env = MakeEnv();
  ASSERT_NE(env, nullptr);
  auto a = env->Owner();
  auto b = env->Owner();
  bool a_grew = false, b_grew = false, raced = false;
  std::vector<int64_t> b_keys;
  b->set_hook([&](std::string_view p) {
    if (p == "btree.grow.root-swapped") b_grew = true;
    return Fault::kNone;
  });
  a->set_hook([&](std::string_view p) {
    if (p == "btree.grow.root-swapped") a_grew = true;
    if (p != pause || raced) return Fault::kNone;
    raced = true;
    for (int64_t k = -1; !b_grew && k > -100; --k) {
      auto r = env->tree->GetOrInsert(b->access(), *b, k, Value(k));
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      b_keys.push_back(k);
    }
    return Fault::kNone;
  });
  std::map<int64_t, uint64_t> expect;
  for (int64_t k = 0; k < 62; ++k) {
    auto r = env->tree->GetOrInsert(a->access(), *a, k, Value(k));
    ASSERT_TRUE(r.ok()) << "key " << k << ": " << r.status().ToString();
    expect[k] = Value(k);
  }
  for (int64_t k : b_keys) expect[k] = Value(k);
  ASSERT_TRUE(raced);
  EXPECT_TRUE(b_grew);
  EXPECT_FALSE(a_grew) << "A should have posted into B's root";
  // One root above three leaves: both separators landed in it.
  EXPECT_EQ(RootShape(*env), std::make_pair(1u, 3u));
  ExpectTree(*env, *a, expect);
}

TEST(IndexFaultTest, SplitterAfterReleaseFindsTheRootGrownAndPostsIntoIt) {
  RaceOnRootGrowth("btree.split.released");
}

TEST(IndexFaultTest, SplitterWhoseRootCasLosesPostsIntoTheWinnersRoot) {
  RaceOnRootGrowth("btree.grow.root-written");
}

TEST(IndexFaultTest, ThreadsRacingOnRootGrowthAllSucceed) {
  const uint64_t seed = IndexTestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  for (int round = 0; round < 40; ++round) {
    auto env = MakeEnv();
    ASSERT_NE(env, nullptr);
    constexpr int kThreads = 3, kKeys = 400;
    std::vector<std::unique_ptr<TestOwner>> owners;
    for (int t = 0; t < kThreads; ++t) owners.push_back(env->Owner());
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(seed + round * 101 + t);
        TestOwner& o = *owners[t];
        for (int i = 0; i < kKeys; ++i) {
          const int64_t k = static_cast<int64_t>(i) * kThreads + t;
          auto r = env->tree->GetOrInsert(o.access(), o, k, Value(k));
          if (!r.ok() || *r != Value(k)) {
            ADD_FAILURE() << "key " << k << ": " << r.status().ToString();
            ++failures;
            return;
          }
          if (rng() % 16 == 0) std::this_thread::yield();
        }
      });
    }
    for (auto& th : threads) th.join();
    ASSERT_EQ(failures.load(), 0);
    std::map<int64_t, uint64_t> expect;
    for (int64_t k = 0; k < kThreads * kKeys; ++k) expect[k] = Value(k);
    ExpectTree(*env, *owners[0], expect);
  }
}

// ---------------------------------------------------------------- fencing and bounded waits

TEST(IndexFaultTest, FencedTreeWriterStopsAndReportsUnavailable) {
  for (const char* pause : {"btree.insert.written", "btree.split.right-written"}) {
    SCOPED_TRACE(pause);
    auto env = MakeEnv();
    ASSERT_NE(env, nullptr);
    auto a = env->Owner();
    auto b = env->Owner();
    std::map<int64_t, uint64_t> expect;
    for (int64_t k = 0; k < 60; ++k) {
      ASSERT_TRUE(env->tree->GetOrInsert(a->access(), *a, k, Value(k)).ok());
      expect[k] = Value(k);
    }
    // Key 60 fills the leaf (insert), key 61 splits it.
    const int64_t a_key = std::string_view(pause) == "btree.insert.written" ? 60 : 61;
    if (a_key == 61) {
      ASSERT_TRUE(env->tree->GetOrInsert(a->access(), *a, 60, Value(60)).ok());
      expect[60] = Value(60);
    }
    a->set_hook([&](std::string_view p) {
      if (p != pause) return Fault::kNone;
      a->Fence();  // judged dead while it still runs; B breaks its lock
      auto r = env->tree->GetOrInsert(b->access(), *b, 100, Value(100));
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      return Fault::kNone;
    });
    auto r = env->tree->GetOrInsert(a->access(), *a, a_key, Value(a_key));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
    expect[100] = Value(100);
    // The node was written before the fence in the first case; never in the second.
    if (a_key == 60) expect[60] = Value(60);
    ExpectTree(*env, *b, expect);
  }
}

TEST(IndexFaultTest, FencedHashWriterStopsAndReportsUnavailable) {
  for (const char* pause : {"hash.locked", "hash.key-written"}) {
    SCOPED_TRACE(pause);
    auto env = MakeEnv(BTree::kDefaultWaitLimit, 1);  // one bucket: every key meets A's lock
    ASSERT_NE(env, nullptr);
    auto a = env->Owner();
    auto b = env->Owner();
    const GlobalAddress rec_a(1, 4096), rec_b(1, 8192);
    a->set_hook([&](std::string_view p) {
      if (p != pause) return Fault::kNone;
      a->Fence();
      auto r = env->hash->GetOrInsert(b->access(), *b, 2, rec_b);
      EXPECT_TRUE(r.ok() && *r == rec_b) << r.status().ToString();
      return Fault::kNone;
    });
    auto r = env->hash->GetOrInsert(a->access(), *a, 1, rec_a);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
    EXPECT_TRUE(env->hash->Lookup(b->access(), 1)->is_null());
    EXPECT_EQ(*env->hash->Lookup(b->access(), 2), rec_b);
    auto again = env->hash->GetOrInsert(b->access(), *b, 1, rec_a);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(*env->hash->Lookup(b->access(), 1), rec_a);
  }
}

// GetOrInsertMany: keys already there come back as they are; the rest are inserted, also into
// chains that have to grow (two buckets of 7 entries) and into a second index in the same
// call; every key once, as Lookup sees it.
TEST(IndexFaultTest, HashInsertManyFindsAndInserts) {
  auto env = MakeEnv(BTree::kDefaultWaitLimit, 2);
  ASSERT_NE(env, nullptr);
  auto a = env->Owner();
  ASSERT_NE(a, nullptr);
  auto other_buckets = HashIndex::Create(a->access(), *a, 4);
  ASSERT_TRUE(other_buckets.ok());
  const HashIndex other(*other_buckets, 4, 4242);
  auto rec = [](int64_t k, int gen) { return GlobalAddress(1, 4096 + 64 * (k + 1000 * gen)); };
  for (int64_t k = 0; k < 10; k += 3) {
    ASSERT_TRUE(env->hash->GetOrInsert(a->access(), *a, k, rec(k, 0)).ok());
  }
  std::vector<HashIndex::Insert> inserts;
  for (int64_t k = 0; k < 40; ++k) inserts.push_back({env->hash.get(), k, rec(k, 1)});
  for (int64_t k = 0; k < 20; ++k) inserts.push_back({&other, k, rec(k, 2)});
  const Status many = HashIndex::GetOrInsertMany(a->access(), *a, inserts);
  ASSERT_TRUE(many.ok()) << many.ToString();
  for (int64_t k = 0; k < 40; ++k) {
    const GlobalAddress want = k < 10 && k % 3 == 0 ? rec(k, 0) : rec(k, 1);
    EXPECT_EQ(inserts[k].record, want) << "key " << k;
    EXPECT_EQ(*env->hash->Lookup(a->access(), k), want) << "key " << k;
  }
  for (int64_t k = 0; k < 20; ++k) {
    EXPECT_EQ(inserts[40 + k].record, rec(k, 2)) << "key " << k << " of the other index";
    EXPECT_EQ(*other.Lookup(a->access(), k), rec(k, 2)) << "key " << k << " of the other index";
  }
  size_t entries = 0;
  ASSERT_TRUE(env->hash
                  ->ForEach(a->access(),
                            [&](int64_t, GlobalAddress) {
                              ++entries;
                              return Status::Ok();
                            })
                  .ok());
  EXPECT_EQ(entries, 40u);
}

// GetOrInsertMany against GetOrInsert under 4 threads racing on overlapping keys, with holders
// dying at every hash fault site now and then (a new owner retries the same insert): one
// winner per key, every key found by Lookup with it, no stray entry.
TEST(IndexFaultTest, HashInsertManyRacesWithDyingHolders) {
  const uint64_t seed = IndexTestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  auto env = MakeEnv(BTree::kDefaultWaitLimit, 16);  // ~40 keys a chain: overflow buckets
  ASSERT_NE(env, nullptr);
  constexpr int kThreads = 4, kOps = 300;
  std::mutex mu;
  std::map<int64_t, GlobalAddress> model;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed * 17 + t);
      OwnerChain owner(
          *env, [&](std::string_view) { return rng() % 100 == 0 ? Fault::kDie : Fault::kNone; });
      if (!owner.Next()) {
        ++failures;
        return;
      }
      for (int i = 0; i < kOps; ++i) {
        std::vector<int64_t> keys;
        while (keys.size() < 1 + rng() % 8) {
          const int64_t k = static_cast<int64_t>(rng() % 640) - 320;
          if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
        }
        const bool many = rng() % 4 != 0;
        std::vector<HashIndex::Insert> inserts;
        Status s = Status::Unavailable("not run");
        for (int attempt = 0; attempt < 100; ++attempt) {
          inserts.clear();
          for (size_t j = 0; j < keys.size(); ++j) {
            inserts.push_back({env->hash.get(), keys[j],
                               GlobalAddress(1, 4096 + 64 * (uint64_t(t) * 100000 + i * 8 + j))});
          }
          if (many) {
            s = HashIndex::GetOrInsertMany(owner->access(), *owner, inserts);
          } else {
            s = Status::Ok();
            for (size_t j = 0; j < keys.size() && s.ok(); ++j) {
              auto r = env->hash->GetOrInsert(owner->access(), *owner, keys[j], inserts[j].record);
              s = r.status();
              if (r.ok()) inserts[j].record = *r;
            }
          }
          if (s.ok() || !owner->dead()) break;
          if (!owner.Next()) break;
        }
        if (!s.ok()) {
          ADD_FAILURE() << s.ToString();
          ++failures;
          return;
        }
        std::lock_guard<std::mutex> l(mu);
        for (const HashIndex::Insert& in : inserts) {
          auto [it, inserted] = model.emplace(in.key, in.record);
          if (!inserted && it->second != in.record) ++failures;  // two winners for one key
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  EXPECT_GT(env->owners->deaths(), 0u);
  auto checker = env->Owner();
  ASSERT_NE(checker, nullptr);
  ExpectHash(*env, *checker, model);
}

TEST(IndexFaultTest, WaitsOnLiveHoldersEndInAClearError) {
  auto env = MakeEnv(50ms, 1);
  ASSERT_NE(env, nullptr);
  auto a = env->Owner();
  auto b = env->Owner();
  const std::string a_name = "slot " + std::to_string(a->slot()) + " ";
  std::map<int64_t, uint64_t> expect;
  for (int64_t k = 0; k < 10; ++k) {
    ASSERT_TRUE(env->tree->GetOrInsert(a->access(), *a, k, Value(k)).ok());
    expect[k] = Value(k);
  }
  Status writer, reader, hasher;
  a->set_hook([&](std::string_view p) {
    if (p == "btree.insert.logged") {
      // A holds the leaf's lock and is alive: B's insert waits, then gives up.
      writer = env->tree->GetOrInsert(b->access(), *b, 11, Value(11)).status();
      // A is caught half-way through its node write: B's lookup waits, then gives up.
      TearFromRedo(*env->memory, a->index_log());
      reader = env->tree->Lookup(b->access(), *b, 3).status();
    } else if (p == "hash.locked") {
      hasher = env->hash->GetOrInsert(b->access(), *b, 5, GlobalAddress(1, 64)).status();
    }
    return Fault::kNone;
  });
  ASSERT_TRUE(env->tree->GetOrInsert(a->access(), *a, 10, Value(10)).ok());
  expect[10] = Value(10);
  for (const Status* s : {&writer, &reader}) {
    EXPECT_EQ(s->code(), StatusCode::kUnavailable) << s->ToString();
    EXPECT_NE(s->ToString().find(a_name), std::string::npos) << s->ToString();
    EXPECT_NE(s->ToString().find("not dead"), std::string::npos) << s->ToString();
  }
  EXPECT_NE(writer.ToString().find("stayed locked"), std::string::npos) << writer.ToString();
  EXPECT_NE(reader.ToString().find("did not verify"), std::string::npos) << reader.ToString();
  ASSERT_TRUE(env->hash->GetOrInsert(a->access(), *a, 4, GlobalAddress(1, 128)).ok());
  EXPECT_EQ(hasher.code(), StatusCode::kUnavailable) << hasher.ToString();
  EXPECT_NE(hasher.ToString().find("stayed locked"), std::string::npos) << hasher.ToString();
  EXPECT_NE(hasher.ToString().find(a_name), std::string::npos) << hasher.ToString();
  ExpectTree(*env, *b, expect);
}

}  // namespace
}  // namespace farpool::db
