// Bulk loading (Database::NewLoader, db.h's Loader) on every engine: loaded rows read back
// exactly (every key, every column, scans in order both ways, the B+tree well formed), the
// table is invisible until Finish and then whole to a concurrent reader in another process
// handle, a name taken meanwhile wins over the load, bad input is refused with a clear error
// and leaves nothing visible, and an abandoned load is reclaimed by the garbage collector.
// SIGKILLed loaders are in db_process_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <set>
#include <span>
#include <thread>

#include "db/db_test_util.h"
#include "db/nam/nam_internal.h"
#include "farpool/db.h"

namespace farpool::db {
namespace {

const Schema& LoadSchema() {
  static const Schema s{{"v", ColumnType::kInt64},
                        {"name", ColumnType::kChar, 12},
                        {"score", ColumnType::kDouble},
                        {"note", ColumnType::kBytes}};
  return s;
}

// The row of key k: every column derived from k (the note empty for every 7th key).
Row RowOf(int64_t k) {
  Row r(LoadSchema());
  r.SetInt64(0, k * 3 + 1);
  r.SetChar(1, "n" + std::to_string(k));
  r.SetDouble(2, double(k) / 8);
  const uint64_t u = uint64_t(k);
  r.SetBytes(3, u % 7 == 0 ? std::string() : std::string(20 + u % 300, char('a' + u % 26)));
  return r;
}

::testing::AssertionResult RowMatches(int64_t k, const Row& r) {
  const Row want = RowOf(k);
  if (r.GetInt64(0) != want.GetInt64(0) || r.GetChar(1) != want.GetChar(1) ||
      r.GetDouble(2) != want.GetDouble(2) || r.GetBytes(3) != want.GetBytes(3)) {
    return ::testing::AssertionFailure() << "row of key " << k << " differs";
  }
  return ::testing::AssertionSuccess();
}

// The keys: n distinct keys, negative and positive, in random order.
std::vector<int64_t> Keys(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::set<int64_t> set;
  while (set.size() < n) set.insert(int64_t(rng() % 10'000'000) - 5'000'000);
  std::vector<int64_t> keys(set.begin(), set.end());
  std::shuffle(keys.begin(), keys.end(), rng);
  return keys;
}

Result<const Table*> Load(Database& db, const std::string& name, std::span<const int64_t> keys,
                          bool ordered = true) {
  FARPOOL_ASSIGN_OR_RETURN(auto loader,
                           db.NewLoader(name, LoadSchema(), TableOptions{ordered, keys.size()}));
  for (int64_t k : keys) FARPOOL_RETURN_IF_ERROR(loader->Add(k, RowOf(k)));
  EXPECT_EQ(loader->rows(), keys.size());
  return loader->Finish();
}

// Every key reads back its row (MultiGet), and an ordered table scans in key order both ways.
// `deleted` rows were deleted since the load: their index entries may stay until the garbage
// collector's maintenance thread removes them (QueueRemoval), so the B+tree may hold up to that
// many entries more than `keys`.
void ExpectTable(Database& db, const Table& t, std::vector<int64_t> keys, size_t deleted = 0) {
  auto session = db.NewSession();
  ASSERT_TRUE(session.ok());
  auto txn = (*session)->Begin();
  ASSERT_TRUE(txn.ok());
  std::vector<TableKey> tk;
  for (int64_t k : keys) tk.push_back({&t, k});
  std::vector<Row> rows;
  std::vector<Status> found;
  ASSERT_OK((*txn)->MultiGet(tk, &rows, &found));
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(found[i].ok()) << "key " << keys[i] << ": " << found[i].ToString();
    ASSERT_TRUE(RowMatches(keys[i], rows[i]));
  }
  Row r;
  EXPECT_EQ((*txn)->Get(t, 5'000'001, &r).code(), StatusCode::kNotFound);
  if (!t.ordered()) return;
  std::sort(keys.begin(), keys.end());
  for (bool reverse : {false, true}) {
    std::vector<int64_t> scanned;
    bool rows_ok = true;
    ASSERT_OK((*txn)->Scan(t, INT64_MIN, INT64_MAX - 1, 0, reverse, [&](int64_t k, const Row& row) {
      scanned.push_back(k);
      rows_ok = rows_ok && RowMatches(k, row);
      return true;
    }));
    if (reverse) std::reverse(scanned.begin(), scanned.end());
    EXPECT_EQ(scanned, keys);
    EXPECT_TRUE(rows_ok);
  }
  // The NAM engines: the B+tree built bottom-up is well formed and holds every key.
  if (db.engine() != Engine::kSharded) {
    auto& nam = static_cast<NamDatabase&>(db);
    OpCount count;
    Access access(nam.memory(), count);
    auto entries = static_cast<const NamTable&>(t).btree_->CheckStructure(access);
    ASSERT_TRUE(entries.ok()) << entries.status().ToString();
    EXPECT_GE(*entries, keys.size());
    EXPECT_LE(*entries, keys.size() + deleted);
  }
}

class BulkLoadTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto tdb = TestDatabase::Start(GetParam());
    ASSERT_TRUE(tdb.ok()) << tdb.status().ToString();
    tdb_ = std::move(*tdb);
  }
  bool nam() const { return GetParam() != "sharded"; }
  std::unique_ptr<TestDatabase> tdb_;
};

