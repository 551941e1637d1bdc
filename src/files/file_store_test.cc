// The file store and its locks against a real `farpool server` process: files written, read
// back, truncated and deleted; holes; extent boundaries; bad names; SQLite's lock levels
// between two lease holders (two LeaseTables in this process act as two processes).
#include "files/file_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "files/file_lock.h"
#include "files/lease.h"
#include "pool/test_cluster.h"

namespace farpool::files {
namespace {

class FileStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    LocalClusterOptions o;
    o.servers = 2;
    o.memory = 64ull << 20;
    o.chunk_size = 1ull << 20;
    cluster_ = new TestCluster(o);
    ASSERT_TRUE(cluster_->status().ok()) << cluster_->status().ToString();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    auto config = cluster_->config();
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    auto pool = Pool::Connect(*config);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    pool_ = std::move(*pool);
    auto store = FileStore::Open(*pool_);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
  }
  std::unique_ptr<File> Create(const std::string& name) {
    auto f = store_->OpenFile(name, OpenMode::kCreate);
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    return f.ok() ? std::move(*f) : nullptr;
  }

  // A second client over TCP (its own Pool and FileStore) and file `name` created through it.
  struct TcpClient {
    std::unique_ptr<Pool> pool;
    std::unique_ptr<FileStore> store;
    std::unique_ptr<File> file;
  };
  void ConnectOverTcp(const std::string& name, TcpClient* c) {
    auto config = cluster_->config();
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    PoolOptions tcp;
    tcp.transport = Fabric::kTcp;
    auto pool = Pool::Connect(*config, tcp);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    c->pool = std::move(*pool);
    auto store = FileStore::Open(*c->pool);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    c->store = std::move(*store);
    auto f = c->store->OpenFile(name, OpenMode::kCreate);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    c->file = std::move(*f);
  }

  static TestCluster* cluster_;
  std::unique_ptr<Pool> pool_;
  std::unique_ptr<FileStore> store_;
};
TestCluster* FileStoreTest::cluster_ = nullptr;

std::vector<unsigned char> Pattern(size_t n, uint32_t seed) {
  std::vector<unsigned char> v(n);
  std::mt19937 rng(seed);
  for (auto& c : v) c = static_cast<unsigned char>(rng());
  return v;
}

TEST_F(FileStoreTest, WriteReadBackTruncateDelete) {
  auto f = Create("basic.db");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->size(), 0u);
  const auto data = Pattern(10000, 1);
  ASSERT_TRUE(f->Write(100, data.data(), data.size()).ok());
  EXPECT_EQ(f->size(), 10100u);
  std::vector<unsigned char> back(10200, 0xee);
  auto n = f->Read(0, back.data(), back.size());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 10100u);  // short read at the end; the rest zero-filled
  EXPECT_TRUE(std::all_of(back.begin(), back.begin() + 100, [](auto c) { return c == 0; }));
  EXPECT_EQ(0, std::memcmp(back.data() + 100, data.data(), data.size()));
  EXPECT_TRUE(std::all_of(back.begin() + 10100, back.end(), [](auto c) { return c == 0; }));

  // Another handle (as another process would) sees the same bytes.
  auto other = store_->OpenFile("basic.db", OpenMode::kExisting);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_EQ((*other)->size(), 10100u);

  ASSERT_TRUE(f->Truncate(500).ok());
  ASSERT_TRUE(f->Truncate(5000).ok());  // grows again: the cut bytes read as zeros
  n = f->Read(0, back.data(), 5000);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 5000u);
  EXPECT_EQ(0, std::memcmp(back.data() + 100, data.data(), 400));
  EXPECT_TRUE(std::all_of(back.begin() + 500, back.begin() + 5000, [](auto c) { return c == 0; }));

  auto exists = store_->Exists("basic.db");
  ASSERT_TRUE(exists.ok());
  EXPECT_TRUE(*exists);
  ASSERT_TRUE(store_->Delete("basic.db").ok());
  exists = store_->Exists("basic.db");
  ASSERT_TRUE(exists.ok());
  EXPECT_FALSE(*exists);
  auto gone = store_->OpenFile("basic.db", OpenMode::kExisting);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound) << gone.status().ToString();
  EXPECT_EQ(store_->Delete("basic.db").code(), StatusCode::kNotFound);

  // Created again: empty.
  auto again = Create("basic.db");
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->size(), 0u);
}

