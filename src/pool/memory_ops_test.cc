// Batch messages' operations: what a client builds, the server executes exactly as the
// one-sided path would, and a bad request changes nothing.
#include "pool/memory_ops.h"

#include <gtest/gtest.h>

#include <cstring>
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

}  // namespace
}  // namespace farpool::memory_ops
