// Batch messages' operations: what a client builds, the server executes exactly as the
// one-sided path would, and a bad request changes nothing.
#include "pool/memory_ops.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <vector>

#include "transport/wire.h"

namespace farpool::memory_ops {
namespace {

class MemoryOpsTest : public ::testing::Test {
 protected:
  MemoryOpsTest() : memory_(64 << 10, std::byte{0}) {
    region_.base = memory_.data();
    region_.size = memory_.size();
    // Pretend [4096, 32768) is leased, plus the root area past its first 64 bytes.
    region_.accessible = [](uint64_t offset, uint64_t size) {
      auto inside = [&](uint64_t lo, uint64_t hi) {
        return offset >= lo && offset <= hi && size <= hi - offset;
      };
      return inside(64, 4096) || inside(4096, 32768);
    };
  }
  // The holder of `lock` writes `written` at `data` and sets the lock word to `word`; the
  // stopped execution `e` (a wait on `lock`, then a read of `data`) is rechecked and run on.
  // Returns its reply's two words: the wait's previous value and the read (0s on a failure).
  std::pair<uint64_t, uint64_t> HolderWritesAndResume(Execution& e, uint64_t data, uint64_t written,
                                                      uint64_t lock, uint64_t word) {
    std::memcpy(memory_.data() + data, &written, 8);
    std::memcpy(memory_.data() + lock, &word, 8);
    EXPECT_TRUE(e.Recheck(region_).ok());
    EXPECT_TRUE(e.Run(region_, Execution::Wait::kMay));
    const std::vector<std::byte> reply = e.TakeReply();
    EXPECT_EQ(reply.size(), 16u);
    uint64_t words[2] = {0, 0};
    if (reply.size() == 16) std::memcpy(words, reply.data(), 16);
    return {words[0], words[1]};
  }
  uint64_t Word(uint64_t offset) const {
    uint64_t v;
    std::memcpy(&v, memory_.data() + offset, 8);
    return v;
  }
  Status Run(const RequestBuilder& b, std::vector<std::byte>* reply = nullptr) {
    auto r = Execute(b.op_count(), b.bytes(), region_);
    if (r.ok() && reply != nullptr) *reply = *r;
    return r.status();
  }
  // A request of a write, then the operation `add` appends: refused as a whole with
  // InvalidArgument naming `needle`, and the write before it did not run either.
  void ExpectRejectedWhole(const std::function<void(RequestBuilder&)>& add, const char* needle) {
    RequestBuilder b;
    b.Write(4096 + 1024, "x", 1);
    add(b);
    const std::vector<std::byte> before = memory_;
    const Status s = Run(b);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    EXPECT_EQ(memory_, before);
  }
  // The operation `add` appends, its encoding cut `cut` bytes short: InvalidArgument.
  void ExpectTruncatedRejected(const std::function<void(RequestBuilder&)>& add, size_t cut) {
    RequestBuilder b;
    add(b);
    const auto bytes = b.bytes();
    EXPECT_EQ(Execute(1, bytes.first(bytes.size() - cut), region_).status().code(),
              StatusCode::kInvalidArgument);
  }