TEST_F(FileStoreTest, PunchHoleRecyclesWholeExtentsAndZeroesTheEnds) {
  auto f = Create("punch.db");
  ASSERT_NE(f, nullptr);
  const auto data = Pattern(12 * kExtentSize, 7);
  ASSERT_TRUE(f->Write(0, data.data(), data.size()).ok());
  auto free_before = store_->FreeBytes();
  ASSERT_TRUE(free_before.ok()) << free_before.status().ToString();
  // From the middle of extent 5 to the middle of extent 10: extents 6..9 go (6 and 7 mapped
  // from the header, 8 and 9 from leaf 0), 5 and 10 are cut.
  const uint64_t from = 5 * kExtentSize + 100, to = 10 * kExtentSize + 200;
  ASSERT_TRUE(f->PunchHole(from, to - from).ok());
  auto free_after = store_->FreeBytes();
  ASSERT_TRUE(free_after.ok());
  EXPECT_EQ(*free_after, *free_before + 4 * kExtentSize);
  EXPECT_EQ(f->size(), data.size());
  // Another handle (a fresh extent cache) reads the same.
  auto other = store_->OpenFile("punch.db", OpenMode::kExisting);
  ASSERT_TRUE(other.ok());
  for (File* h : {f.get(), other->get()}) {
    std::vector<unsigned char> back(data.size(), 0xee);
    auto n = h->Read(0, back.data(), back.size());
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(0, std::memcmp(back.data(), data.data(), from));
    EXPECT_TRUE(std::all_of(back.begin() + from, back.begin() + to, [](auto c) { return c == 0; }));
    EXPECT_EQ(0, std::memcmp(back.data() + to, data.data() + to, data.size() - to));
  }
  // Writing into the hole again takes a recycled extent back.
  ASSERT_TRUE(f->Write(7 * kExtentSize, data.data(), 10).ok());
  free_after = store_->FreeBytes();
  ASSERT_TRUE(free_after.ok());
  EXPECT_EQ(*free_after, *free_before + 3 * kExtentSize);
  // Cut to within the direct extents: leaf 0 and the extents beyond go too.
  ASSERT_TRUE(f->Truncate(kExtentSize).ok());
  free_after = store_->FreeBytes();
  ASSERT_TRUE(free_after.ok());
  EXPECT_EQ(*free_after, *free_before + 12 * kExtentSize);  // 10 extents and the leaf
  // Allocate publishes extents without changing the size.
  ASSERT_TRUE(f->Allocate(3 * kExtentSize, 2 * kExtentSize).ok());
  EXPECT_EQ(f->size(), kExtentSize);
  free_after = store_->FreeBytes();
  ASSERT_TRUE(free_after.ok());
  EXPECT_EQ(*free_after, *free_before + 10 * kExtentSize);
  ASSERT_TRUE(store_->Delete("punch.db").ok());
}

TEST_F(FileStoreTest, InodesKeepAttributesAndRecycleTheirHeaders) {
  InodeAttr attr{0100644, 1000, 1000, 1, 0, 1, 2, 3};
  auto inode = store_->CreateInode(attr);
  ASSERT_TRUE(inode.ok()) << inode.status().ToString();
  const GlobalAddress header = (*inode)->header();
  const auto data = Pattern(kExtentSize + 10, 8);
  ASSERT_TRUE((*inode)->Write(0, data.data(), data.size()).ok());
  auto opened = store_->OpenInode(header);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ((*opened)->size(), data.size());
  auto read = (*opened)->ReadAttr();
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->mode, 0100644u);
  EXPECT_EQ(read->mtime_ns, 2);
  attr.mode = 0100600;
  ASSERT_TRUE((*opened)->WriteAttr(attr).ok());
  read = (*inode)->ReadAttr();
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->mode, 0100600u);
  // Inodes are not names.
  auto exists = store_->Exists("inode " + header.ToString());
  ASSERT_TRUE(exists.ok());
  EXPECT_FALSE(*exists);

  ASSERT_TRUE(store_->DeleteInode(std::move(*inode)).ok());
  EXPECT_EQ(store_->OpenInode(header).status().code(), StatusCode::kNotFound);
  // Headers are recycled: 4096 creates and deletes (2 MiB of headers if they were not) lease
  // at most the chunk that one block of headers may need.
  auto leased = [&] {
    uint64_t sum = 0;
    for (uint16_t id : pool_->server_ids()) {
      auto stats = pool_->Stats(id);
      EXPECT_TRUE(stats.ok()) << stats.status().ToString();
      if (stats.ok()) sum += stats->leased;
    }
    return sum;
  };
  const uint64_t before = leased();
  for (int i = 0; i < 4096; ++i) {
    auto next = store_->CreateInode(attr);
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    ASSERT_EQ((*next)->size(), 0u);
    ASSERT_TRUE(store_->DeleteInode(std::move(*next)).ok());
  }
  EXPECT_LE(leased() - before, 1u << 20);
}