TEST_P(BulkLoadTest, LoadedRowsReadBackAndTakeTransactions) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  Database& db = tdb_->db();
  const std::vector<int64_t> keys = Keys(nam() ? 20000 : 3000, seed);
  auto t = Load(db, "loaded", keys);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto plain = Load(db, "plain", std::span(keys).first(500), /*ordered=*/false);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  ExpectTable(db, **t, keys);
  ExpectTable(db, **plain, std::vector<int64_t>(keys.begin(), keys.begin() + 500));
  // Ordinary transactions update, delete and insert loaded keys (splitting packed leaves).
  auto session = db.NewSession();
  ASSERT_TRUE(session.ok());
  std::vector<int64_t> now(keys.begin(), keys.end());
  ASSERT_OK(RunTransaction(**session, [&](Transaction& txn) -> Status {
    for (size_t i = 0; i < 200; ++i) {
      FARPOOL_RETURN_IF_ERROR(txn.Delete(**t, keys[i]));
      FARPOOL_RETURN_IF_ERROR(txn.Put(**t, 5'000'100 + int64_t(i), RowOf(5'000'100 + i)));
    }
    return Status::Ok();
  }));
  now.erase(now.begin(), now.begin() + 200);
  for (int64_t i = 0; i < 200; ++i) now.push_back(5'000'100 + i);
  ExpectTable(db, **t, now, /*deleted=*/200);
  // Deleted rows are collected (their index entries too) and the table stays whole.
  ASSERT_TRUE(db.CollectGarbage().ok());
  ExpectTable(db, **t, now);
  auto names = db.ListTables();
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, (std::vector<std::string>{"loaded", "plain"}));
}