  std::vector<std::byte> memory_;
  Region region_;
};

TEST_F(MemoryOpsTest, ExecutesEveryKindAndRepliesInRequestOrder) {
  RequestBuilder b;
  const char text[] = "hello, pool";
  b.Write(4096, text, sizeof(text));
  b.Read(4096, sizeof(text));
  b.FetchAdd(8192, 5);
  b.FetchAdd(8192, 7);
  b.CompareAndSwap(8192, 12, 100);  // succeeds: 5 + 7
  b.CompareAndSwap(8192, 12, 200);  // fails: the word is 100 now
  b.Read(8192, 8);
  EXPECT_EQ(b.reply_size(), sizeof(text) + 5 * 8);
  std::vector<std::byte> reply;
  ASSERT_TRUE(Run(b, &reply).ok());
  ASSERT_EQ(reply.size(), b.reply_size());
  EXPECT_EQ(std::memcmp(reply.data(), text, sizeof(text)), 0);
  uint64_t results[5];
  std::memcpy(results, reply.data() + sizeof(text), sizeof(results));
  EXPECT_EQ(results[0], 0u);    // previous of the first add
  EXPECT_EQ(results[1], 5u);    // previous of the second
  EXPECT_EQ(results[2], 12u);   // the successful CAS saw 12
  EXPECT_EQ(results[3], 100u);  // the failed one saw 100
  EXPECT_EQ(results[4], 100u);
  EXPECT_EQ(Word(8192), 100u);
}

TEST_F(MemoryOpsTest, ABadOperationAnywhereRejectsTheWholeRequestBeforeAnythingRuns) {
  struct Case {
    const char* name;
    void (*corrupt)(std::vector<std::byte>&);
    const char* needle;
  };
  // Each case builds [write 8 bytes at 4096, fetch-and-add at 8192] and then breaks it.
  const Case cases[] = {
      {"unknown kind", [](std::vector<std::byte>& t) { t[40] = std::byte{9}; }, "unknown kind"},
      {"reserved byte", [](std::vector<std::byte>& t) { t[41] = std::byte{1}; }, "reserved"},
      {"misaligned atomic",
       [](std::vector<std::byte>& t) {
         uint64_t off = 8193;
         std::memcpy(t.data() + 40 + 8, &off, 8);
       },
       "8-byte aligned"},
      {"atomic of 4 bytes",
       [](std::vector<std::byte>& t) {
         uint32_t size = 4;
         std::memcpy(t.data() + 40 + 4, &size, 4);
       },
       "atomics are 8 bytes"},
      {"beyond the region",
       [](std::vector<std::byte>& t) {
         uint64_t off = 64 << 10;
         std::memcpy(t.data() + 40 + 8, &off, 8);
       },
       "beyond the region"},
      {"outside every lease",
       [](std::vector<std::byte>& t) {
         uint64_t off = 40000;
         std::memcpy(t.data() + 40 + 8, &off, 8);
       },
       "leased"},
      {"the null word",
       [](std::vector<std::byte>& t) {
         uint64_t off = 0;
         std::memcpy(t.data() + 40 + 8, &off, 8);
       },
       "leased"},
      {"unused operand",
       [](std::vector<std::byte>& t) { t[40 + 24] = std::byte{1}; },  // FAA's desired
       "unused operand"},
      {"truncated", [](std::vector<std::byte>& t) { t.resize(t.size() - 1); }, "truncated"},
      {"trailing bytes", [](std::vector<std::byte>& t) { t.resize(t.size() + 8); }, "trailing"},
      {"write data cut off", [](std::vector<std::byte>& t) { t.resize(36); }, "truncated"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RequestBuilder b;
    const uint64_t v = 0x1122334455667788;
    b.Write(4096, &v, 8);
    b.FetchAdd(8192, 1);
    std::vector<std::byte> tail(b.bytes().begin(), b.bytes().end());
    ASSERT_EQ(tail.size(), 32u + 8 + 32);
    c.corrupt(tail);
    auto r = Execute(b.op_count(), tail, region_);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status().message();
    EXPECT_EQ(Word(4096), 0u) << "the valid write before the bad operation ran";
    EXPECT_EQ(Word(8192), 0u);
  }
  // A count that disagrees with the tail, both ways.
  RequestBuilder b;
  b.Read(4096, 8);
  EXPECT_FALSE(Execute(2, b.bytes(), region_).ok());
  EXPECT_FALSE(Execute(0, b.bytes(), region_).ok());
}

TEST_F(MemoryOpsTest, RequestsAndRepliesStayWithinOneMessage) {
  RequestBuilder b;
  // Reads fill the reply: the 5th 16 KiB read would exceed kMaxBatchTail.
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(b.Fits(OpKind::kRead, kMaxInlineBytes));
    b.Read(4096, kMaxInlineBytes);
  }
  EXPECT_FALSE(b.Fits(OpKind::kRead, kMaxInlineBytes));
  EXPECT_TRUE(b.Fits(OpKind::kWrite, kMaxInlineBytes)) << "writes add nothing to the reply";
  EXPECT_LE(b.reply_size(), wire::kMaxBatchTail);
  // A request whose reply would not fit is refused by the server too.
  std::vector<std::byte> tail(b.bytes().begin(), b.bytes().end());
  RequestBuilder one;
  one.Read(4096, kMaxInlineBytes);
  tail.insert(tail.end(), one.bytes().begin(), one.bytes().end());
  auto r = Execute(5, tail, region_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("reply would exceed"), std::string::npos);
  b.Clear();
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.reply_size(), 0u);
}

// ---- kLookupRead: the hash index's layout (128-byte buckets: lock, next, 7 entries).

class LookupReadTest : public MemoryOpsTest {
 protected:
  static constexpr uint16_t kServer = 3;
  static constexpr LookupParams kParams{128, 16, 7, 8, kMaxLookupBuckets, 0};
  LookupReadTest() { region_.server_id = kServer; }
  static uint64_t Addr(uint16_t server, uint64_t offset) {
    return GlobalAddress(server, offset).raw();
  }
  void SetWord(uint64_t offset, uint64_t v) { std::memcpy(memory_.data() + offset, &v, 8); }
  void SetEntry(uint64_t bucket, int i, uint64_t key, uint64_t value) {
    SetWord(bucket + 16 + 16 * i, key);
    SetWord(bucket + 16 + 16 * i + 8, value);
  }
  // Runs one lookup-read of `size` bytes; the reply's outcome, value and bytes.
  Status Lookup(uint64_t bucket, uint64_t key, uint32_t size, LookupReply* r,
                std::vector<std::byte>* bytes = nullptr, LookupParams params = kParams) {
    RequestBuilder b;
    b.LookupRead(bucket, params, key, size);
    EXPECT_EQ(b.reply_size(), sizeof(LookupReply) + size);
    std::vector<std::byte> reply;
    FARPOOL_RETURN_IF_ERROR(Run(b, &reply));
    EXPECT_EQ(reply.size(), sizeof(LookupReply) + size);
    std::memcpy(r, reply.data(), sizeof(*r));
    if (bytes != nullptr) bytes->assign(reply.begin() + sizeof(LookupReply), reply.end());
    return Status::Ok();
  }
  static LookupOutcome Outcome(const LookupReply& r) {
    return static_cast<LookupOutcome>(r.outcome);
  }
};

TEST_F(LookupReadTest, FindsTheKeyAndReadsItsRecord) {
  const char record[] = "record of key 42";
  std::memcpy(memory_.data() + 12288, record, sizeof(record));
  SetEntry(4096, 0, 41, Addr(kServer, 16384));
  SetEntry(4096, 1, 42, 0);  // a free slot with a stray key: skipped
  SetEntry(4096, 4, 42, Addr(kServer, 12288));
  LookupReply r;
  std::vector<std::byte> bytes;
  ASSERT_TRUE(Lookup(4096, 42, sizeof(record), &r, &bytes).ok());
  EXPECT_EQ(Outcome(r), LookupOutcome::kFound);
  EXPECT_EQ(r.value, Addr(kServer, 12288));
  EXPECT_EQ(std::memcmp(bytes.data(), record, sizeof(record)), 0);
  // Size 0: the value only.
  ASSERT_TRUE(Lookup(4096, 42, 0, &r).ok());
  EXPECT_EQ(Outcome(r), LookupOutcome::kFoundNotRead);
  EXPECT_EQ(r.value, Addr(kServer, 12288));
}

TEST_F(LookupReadTest, AnAbsentKeyReadsNothing) {
  SetEntry(4096, 0, 41, Addr(kServer, 16384));
  LookupReply r;
  std::vector<std::byte> bytes;
  ASSERT_TRUE(Lookup(4096, 42, 64, &r, &bytes).ok());
  EXPECT_EQ(Outcome(r), LookupOutcome::kAbsent);
  EXPECT_EQ(r.value, 0u);
  EXPECT_EQ(bytes, std::vector<std::byte>(64, std::byte{0}));
}

TEST_F(LookupReadTest, FollowsTheChainOnThisServer) {
  const uint64_t record = 0x0102030405060708;
  SetWord(20480, record);
  SetWord(4096 + 8, Addr(kServer, 8192));
  SetWord(8192 + 8, Addr(kServer, 8320));
  SetEntry(8320, 6, 42, Addr(kServer, 20480));
  LookupReply r;
  std::vector<std::byte> bytes;
  ASSERT_TRUE(Lookup(4096, 42, 8, &r, &bytes).ok());
  EXPECT_EQ(Outcome(r), LookupOutcome::kFound);
  uint64_t got;
  std::memcpy(&got, bytes.data(), 8);
  EXPECT_EQ(got, record);
  // The walk's bound: two buckets are not enough to reach the third.
  LookupParams two = kParams;
  two.max_buckets = 2;
  ASSERT_TRUE(Lookup(4096, 42, 8, &r, nullptr, two).ok());
  EXPECT_EQ(Outcome(r), LookupOutcome::kContinue);
  EXPECT_EQ(r.value, Addr(kServer, 8320));
  // A cycle ends at the default bound, not in a hang.
  SetWord(8192 + 8, Addr(kServer, 4096));
  ASSERT_TRUE(Lookup(4096, 42, 8, &r).ok());
  EXPECT_EQ(Outcome(r), LookupOutcome::kContinue);
}

TEST_F(LookupReadTest, StopsWhereTheChainOrTheRecordLeavesTheServer) {
  SetWord(4096 + 8, Addr(kServer + 1, 8192));
  SetEntry(8192, 0, 42, Addr(kServer, 20480));  // same offset here: must not be read
  LookupReply r;
  std::vector<std::byte> bytes;
  ASSERT_TRUE(Lookup(4096, 42, 8, &r, &bytes).ok());
  EXPECT_EQ(Outcome(r), LookupOutcome::kContinue);
  EXPECT_EQ(r.value, Addr(kServer + 1, 8192));
  SetEntry(4096, 2, 42, Addr(kServer + 1, 20480));
  SetWord(20480, 99);
  ASSERT_TRUE(Lookup(4096, 42, 8, &r, &bytes).ok());
  EXPECT_EQ(Outcome(r), LookupOutcome::kFoundNotRead);
  EXPECT_EQ(r.value, Addr(kServer + 1, 20480));
  EXPECT_EQ(bytes, std::vector<std::byte>(8, std::byte{0}));
}

TEST_F(LookupReadTest, AddressesOutsideTheLeasesEndTheLookupAndTouchNothing) {
  // A next bucket beyond the leases, one beyond the region, one misaligned; a record beyond
  // the leases, and one straddling the region's end.
  SetWord(40000, 7);
  const uint64_t bad_next[] = {Addr(kServer, 40960), Addr(kServer, (64 << 10) - 64),
                               Addr(kServer, 8193), Addr(kServer, uint64_t{1} << 40)};
  for (uint64_t next : bad_next) {
    SCOPED_TRACE(next);
    SetWord(4096 + 8, next);
    LookupReply r;
    ASSERT_TRUE(Lookup(4096, 42, 8, &r).ok());
    EXPECT_EQ(Outcome(r), LookupOutcome::kOutOfBounds);
    EXPECT_EQ(r.value, next & GlobalAddress::kOffsetMask);
  }
  SetWord(4096 + 8, 0);
  const uint64_t bad_record[] = {Addr(kServer, 40000), Addr(kServer, (64 << 10) - 4),
                                 Addr(kServer, 16)};
  for (uint64_t record : bad_record) {
    SCOPED_TRACE(record);
    SetEntry(4096, 0, 42, record);
    LookupReply r;
    std::vector<std::byte> bytes;
    ASSERT_TRUE(Lookup(4096, 42, 8, &r, &bytes).ok());
    EXPECT_EQ(Outcome(r), LookupOutcome::kOutOfBounds);
    EXPECT_EQ(bytes, std::vector<std::byte>(8, std::byte{0}));
  }
  const std::vector<std::byte> before = memory_;
  // The rest of the batch still runs; the lookup wrote nothing.
  RequestBuilder b;
  b.LookupRead(4096, kParams, 42, 8);
  b.Read(4096, 8);
  std::vector<std::byte> reply;
  ASSERT_TRUE(Run(b, &reply).ok());
  EXPECT_EQ(reply.size(), sizeof(LookupReply) + 8 + 8);
  EXPECT_EQ(memory_, before);
}

TEST_F(LookupReadTest, MalformedLookupsRejectTheWholeRequest) {
  struct Case {
    const char* name;
    uint64_t bucket;
    LookupParams params;
    uint32_t size;
    const char* needle;
  };
  const Case cases[] = {
      {"bucket outside the leases", 40960, kParams, 8, "not inside the root area"},
      {"bucket beyond the region", (64 << 10) - 64, kParams, 8, "beyond the region"},
      {"misaligned bucket", 4100, kParams, 8, "not 8-byte aligned"},
      {"bucket too large", 4096, {8192, 16, 7, 8, 64, 0}, 8, "bucket size"},
      {"entries beyond the bucket", 4096, {128, 16, 8, 8, 64, 0}, 8, "entries"},
      {"no entries", 4096, {128, 16, 0, 8, 64, 0}, 8, "entries"},
      {"next word beyond the bucket", 4096, {128, 16, 7, 128, 64, 0}, 8, "next word"},
      {"unbounded walk", 4096, {128, 16, 7, 8, 65, 0}, 8, "max buckets"},
      {"reserved parameter", 4096, {128, 16, 7, 8, 64, 1}, 8, "reserved"},
      {"record too large", 4096, kParams, kMaxInlineBytes + 1, "record size"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ExpectRejectedWhole([&](RequestBuilder& b) { b.LookupRead(c.bucket, c.params, 42, c.size); },
                        c.needle);
  }
  // A truncated parameter block.
  ExpectTruncatedRejected([](RequestBuilder& b) { b.LookupRead(4096, kParams, 42, 8); }, 4);
}

// ---- kLookupLockRead: the same buckets; records of 32 bytes, lock word first, bit 0 = held.

class LockReadTest : public LookupReadTest {
 protected:
  static constexpr LockReadParams kLock{kParams, 1, 0, 0};
  static constexpr uint64_t kMine = 0x0003'0000'0000'0005;  // odd: held
  static constexpr uint32_t kSize = 32;
  // Runs one lookup-lock-read; the reply's LookupReply, the word found and the bytes read.
  Status LockRead(uint64_t bucket, uint64_t key, LookupReply* r, uint64_t* found,
                  std::vector<std::byte>* bytes) {
    RequestBuilder b;
    b.LookupLockRead(bucket, kLock, key, kMine, kSize);
    EXPECT_EQ(b.reply_size(), sizeof(LookupReply) + 8 + kSize);
    std::vector<std::byte> reply;
    FARPOOL_RETURN_IF_ERROR(Run(b, &reply));
    EXPECT_EQ(reply.size(), sizeof(LookupReply) + 8 + kSize);
    std::memcpy(r, reply.data(), sizeof(*r));
    std::memcpy(found, reply.data() + sizeof(LookupReply), 8);
    bytes->assign(reply.begin() + sizeof(LookupReply) + 8, reply.end());
    return Status::Ok();
  }
  static uint64_t At(const std::vector<std::byte>& bytes, size_t at) {
    uint64_t v;
    std::memcpy(&v, bytes.data() + at, 8);
    return v;
  }
};

TEST_F(LockReadTest, TakesAFreeRecordFromWhateverWordItHasAndReadsItLocked) {
  SetWord(12288, 6);  // unlocked, newest version 3
  SetWord(12288 + 8, 42);
  SetEntry(4096, 3, 42, Addr(kServer, 12288));
  std::vector<Range> changed;
  region_.changed = &changed;
  LookupReply r;
  uint64_t found = 0;
  std::vector<std::byte> bytes;
  ASSERT_TRUE(LockRead(4096, 42, &r, &found, &bytes).ok());
  EXPECT_EQ(Outcome(r), LookupOutcome::kFound);
  EXPECT_EQ(r.value, Addr(kServer, 12288));
  EXPECT_EQ(found, 6u);            // the word it was taken from: the version locked
  EXPECT_EQ(Word(12288), kMine);   // ours now
  EXPECT_EQ(At(bytes, 0), kMine);  // the copy is read behind the lock
  EXPECT_EQ(At(bytes, 8), 42u);
  ASSERT_EQ(changed.size(), 1u);  // a replica and the waiters learn of the swap
  EXPECT_EQ(changed[0].offset, 12288u);
  EXPECT_EQ(changed[0].size, 8u);
  // The client's decoding: locked, the word and the bytes.
  RequestBuilder b;
  b.LookupLockRead(4096, kLock, 42, kMine + 2, kSize);
  SetWord(12288, 8);
  auto reply = Execute(b.op_count(), b.bytes(), region_);
  ASSERT_TRUE(reply.ok());
  LockReadResult result;
  std::vector<std::byte> record(kSize);
  ASSERT_TRUE(DecodeLockReadReply(reply->data(), kServer, 1, kSize, record.data(), &result).ok());
  EXPECT_EQ(result.lookup.outcome, LookupResult::Outcome::kFound);
  EXPECT_TRUE(result.locked);
  EXPECT_EQ(result.found, 8u);
  EXPECT_EQ(At(record, 0), kMine + 2);
}

TEST_F(LockReadTest, AHeldOrRemovedRecordIsCopiedNotTaken) {
  SetWord(12288 + 8, 42);
  SetEntry(4096, 0, 42, Addr(kServer, 12288));
  std::vector<Range> changed;
  region_.changed = &changed;
  for (const uint64_t held : {uint64_t{0x0001'0000'0000'0003}, ~uint64_t{0}}) {
    SCOPED_TRACE(held);
    SetWord(12288, held);
    LookupReply r;
    uint64_t found = 0;
    std::vector<std::byte> bytes;
    ASSERT_TRUE(LockRead(4096, 42, &r, &found, &bytes).ok());
    EXPECT_EQ(Outcome(r), LookupOutcome::kFound);
    EXPECT_EQ(found, held);
    EXPECT_EQ(Word(12288), held);   // unchanged: it never waits, never takes a held word
    EXPECT_EQ(At(bytes, 0), held);  // the copy shows the holder
    LockReadResult result;
    std::vector<std::byte> record(kSize);
    RequestBuilder b;
    b.LookupLockRead(4096, kLock, 42, kMine, kSize);
    auto reply = Execute(b.op_count(), b.bytes(), region_);
    ASSERT_TRUE(reply.ok());
    ASSERT_TRUE(DecodeLockReadReply(reply->data(), kServer, 1, kSize, record.data(), &result).ok());
    EXPECT_FALSE(result.locked);
  }
  EXPECT_TRUE(changed.empty());
}

TEST_F(LockReadTest, WhatIsNotReadHereIsNotLocked) {
  // Absent; the record on another server (same offset here: must not be touched); the chain
  // going on elsewhere.
  SetWord(12288, 6);
  LookupReply r;
  uint64_t found = 1;
  std::vector<std::byte> bytes;
  ASSERT_TRUE(LockRead(4096, 42, &r, &found, &bytes).ok());
  EXPECT_EQ(Outcome(r), LookupOutcome::kAbsent);
  EXPECT_EQ(found, 0u);
  EXPECT_EQ(bytes, std::vector<std::byte>(kSize, std::byte{0}));
  SetEntry(4096, 0, 42, Addr(kServer + 1, 12288));
  ASSERT_TRUE(LockRead(4096, 42, &r, &found, &bytes).ok());
  EXPECT_EQ(Outcome(r), LookupOutcome::kFoundNotRead);
  EXPECT_EQ(r.value, Addr(kServer + 1, 12288));
  EXPECT_EQ(Word(12288), 6u);
  SetEntry(4096, 0, 0, 0);
  SetWord(4096 + 8, Addr(kServer + 1, 8192));
  ASSERT_TRUE(LockRead(4096, 42, &r, &found, &bytes).ok());
  EXPECT_EQ(Outcome(r), LookupOutcome::kContinue);
  EXPECT_EQ(Word(12288), 6u);
  LockReadResult result;
  std::vector<std::byte> record(kSize, std::byte{7});
  RequestBuilder b;
  b.LookupLockRead(4096, kLock, 42, kMine, kSize);
  auto reply = Execute(b.op_count(), b.bytes(), region_);
  ASSERT_TRUE(reply.ok());
  ASSERT_TRUE(DecodeLockReadReply(reply->data(), kServer, 1, kSize, record.data(), &result).ok());
  EXPECT_EQ(result.lookup.outcome, LookupResult::Outcome::kContinue);
  EXPECT_FALSE(result.locked);
  EXPECT_EQ(record, std::vector<std::byte>(kSize, std::byte{7}));  // not written
}

TEST_F(LockReadTest, ARecordOutsideTheLeasesIsNeitherLockedNorRead) {
  SetWord(40000, 6);  // beyond the leases
  for (const uint64_t record : {Addr(kServer, 40000), Addr(kServer, (64 << 10) - 16),
                                Addr(kServer, 12292)}) {  // straddles the end; misaligned
    SCOPED_TRACE(record);
    SetEntry(4096, 0, 42, record);
    const std::vector<std::byte> before = memory_;
    LookupReply r;
    uint64_t found = 0;
    std::vector<std::byte> bytes;
    ASSERT_TRUE(LockRead(4096, 42, &r, &found, &bytes).ok());
    EXPECT_EQ(Outcome(r), LookupOutcome::kOutOfBounds);
    EXPECT_EQ(r.value, record & GlobalAddress::kOffsetMask);
    EXPECT_EQ(memory_, before);
    RequestBuilder b;
    b.LookupLockRead(4096, kLock, 42, kMine, kSize);
    auto reply = Execute(b.op_count(), b.bytes(), region_);
    ASSERT_TRUE(reply.ok());
    LockReadResult result;
    std::vector<std::byte> out(kSize);
    const Status st = DecodeLockReadReply(reply->data(), kServer, 1, kSize, out.data(), &result);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("outside the region"), std::string::npos) << st.message();
    EXPECT_FALSE(result.locked);
  }
}

TEST_F(LockReadTest, MalformedLockReadsRejectTheWholeRequest) {
  struct Case {
    const char* name;
    uint64_t bucket;
    LockReadParams params;
    uint64_t desired;
    uint32_t size;
    const char* needle;
  };
  const Case cases[] = {
      {"bucket outside the leases", 40960, kLock, kMine, kSize, "not inside the root area"},
      {"misaligned bucket", 4100, kLock, kMine, kSize, "not 8-byte aligned"},
      {"bad bucket layout", 4096, {{128, 16, 8, 8, 64, 0}, 1, 0, 0}, kMine, kSize, "entries"},
      {"no held mask", 4096, {kParams, 0, 0, 0}, kMine, kSize, "held mask"},
      {"zero lock word", 4096, kLock, 0, kSize, "lock word is zero"},
      {"lock word beyond the record", 4096, {kParams, 1, 32, 0}, kMine, kSize, "lock word at"},
      {"misaligned lock word", 4096, {kParams, 1, 4, 0}, kMine, kSize, "lock word at"},
      {"reserved parameter", 4096, {kParams, 1, 0, 1}, kMine, kSize, "reserved"},
      {"no record", 4096, kLock, kMine, 0, "record size"},
      {"record too large", 4096, kLock, kMine, kMaxInlineBytes + 1, "record size"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ExpectRejectedWhole(
        [&](RequestBuilder& b) { b.LookupLockRead(c.bucket, c.params, 42, c.desired, c.size); },
        c.needle);
  }
  ExpectTruncatedRejected([](RequestBuilder& b) { b.LookupLockRead(4096, kLock, 42, kMine, 8); },
                          4);
}

// ---- kInsertIfAbsent: the same buckets; the lock word is the bucket's first word.

class InsertTest : public LookupReadTest {
 protected:
  static constexpr uint64_t kMine = 0x0003000000000005;  // a lock word (odd, nonzero)
  static constexpr InsertParams kInsert{kParams, kMine, 0, {0, 0, 0}};
  Status Insert(uint64_t bucket, uint64_t key, uint64_t value, InsertReply* r,
                InsertParams params = kInsert) {
    RequestBuilder b;
    b.InsertIfAbsent(bucket, params, key, value);
    EXPECT_EQ(b.reply_size(), sizeof(InsertReply));
    std::vector<std::byte> reply;
    FARPOOL_RETURN_IF_ERROR(Run(b, &reply));
    EXPECT_EQ(reply.size(), sizeof(InsertReply));
    std::memcpy(r, reply.data(), sizeof(*r));
    return Status::Ok();
  }
  static InsertOutcome Outcome(const InsertReply& r) {
    return static_cast<InsertOutcome>(r.outcome);
  }
};

TEST_F(InsertTest, InsertsIntoTheFirstFreeEntryAndReleasesTheLock) {
  SetEntry(4096, 0, 41, Addr(kServer, 16384));
  SetEntry(4096, 1, 42, 0);  // free, with a stray key: taken (the key is rewritten)
  InsertReply r;
  ASSERT_TRUE(Insert(4096, 43, Addr(kServer, 12288), &r).ok());
  EXPECT_EQ(Outcome(r), InsertOutcome::kInserted);
  EXPECT_EQ(r.value, Addr(kServer, 12288));
  EXPECT_EQ(Word(4096 + 16 + 16), 43u);
  EXPECT_EQ(Word(4096 + 16 + 24), Addr(kServer, 12288));
  EXPECT_EQ(Word(4096), 0u);  // unlocked
  // The same key again: found, nothing changed.
  const std::vector<std::byte> before = memory_;
  ASSERT_TRUE(Insert(4096, 43, Addr(kServer, 20480), &r).ok());
  EXPECT_EQ(Outcome(r), InsertOutcome::kFound);
  EXPECT_EQ(r.value, Addr(kServer, 12288));
  EXPECT_EQ(memory_, before);
  // A lookup-read finds what the insert made live.
  LookupReply l;
  ASSERT_TRUE(Lookup(4096, 43, 0, &l).ok());
  EXPECT_EQ(l.value, Addr(kServer, 12288));
}

// A server whose backups share its pages records the insert it runs in the root area of the
// region that holds the lock (wire::kInsertIntentOffset) and clears it once the lock is
// released; a busy lock leaves the record cleared too.
TEST_F(InsertTest, TheIntentRecordNamesTheLockAndIsClearedAfterTheRelease) {
  uint64_t* const intent = reinterpret_cast<uint64_t*>(memory_.data() + wire::kInsertIntentOffset);
  std::vector<uint64_t> asked;
  region_.insert_intent = [&](uint64_t offset) {
    asked.push_back(offset);
    return intent;
  };
  InsertReply r;
  ASSERT_TRUE(Insert(4096, 43, Addr(kServer, 12288), &r).ok());
  EXPECT_EQ(Outcome(r), InsertOutcome::kInserted);
  EXPECT_EQ(asked, std::vector<uint64_t>{4096});
  EXPECT_EQ(intent[1], kMine) << "the lock word was not recorded";
  EXPECT_EQ(intent[0], 0u) << "the record outlived the release";
  EXPECT_EQ(Word(4096), 0u);
  SetWord(4096, 0x0007000000000003);
  intent[1] = 0;
  ASSERT_TRUE(Insert(4096, 44, Addr(kServer, 12288), &r).ok());
  EXPECT_EQ(Outcome(r), InsertOutcome::kBusy);
  EXPECT_EQ(intent[1], kMine);
  EXPECT_EQ(intent[0], 0u);
}

TEST_F(InsertTest, AHeldLockChangesNothing) {
  const uint64_t theirs = 0x0007000000000003;
  SetWord(4096, theirs);
  const std::vector<std::byte> before = memory_;
  InsertReply r;
  ASSERT_TRUE(Insert(4096, 43, Addr(kServer, 12288), &r).ok());
  EXPECT_EQ(Outcome(r), InsertOutcome::kBusy);
  EXPECT_EQ(r.value, theirs);
  EXPECT_EQ(memory_, before);
}

TEST_F(InsertTest, WalksTheChainOnThisServerAndLeavesTheRestToTheCaller) {
  // A full head, its overflow bucket on this server with a free entry: inserted there.
  for (int i = 0; i < 7; ++i) SetEntry(4096, i, 100 + i, Addr(kServer, 16384 + 64 * i));
  SetWord(4096 + 8, Addr(kServer, 8192));
  InsertReply r;
  ASSERT_TRUE(Insert(4096, 43, Addr(kServer, 12288), &r).ok());
  EXPECT_EQ(Outcome(r), InsertOutcome::kInserted);
  EXPECT_EQ(Word(8192 + 16), 43u);
  EXPECT_EQ(Word(8192 + 24), Addr(kServer, 12288));
  // A key that lives further along the chain is found, not inserted twice.
  ASSERT_TRUE(Insert(4096, 103, Addr(kServer, 20480), &r).ok());
  EXPECT_EQ(Outcome(r), InsertOutcome::kFound);
  EXPECT_EQ(r.value, Addr(kServer, 16384 + 64 * 3));
  // A chain with no free entry, one that goes on at another server, one past the walk's
  // bound: not done, lock released, nothing changed.
  for (int i = 1; i < 7; ++i) SetEntry(8192, i, 200 + i, Addr(kServer, 16384));
  std::vector<std::byte> before = memory_;
  ASSERT_TRUE(Insert(4096, 44, Addr(kServer, 12544), &r).ok());
  EXPECT_EQ(Outcome(r), InsertOutcome::kNotDone);
  EXPECT_EQ(memory_, before);
  SetWord(8192 + 8, Addr(kServer + 1, 8320));
  before = memory_;
  ASSERT_TRUE(Insert(4096, 44, Addr(kServer, 12544), &r).ok());
  EXPECT_EQ(Outcome(r), InsertOutcome::kNotDone);
  EXPECT_EQ(memory_, before);
  SetWord(8192 + 8, 0);
  SetEntry(8192, 6, 206, 0);  // a free entry in the second bucket
  InsertParams one = kInsert;
  one.layout.max_buckets = 1;
  before = memory_;
  ASSERT_TRUE(Insert(4096, 44, Addr(kServer, 12544), &r, one).ok());
  EXPECT_EQ(Outcome(r), InsertOutcome::kNotDone);
  EXPECT_EQ(memory_, before);
}

TEST_F(InsertTest, ABucketOutsideTheLeasesEndsTheInsertAndReleasesTheLock) {
  for (int i = 0; i < 7; ++i) SetEntry(4096, i, 100 + i, Addr(kServer, 16384));
  const uint64_t bad_next[] = {Addr(kServer, 40960), Addr(kServer, (64 << 10) - 64),
                               Addr(kServer, 8193)};
  for (uint64_t next : bad_next) {
    SCOPED_TRACE(next);
    SetWord(4096 + 8, next);
    const std::vector<std::byte> before = memory_;
    InsertReply r;
    ASSERT_TRUE(Insert(4096, 43, Addr(kServer, 12288), &r).ok());
    EXPECT_EQ(Outcome(r), InsertOutcome::kOutOfBounds);
    EXPECT_EQ(r.value, next & GlobalAddress::kOffsetMask);
    EXPECT_EQ(memory_, before);
  }
}

TEST_F(InsertTest, MalformedInsertsRejectTheWholeRequest) {
  struct Case {
    const char* name;
    uint64_t bucket;
    InsertParams params;
    uint64_t value;
    const char* needle;
  };
  InsertParams no_lock = kInsert, lock_outside = kInsert, lock_misaligned = kInsert,
               reserved = kInsert, bad_layout = kInsert;
  no_lock.lock_word = 0;
  lock_outside.lock_offset = 128;
  lock_misaligned.lock_offset = 4;
  reserved.reserved[1] = 1;
  bad_layout.layout.entry_count = 8;
  const Case cases[] = {
      {"bucket outside the leases", 40960, kInsert, 1, "not inside the root area"},
      {"misaligned bucket", 4100, kInsert, 1, "not 8-byte aligned"},
      {"zero value", 4096, kInsert, 0, "value is zero"},
      {"zero lock word", 4096, no_lock, 1, "lock word is zero"},
      {"lock word beyond the bucket", 4096, lock_outside, 1, "lock word"},
      {"misaligned lock word", 4096, lock_misaligned, 1, "lock word"},
      {"reserved parameter", 4096, reserved, 1, "reserved"},
      {"entries beyond the bucket", 4096, bad_layout, 1, "entries"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ExpectRejectedWhole(
        [&](RequestBuilder& b) { b.InsertIfAbsent(c.bucket, c.params, 42, c.value); }, c.needle);
  }
  ExpectTruncatedRejected([](RequestBuilder& b) { b.InsertIfAbsent(4096, kInsert, 42, 1); }, 4);
}

// ---- kWaitCompareAndSwap: Execute (and every client path) makes one attempt; a memory
// server's Execution stops at a held word with the rest of the batch behind it.

WaitParams HeldIsOdd(uint32_t wait_us, uint32_t flags = 0) {
  return {1, ~uint64_t{0}, wait_us, flags};  // held: bit 0 set, except all ones
}

TEST_F(MemoryOpsTest, AWaitingCasIsOneAttemptInExecute) {
  const uint64_t lock = 4096;
  uint64_t held = 3;
  std::memcpy(memory_.data() + lock, &held, 8);
  RequestBuilder b;
  b.WaitCompareAndSwap(lock, 0, 5, HeldIsOdd(1000));
  std::vector<std::byte> reply;
  ASSERT_TRUE(Run(b, &reply).ok());
  uint64_t prev;
  std::memcpy(&prev, reply.data(), 8);
  EXPECT_EQ(prev, 3u);
  EXPECT_EQ(Word(lock), 3u) << "a held word is not swapped";
  EXPECT_FALSE(WaitCompareAndSwapSwapped(prev, 0, HeldIsOdd(0)));
}

TEST_F(MemoryOpsTest, AnExecutionStopsAtAHeldWordAndResumesInOrder) {
  const uint64_t lock = 4096, data = 4104;
  uint64_t held = 3;
  std::memcpy(memory_.data() + lock, &held, 8);
  RequestBuilder b;
  const uint64_t before = 0x1111;
  b.Write(data, &before, 8);
  b.WaitCompareAndSwap(lock, 2, 5, HeldIsOdd(1000, kWaitTakeFree));
  b.Read(data, 8);
  auto e = Execution::Check(b.op_count(), b.bytes(), region_);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_FALSE(e->Run(region_, Execution::Wait::kMay));
  EXPECT_EQ(e->waiting_offset(), lock);
  EXPECT_EQ(e->waiting_us(), 1000u);
  EXPECT_EQ(Word(data), before) << "the operations before it ran";
  // Still held: stops again. Then the holder writes and releases to a free word other than
  // the one expected: taken from it (kWaitTakeFree), and the read behind sees the write.
  ASSERT_FALSE(e->Run(region_, Execution::Wait::kMay));
  const uint64_t after = 0x2222, released = 4;
  const auto [prev, read] = HolderWritesAndResume(*e, data, after, lock, released);
  EXPECT_EQ(prev, released);
  EXPECT_TRUE(WaitCompareAndSwapSwapped(prev, 2, HeldIsOdd(0, kWaitTakeFree)));
  EXPECT_EQ(Word(lock), 5u);
  EXPECT_EQ(read, after);
}

TEST_F(MemoryOpsTest, AnExpiredWaiterIsAnsweredAndTheRestRuns) {
  const uint64_t lock = 4096, other = 4112;
  uint64_t held = 3;
  std::memcpy(memory_.data() + lock, &held, 8);
  std::memcpy(memory_.data() + other, &held, 8);
  RequestBuilder b;
  b.WaitCompareAndSwap(lock, 0, 5, HeldIsOdd(10));
  b.WaitCompareAndSwap(other, 0, 5, HeldIsOdd(10));
  auto e = Execution::Check(b.op_count(), b.bytes(), region_);
  ASSERT_TRUE(e.ok());
  ASSERT_FALSE(e->Run(region_, Execution::Wait::kMay));
  // The bound of the first passed: answered with the holder's word; the second may stop.
  ASSERT_FALSE(e->Run(region_, Execution::Wait::kExpireCurrent));
  EXPECT_EQ(e->waiting_offset(), other);
  ASSERT_TRUE(e->Run(region_, Execution::Wait::kExpireCurrent));
  const std::vector<std::byte> reply = e->TakeReply();
  uint64_t prev[2];
  std::memcpy(prev, reply.data(), 16);
  EXPECT_EQ(prev[0], 3u);
  EXPECT_EQ(prev[1], 3u);
  EXPECT_EQ(Word(lock), 3u);
}

TEST_F(MemoryOpsTest, AWaiterWhoseLeaseWentIsRefusedOnResume) {
  const uint64_t lock = 4096;
  uint64_t held = 3;
  std::memcpy(memory_.data() + lock, &held, 8);
  RequestBuilder b;
  b.WaitCompareAndSwap(lock, 0, 5, HeldIsOdd(1000));
  auto e = Execution::Check(b.op_count(), b.bytes(), region_);
  ASSERT_TRUE(e.ok());
  ASSERT_FALSE(e->Run(region_, Execution::Wait::kMay));
  region_.accessible = [](uint64_t offset, uint64_t) { return offset < 4096; };  // released
  const Status s = e->Recheck(region_);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("released while it waited"), std::string::npos) << s.message();
}

// kWaitOnly: a wait-until-free that changes nothing. It stops while the word is still the
// holder it names, is answered once that holder let go (released, or another holder since),
// and the read behind it then sees what the holder wrote before it let go.
TEST_F(MemoryOpsTest, AWaitOnlyWaitsForItsHolderAndChangesNothing) {
  const uint64_t lock = 4096, data = 4104, holder = 3;
  std::memcpy(memory_.data() + lock, &holder, 8);
  std::vector<Range> changed;
  region_.changed = &changed;
  // In Execute: one attempt, the holder's word answered, nothing swapped or reported changed.
  {
    RequestBuilder b;
    b.WaitCompareAndSwap(lock, holder, 0, HeldIsOdd(1000, kWaitOnly));
    std::vector<std::byte> reply;
    ASSERT_TRUE(Run(b, &reply).ok());
    uint64_t prev;
    std::memcpy(&prev, reply.data(), 8);
    EXPECT_EQ(prev, holder);
    EXPECT_FALSE(WaitCompareAndSwapSwapped(prev, holder, HeldIsOdd(0, kWaitOnly)));
  }
  RequestBuilder b;
  b.WaitCompareAndSwap(lock, holder, 0, HeldIsOdd(1000, kWaitOnly));
  b.Read(data, 8);
  auto e = Execution::Check(b.op_count(), b.bytes(), region_);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_FALSE(e->Run(region_, Execution::Wait::kMay)) << "stops while the holder holds it";
  EXPECT_EQ(e->waiting_offset(), lock);
  // The holder writes, then hands the word straight to another holder (5): ours let go.
  const uint64_t written = 0x3333, next_holder = 5;
  const auto [prev, read] = HolderWritesAndResume(*e, data, written, lock, next_holder);
  EXPECT_EQ(prev, next_holder);
  EXPECT_EQ(read, written);
  EXPECT_EQ(Word(lock), next_holder) << "a wait-only swaps nothing";
  EXPECT_FALSE(WaitCompareAndSwapSwapped(prev, holder, HeldIsOdd(0, kWaitOnly)));
  EXPECT_TRUE(changed.empty()) << "a wait-only reports no change (nothing to forward or wake)";
  // A free word, or the not_held word, is answered at once even if it is the one named.
  for (const uint64_t word : {uint64_t{4}, ~uint64_t{0}}) {
    std::memcpy(memory_.data() + lock, &word, 8);
    RequestBuilder once;
    once.WaitCompareAndSwap(lock, word, 0, HeldIsOdd(1000, kWaitOnly));
    auto f = Execution::Check(once.op_count(), once.bytes(), region_);
    ASSERT_TRUE(f.ok());
    EXPECT_TRUE(f->Run(region_, Execution::Wait::kMay)) << word;
    EXPECT_EQ(Word(lock), word);
  }
}

TEST_F(MemoryOpsTest, MalformedWaitingCasesRejectTheWholeRequest) {
  const uint64_t lock = 4096;
  for (const WaitParams& bad :
       {WaitParams{0, 0, 10, 0}, WaitParams{1, 0, kMaxWaitUs + 1, 0}, WaitParams{1, 0, 10, 4},
        WaitParams{1, 0, 10, kWaitOnly | kWaitTakeFree}}) {
    ExpectRejectedWhole([&](RequestBuilder& b) { b.WaitCompareAndSwap(lock, 0, 5, bad); },
                        "wait-compare-and-swap");
  }
  ExpectRejectedWhole(
      [&](RequestBuilder& b) { b.WaitCompareAndSwap(lock, 3, 5, HeldIsOdd(10, kWaitOnly)); },
      "wait-only with a nonzero desired word");
  ExpectRejectedWhole(
      [&](RequestBuilder& b) { b.WaitCompareAndSwap(lock + 4, 0, 5, HeldIsOdd(10)); }, "aligned");
  ExpectRejectedWhole([](RequestBuilder& b) { b.WaitCompareAndSwap(40000, 0, 5, HeldIsOdd(10)); },
                      "not inside");
  ExpectTruncatedRejected(
      [&](RequestBuilder& b) { b.WaitCompareAndSwap(lock, 0, 5, HeldIsOdd(10)); }, 8);
}

}  // namespace
}  // namespace farpool::memory_ops