// A file's extent 0 is on its header's server (2 servers here), so the first page can be read
// in the batch that takes the lock (PostRead posts only reads to the server named), whichever
// server the striping would have picked.
TEST_F(FileStoreTest, TheFirstExtentIsOnTheHeadersServer) {
  const auto page = Pattern(4096, 7);
  for (int i = 0; i < 8; ++i) {
    auto f = Create("first-extent-" + std::to_string(i) + ".db");
    ASSERT_NE(f, nullptr);
    ASSERT_TRUE(f->Write(0, page.data(), page.size()).ok());
    std::vector<unsigned char> got(page.size());
    Batch batch(*pool_);
    auto read = f->PostRead(batch, 0, got.data(), got.size(), f->header().server());
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    ASSERT_NE(read->extent, 0u) << f->name() << ": extent 0 is not on server "
                                << f->header().server();
    ASSERT_TRUE(batch.Wait().ok());
    EXPECT_EQ(got, page);
  }
}

TEST_F(FileStoreTest, HolesReadAsZerosAcrossExtents) {
  auto f = Create("holes.db");
  ASSERT_NE(f, nullptr);
  // A write that straddles the boundary of extents 2 and 3, far beyond the end.
  const uint64_t at = 3 * kExtentSize - 3000;
  const auto data = Pattern(8192, 2);
  ASSERT_TRUE(f->Write(at, data.data(), data.size()).ok());
  EXPECT_EQ(f->size(), at + data.size());
  std::vector<unsigned char> back(f->size(), 0xee);
  auto n = f->Read(0, back.data(), back.size());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, back.size());
  EXPECT_TRUE(std::all_of(back.begin(), back.begin() + at, [](auto c) { return c == 0; }));
  EXPECT_EQ(0, std::memcmp(back.data() + at, data.data(), data.size()));

  // A page write across the boundary and its read back, one batch each.
  const auto page = Pattern(4096, 3);
  const uint64_t counted_before = pool_->counters().round_trips;
  ASSERT_TRUE(f->Write(3 * kExtentSize - 2048, page.data(), page.size()).ok());
  std::vector<unsigned char> got(4096);
  n = f->Read(3 * kExtentSize - 2048, got.data(), got.size());
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(0, std::memcmp(got.data(), page.data(), page.size()));
  EXPECT_LE(pool_->counters().round_trips - counted_before, 2u);

  // An append inside the last mapped extent: one round trip, its new size in the same batch,
  // and another handle sees both.
  const uint64_t end = f->size();
  const uint64_t appended_before = pool_->counters().round_trips;
  ASSERT_TRUE(f->Write(end, page.data(), 100).ok());
  EXPECT_LE(pool_->counters().round_trips - appended_before, 1u);
  EXPECT_EQ(f->size(), end + 100);
  auto other = store_->OpenFile("holes.db", OpenMode::kExisting);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_EQ((*other)->size(), end + 100);
  std::vector<unsigned char> appended(100);
  n = (*other)->Read(end, appended.data(), appended.size());
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 100u);
  EXPECT_EQ(0, std::memcmp(appended.data(), page.data(), 100));

  // Shrinking to inside extent 1 releases extents 2 and 3; growing reads zeros there.
  ASSERT_TRUE(f->Truncate(kExtentSize + 10).ok());
  ASSERT_TRUE(f->Truncate(4 * kExtentSize).ok());
  std::vector<unsigned char> tail(3 * kExtentSize - 10, 0xee);
  n = f->Read(kExtentSize + 10, tail.data(), tail.size());
  ASSERT_TRUE(n.ok());
  EXPECT_TRUE(std::all_of(tail.begin(), tail.end(), [](auto c) { return c == 0; }));
}