// Until Finish the table does not exist; a reader in another handle that opens it sees every
// row at once; a snapshot taken before NewLoader sees none of them (NAM: one stamp).
TEST_P(BulkLoadTest, InvisibleUntilFinishThenWhole) {
  if (!nam()) GTEST_SKIP() << "kSharded's fallback is not atomic (db.h)";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("FARPOOL_SEED=" + std::to_string(seed));
  Database& db = tdb_->db();
  // The other handle: another process's view for the pool engine (the same one for local).
  std::unique_ptr<Database> other_owned;
  Database* other = &db;
  if (GetParam() == "pool") {
    auto o = tdb_->OpenAnother();
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    other_owned = std::move(*o);
    other = other_owned.get();
  }
  auto old_session = db.NewSession();
  ASSERT_TRUE(old_session.ok());
  ASSERT_TRUE(db.CreateTable("before", LoadSchema()).ok());
  auto old_txn = (*old_session)->Begin();
  ASSERT_TRUE(old_txn.ok());
  Row unused;
  (void)(*old_txn)->Get(**db.OpenTable("before"), 1, &unused);  // takes its snapshot

  const std::vector<int64_t> keys = Keys(8000, seed);
  std::atomic<bool> stop{false};
  std::atomic<int> whole_reads{0};
  std::atomic<int> bad{0};
  std::thread reader([&] {
    auto session = other->NewSession();
    if (!session.ok()) {
      ++bad;
      return;
    }
    while (!stop.load()) {
      auto t = other->OpenTable("big");
      if (!t.ok()) {
        if (t.status().code() != StatusCode::kNotFound) ++bad;
        continue;
      }
      uint64_t n = 0;
      Status s = RunTransaction(**session, [&](Transaction& txn) {
        n = 0;
        return txn.Scan(**t, INT64_MIN, INT64_MAX - 1, 0, false, [&](int64_t, const Row&) {
          ++n;
          return true;
        });
      });
      if (!s.ok() || n != keys.size()) {
        ADD_FAILURE() << "a reader saw " << n << " of " << keys.size() << " rows: " << s.ToString();
        ++bad;
      }
      ++whole_reads;
    }
  });
  auto loader = db.NewLoader("big", LoadSchema(), TableOptions{true, keys.size()});
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_OK((*loader)->Add(keys[i], RowOf(keys[i])));
    if (i == keys.size() / 2) {
      EXPECT_EQ(db.OpenTable("big").status().code(), StatusCode::kNotFound);
      auto names = other->ListTables();
      ASSERT_TRUE(names.ok());
      EXPECT_EQ(std::count(names->begin(), names->end(), "big"), 0);
    }
  }
  auto t = (*loader)->Finish();
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  while (whole_reads.load() < 3 && bad.load() == 0) std::this_thread::yield();
  stop = true;
  reader.join();
  EXPECT_EQ(bad.load(), 0);
  // The snapshot from before NewLoader sees the table empty.
  uint64_t seen = 0;
  ASSERT_OK((*old_txn)->Scan(**t, INT64_MIN, INT64_MAX - 1, 0, false, [&](int64_t, const Row&) {
    ++seen;
    return true;
  }));
  EXPECT_EQ(seen, 0u);
  EXPECT_EQ((*old_txn)->Get(**t, keys[0], &unused).code(), StatusCode::kNotFound);
  ExpectTable(db, **t, keys);
}

// A loader never writes into an existing table; a table created under the name during the
// load wins, and the load's memory is reclaimed.
TEST_P(BulkLoadTest, ExistingNameWins) {
  Database& db = tdb_->db();
  ASSERT_TRUE(db.CreateTable("taken", LoadSchema()).ok());
  EXPECT_EQ(db.NewLoader("taken", LoadSchema()).status().code(), StatusCode::kAlreadyExists);

  const std::vector<int64_t> keys = Keys(2000, 7);
  auto loader = db.NewLoader("raced", LoadSchema(), TableOptions{true, keys.size()});
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  for (int64_t k : keys) ASSERT_OK((*loader)->Add(k, RowOf(k)));
  auto created = db.CreateTable("raced", LoadSchema(), TableOptions{true});
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  auto t = (*loader)->Finish();
  EXPECT_EQ(t.status().code(), StatusCode::kAlreadyExists) << t.status().ToString();
  ExpectTable(db, **created, {});  // still the empty table that won
  if (nam()) {
    GcStats g = CollectUntil(db, [](const GcStats& g) { return g.tables_reclaimed >= 1; });
    EXPECT_EQ(g.tables_reclaimed, 1u);
  }
}