TEST_F(FileStoreTest, ReleasedExtentsAreReusedZeroed) {
  auto f = Create("recycle.db");
  ASSERT_NE(f, nullptr);
  const auto data = Pattern(2 * kExtentSize, 4);
  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE(f->Write(0, data.data(), data.size()).ok()) << round;
    ASSERT_TRUE(f->Truncate(0).ok());
  }
  auto g = Create("recycle2.db");
  ASSERT_NE(g, nullptr);
  ASSERT_TRUE(g->Truncate(2 * kExtentSize).ok());
  std::vector<unsigned char> back(2 * kExtentSize, 0xee);
  ASSERT_TRUE(g->Read(0, back.data(), back.size()).ok());
  EXPECT_TRUE(std::all_of(back.begin(), back.end(), [](auto c) { return c == 0; }));
  // Writes that cover part of a recycled extent (f's bytes were in it): the rest of the extent
  // reads as zeros, also from another handle that maps it anew.
  const auto piece = Pattern(1000, 5);
  const uint64_t at[] = {kExtentSize / 2 + 3, 2 * kExtentSize - 300};  // inside; across 1 and 2
  std::vector<unsigned char> want(2 * kExtentSize + 700, 0);
  for (uint64_t a : at) {
    ASSERT_TRUE(g->Write(a, piece.data(), piece.size()).ok()) << a;
    std::copy(piece.begin(), piece.end(), want.begin() + a);
  }
  auto fresh = store_->OpenFile("recycle2.db", OpenMode::kExisting);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  for (File* h : {g.get(), fresh->get()}) {
    std::vector<unsigned char> got(want.size(), 0xee);
    auto n = h->Read(0, got.data(), got.size());
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(*n, want.size());
    EXPECT_TRUE(got == want);
  }
}

TEST_F(FileStoreTest, AFullPoolFailsTheWriteAndKeepsTheFileUpToTheLastOne) {
  auto f = Create("full.db");
  ASSERT_NE(f, nullptr);
  const auto chunk = Pattern(1 << 20, 5);
  Status s;
  uint64_t written = 0;
  while ((s = f->Write(written, chunk.data(), chunk.size())).ok()) written += chunk.size();
  EXPECT_EQ(s.code(), StatusCode::kOutOfMemory) << s.ToString();
  EXPECT_NE(s.message().find("full.db"), std::string::npos) << s.ToString();
  EXPECT_GT(written, 0u);
  EXPECT_EQ(f->size(), written);
  std::vector<unsigned char> back(chunk.size());
  auto n = f->Read(written - chunk.size(), back.data(), back.size());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(back, chunk);
  ASSERT_TRUE(store_->Delete("full.db").ok());  // its extents go to the free list
  auto g = Create("after-full.db");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(g->Write(0, chunk.data(), chunk.size()).ok());
}