TEST_P(BulkLoadTest, BadInputIsRefusedAndLeavesNothing) {
  Database& db = tdb_->db();
  {  // A duplicate key (found at Add or at Finish: the rows go out in batches).
    auto loader = db.NewLoader("dup", LoadSchema(), TableOptions{true, 3000});
    ASSERT_TRUE(loader.ok());
    Status s;
    for (int64_t k = 0; k < 3000 && s.ok(); ++k) s = (*loader)->Add(k == 2000 ? 17 : k, RowOf(k));
    if (s.ok()) s = (*loader)->Finish().status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("duplicate key 17"), std::string::npos) << s.ToString();
    EXPECT_EQ((*loader)->Add(5000, RowOf(5000)).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(db.OpenTable("dup").status().code(), StatusCode::kNotFound);
  }
  {  // A row of another schema.
    auto loader = db.NewLoader("schema", LoadSchema());
    ASSERT_TRUE(loader.ok());
    ASSERT_OK((*loader)->Add(1, RowOf(1)));
    const Schema other{{"v", ColumnType::kInt64}};
    Status s = (*loader)->Add(2, Row(other));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("key 2"), std::string::npos) << s.ToString();
    EXPECT_EQ((*loader)->Finish().status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(db.OpenTable("schema").status().code(), StatusCode::kNotFound);
  }
  {  // The reserved key; a default row.
    auto loader = db.NewLoader("reserved", LoadSchema());
    ASSERT_TRUE(loader.ok());
    EXPECT_EQ((*loader)->Add(INT64_MAX, RowOf(1)).code(), StatusCode::kInvalidArgument);
    auto again = db.NewLoader("reserved2", LoadSchema());
    ASSERT_TRUE(again.ok());
    EXPECT_EQ((*again)->Add(1, Row()).code(), StatusCode::kInvalidArgument);
  }
  {  // A name CreateTable refuses: NewLoader refuses it (kSharded's fallback: Finish does).
    auto loader = db.NewLoader("", LoadSchema());
    Status s = loader.ok() ? (*loader)->Finish().status() : loader.status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  }
  if (nam()) {  // every refused load (and its rows) is reclaimed
    GcStats g = CollectUntil(db, [](const GcStats& g) { return g.tables_reclaimed >= 4; });
    EXPECT_EQ(g.tables_reclaimed, 4u);
  }
  auto names = db.ListTables();
  ASSERT_TRUE(names.ok());
  EXPECT_TRUE(names->empty());
  // The names are free: a valid load of one of them works.
  const std::vector<int64_t> keys = Keys(100, 3);
  auto t = Load(db, "dup", keys);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ExpectTable(db, **t, keys);
}

// A loader destroyed before Finish leaves nothing visible and its memory is reclaimed and
// reused (the same load again needs no more memory from the servers... its chunks come back).
TEST_P(BulkLoadTest, AbandonedLoadIsReclaimed) {
  if (!nam()) GTEST_SKIP() << "kSharded buffers rows in the loader: nothing to reclaim";
  Database& db = tdb_->db();
  const std::vector<int64_t> keys = Keys(5000, 11);
  {
    auto loader = db.NewLoader("gone", LoadSchema(), TableOptions{true, keys.size()});
    ASSERT_TRUE(loader.ok());
    for (int64_t k : keys) ASSERT_OK((*loader)->Add(k, RowOf(k)));
  }
  EXPECT_EQ(db.OpenTable("gone").status().code(), StatusCode::kNotFound);
  GcStats g = CollectUntil(db, [](const GcStats& g) { return g.tables_reclaimed >= 1; });
  EXPECT_EQ(g.tables_reclaimed, 1u);
  auto t = Load(db, "gone", keys);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ExpectTable(db, **t, keys);
}

INSTANTIATE_TEST_SUITE_P(Engines, BulkLoadTest, testing::Values("local", "pool", "sharded"),
                         [](const testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace farpool::db