TEST_F(FileStoreTest, BadNamesAndRangesAreExplained) {
  auto f = store_->OpenFile(std::string(300, 'x'), OpenMode::kCreate);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find("at most 255"), std::string::npos) << f.status().message();
  EXPECT_EQ(store_->OpenFile("", OpenMode::kCreate).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->OpenFile("never-created", OpenMode::kExisting).status().code(),
            StatusCode::kNotFound);
  auto g = Create("excl.db");
  ASSERT_NE(g, nullptr);
  auto e = store_->OpenFile("excl.db", OpenMode::kCreateExclusive);
  EXPECT_EQ(e.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(e.status().message().find("already exists"), std::string::npos);
  char c = 1;
  Status s = g->Write(kMaxFileSize, &c, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

TEST_F(FileStoreTest, ConcurrentCreatorsOfOneNameGetOneFile) {
  std::vector<std::unique_ptr<FileStore>> stores;
  std::vector<std::unique_ptr<Pool>> pools;
  for (int i = 0; i < 4; ++i) {
    auto pool = Pool::Connect(*cluster_->config());
    ASSERT_TRUE(pool.ok());
    auto store = FileStore::Open(**pool);
    ASSERT_TRUE(store.ok());
    pools.push_back(std::move(*pool));
    stores.push_back(std::move(*store));
  }
  std::vector<GlobalAddress> headers(stores.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < stores.size(); ++i) {
    threads.emplace_back([&, i] {
      auto f = stores[i]->OpenFile("race.db", OpenMode::kCreate);
      if (f.ok()) headers[i] = (*f)->header();
    });
  }
  for (auto& t : threads) t.join();
  for (auto h : headers) EXPECT_EQ(h, headers[0]);
  EXPECT_FALSE(headers[0].is_null());
}

TEST_F(FileStoreTest, LockLevelsBetweenTwoHolders) {
  auto f = Create("locked.db");
  ASSERT_NE(f, nullptr);
  auto sweep = [this](int slot) { return ClearSlot(*store_, slot); };
  auto a_leases = LeaseTable::Attach(*store_, sweep);
  auto b_leases = LeaseTable::Attach(*store_, sweep);
  ASSERT_TRUE(a_leases.ok() && b_leases.ok());
  FileLock a(*pool_, f->lock_word(), **a_leases), b(*pool_, f->lock_word(), **b_leases);

  ASSERT_TRUE(a.Lock(LockLevel::kShared).ok());
  ASSERT_TRUE(b.Lock(LockLevel::kShared).ok());  // many readers
  ASSERT_TRUE(a.Lock(LockLevel::kReserved).ok());
  EXPECT_EQ(b.Lock(LockLevel::kReserved).code(), StatusCode::kAborted);  // one writer
  auto reserved = b.ReservedElsewhere();
  ASSERT_TRUE(reserved.ok());
  EXPECT_TRUE(*reserved);
  // A waits for B to leave, keeping PENDING so that no new reader comes in.
  EXPECT_EQ(a.Lock(LockLevel::kExclusive).code(), StatusCode::kAborted);
  EXPECT_EQ(a.level(), LockLevel::kPending);
  ASSERT_TRUE(b.Unlock(LockLevel::kNone).ok());
  EXPECT_EQ(b.Lock(LockLevel::kShared).code(), StatusCode::kAborted);
  ASSERT_TRUE(a.Lock(LockLevel::kExclusive).ok());
  EXPECT_EQ(a.level(), LockLevel::kExclusive);
  ASSERT_TRUE(a.Unlock(LockLevel::kShared).ok());
  ASSERT_TRUE(b.Lock(LockLevel::kShared).ok());
  ASSERT_TRUE(a.Unlock(LockLevel::kNone).ok());
  ASSERT_TRUE(b.Lock(LockLevel::kExclusive).ok());
  ASSERT_TRUE(b.Unlock(LockLevel::kNone).ok());
  uint64_t word = 1;
  ASSERT_TRUE(pool_->Read(f->lock_word(), &word, 8).ok());
  EXPECT_EQ(word, 0u);
}

// Readers that keep changing the lock word (B, over shared memory, takes and drops SHARED
// without pause) cost a reader over TCP (A) at most one round trip more per lock: its CAS from
// the word it last saw fails, the fetch-and-add of its bit that follows cannot. Before, A
// CASed again from each word returned, which B had changed again by the time it arrived.
TEST_F(FileStoreTest, ASharedLockAmongBusyReadersTakesAtMostTwoRoundTrips) {
  TcpClient c;
  ASSERT_NO_FATAL_FAILURE(ConnectOverTcp("busy-readers.db", &c));
  auto a_leases = LeaseTable::Attach(*c.store, [&](int slot) { return ClearSlot(*c.store, slot); });
  auto b_leases = LeaseTable::Attach(*store_, [&](int slot) { return ClearSlot(*store_, slot); });
  ASSERT_TRUE(a_leases.ok() && b_leases.ok());
  FileLock a(*c.pool, c.file->lock_word(), **a_leases);
  FileLock b(*pool_, c.file->lock_word(), **b_leases);
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    while (!stop.load()) {
      ASSERT_TRUE(b.Lock(LockLevel::kShared).ok());
      ASSERT_TRUE(b.Unlock(LockLevel::kNone).ok());
    }
  });
  auto trips = [&] { return c.pool->counters().round_trips - (*a_leases)->renewals(); };
  uint64_t most = 0;
  for (int i = 0; i < 200; ++i) {
    const uint64_t before = trips();
    ASSERT_TRUE(a.Lock(LockLevel::kShared).ok()) << "lock " << i;
    most = std::max(most, trips() - before);
    ASSERT_TRUE(a.Unlock(LockLevel::kNone).ok());
  }
  stop = true;
  reader.join();
  EXPECT_LE(most, 2u) << "round trips of the costliest SHARED lock among busy readers";
  ASSERT_TRUE(a.Drain().ok());
  ASSERT_TRUE(b.Drain().ok());
  uint64_t word = 1;
  ASSERT_TRUE(pool_->Read(c.file->lock_word(), &word, 8).ok());
  EXPECT_EQ(word, 0u) << "every bit taken was given back";
}

// A thread's first use of a Pool and of each server sets up its connections (seconds under
// load), so the renewal thread connects to every server before Attach claims a slot: done
// lazily, it was the first renewal, and others judged the fresh slot dead meanwhile (lease.h).
// Attach on a store with free slots reads the slots once and claims one with a CAS; the
// renewal thread says hello to every server (Pool::ConnectThread) before Attach returns.
TEST_F(FileStoreTest, TheRenewalThreadIsConnectedBeforeAttachReturns) {
  TcpClient c;
  ASSERT_NO_FATAL_FAILURE(ConnectOverTcp("renewal-connect.db", &c));
  const OpCounters before = c.pool->counters();
  auto leases = LeaseTable::Attach(*c.store, [&](int slot) { return ClearSlot(*c.store, slot); });
  const OpCounters after = c.pool->counters();
  ASSERT_TRUE(leases.ok()) << leases.status().ToString();
  EXPECT_EQ(after.cas - before.cas, 1u) << "the claim";
  EXPECT_EQ(after.reads - before.reads, 1u) << "the slots' read";
  EXPECT_EQ(after.connects - before.connects, c.pool->server_ids().size())
      << "the renewal thread's hello to every server";
  EXPECT_EQ((*leases)->renewals(), 0u) << "no renewal is due yet";
}

// The release of SHARED is posted (file_lock.h). Over TCP each thread has its own connections,
// so a lock taken next by another thread first waits for the release to land: the bit it
// sets must still be there afterwards, also when the releasing thread has ended.
TEST_F(FileStoreTest, AReleasePostedByAnotherThreadNeverUndoesTheNextLock) {
  TcpClient c;
  ASSERT_NO_FATAL_FAILURE(ConnectOverTcp("posted.db", &c));
  auto leases = LeaseTable::Attach(*c.store, [&](int slot) { return ClearSlot(*c.store, slot); });
  ASSERT_TRUE(leases.ok());
  FileLock lock(*c.pool, c.file->lock_word(), **leases);
  const uint64_t mine = uint64_t{1} << (*leases)->slot();
  auto word = [&] {
    uint64_t w = 0;
    EXPECT_TRUE(pool_->Read(c.file->lock_word(), &w, 8).ok());  // another connection
    return w;
  };
  for (int i = 0; i < 50; ++i) {
    std::thread([&] {
      ASSERT_TRUE(lock.Lock(LockLevel::kShared).ok());
      ASSERT_TRUE(lock.Unlock(LockLevel::kNone).ok());  // posted; the thread then ends
    }).join();
    ASSERT_TRUE(lock.Lock(LockLevel::kShared).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // anything in flight lands
    ASSERT_NE(word() & mine, 0u) << "round " << i << ": a late release took the new lock's bit";
    ASSERT_TRUE(lock.Unlock(LockLevel::kNone).ok());
  }
  ASSERT_TRUE(lock.Drain().ok());
  EXPECT_EQ(word() & mine, 0u);
}

}  // namespace
}  // namespace farpool::files
