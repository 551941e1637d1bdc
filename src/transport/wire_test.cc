#include "transport/wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace farpool::wire {
namespace {

std::vector<std::byte> Bytes(std::string_view s) {
  auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

TEST(Wire, EveryMessageRoundTrips) {
  auto lease = Encode(41, LeaseRequest{8 << 20, 0, 0});
  auto m = Decode(lease);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->opcode, Opcode::kLeaseRequest);
  EXPECT_EQ(m->header.request_id, 41u);
  EXPECT_EQ(m->As<LeaseRequest>().size, 8u << 20);
  EXPECT_TRUE(m->tail.empty());

  HelloReply hr{};
  hr.server_id = 9;
  hr.region_size = 1 << 30;
  auto rkey = Bytes("packed-remote-key");
  hr.rkey_size = static_cast<uint32_t>(rkey.size());
  auto hello = Encode(7, hr, rkey);
  auto hm = Decode(hello);
  ASSERT_TRUE(hm.ok()) << hm.status().ToString();
  EXPECT_EQ(hm->As<HelloReply>().server_id, 9);
  EXPECT_EQ(std::vector<std::byte>(hm->tail.begin(), hm->tail.end()), rkey);

  for (auto bytes : {Encode(1, HelloRequest{1, 2}), Encode(2, LeaseReply{4096, 4096}),
                     Encode(3, ReleaseRequest{4096, 4096}), Encode(4, ReleaseReply{4096}),
                     Encode(5, StatsRequest{0}), Encode(6, StatsReply{}),
                     Encode(7, EvictRequest{0x1234}), Encode(8, EvictReply{2, kEvictKilled}),
                     Encode(9, GoodbyeRequest{0x1234}), Encode(10, GoodbyeReply{1, 0}),
                     Encode(11, ChallengeRequest{}), Encode(12, ChallengeReply{})}) {
    EXPECT_TRUE(Decode(bytes).ok());
  }

  // A drained server's refusal names it.
  const auto moving = Encode(13, MovingReply{4, {}});
  auto mm = Decode(moving);
  ASSERT_TRUE(mm.ok()) << mm.status().ToString();
  EXPECT_EQ(mm->opcode, Opcode::kMovingReply);
  EXPECT_EQ(mm->As<MovingReply>().server_id, 4);

  // A moved region's file, for a client that maps it after a failover.
  const auto file = Encode(14, MovedFileReply{1234, 5678, 99, 7, 0, 64 << 20});
  auto fm = Decode(file);
  ASSERT_TRUE(fm.ok()) << fm.status().ToString();
  EXPECT_EQ(fm->opcode, Opcode::kMovedFileReply);
  EXPECT_EQ(fm->As<MovedFileReply>().fd, 7);
  EXPECT_EQ(fm->As<MovedFileReply>().size, uint64_t{64} << 20);
  const auto ask = Encode(15, MovedFileRequest{1, {}});
  EXPECT_TRUE(Decode(ask).ok());
  EXPECT_EQ(OpcodeName(Opcode::kMovingReply), "MovingReply");
  // A primary gives its backup slot's copy up (fuzz seed replicate_detach).
  const auto detach = Encode(5, ReplicateRequest{0, 1, 0, 0, kReplicateDetach});
  auto dm = Decode(detach);
  ASSERT_TRUE(dm.ok()) << dm.status().ToString();
  EXPECT_EQ(dm->As<ReplicateRequest>().flags, kReplicateDetach);
  EXPECT_EQ(dm->As<ReplicateRequest>().slot, 1);

  // The challenge-response: nonces and proofs travel whole.
  ChallengeReply challenge{};
  challenge.server_nonce[0] = 0x11;
  challenge.server_nonce[31] = 0x22;
  challenge.flags = kChallengeOpen;
  const auto cbytes = Encode(11, challenge);
  auto cm = Decode(cbytes);
  ASSERT_TRUE(cm.ok()) << cm.status().ToString();
  EXPECT_EQ(cm->opcode, Opcode::kChallengeReply);
  EXPECT_EQ(cm->As<ChallengeReply>().server_nonce[31], 0x22);
  EXPECT_EQ(cm->As<ChallengeReply>().flags, kChallengeOpen);
  HelloRequest proved{};
  proved.client_nonce = 5;
  proved.flags = kHelloHasProof;
  proved.proof[31] = 0x77;
  const auto provedbytes = Encode(12, proved);
  auto provedm = Decode(provedbytes);
  ASSERT_TRUE(provedm.ok());
  EXPECT_EQ(provedm->As<HelloRequest>().proof[31], 0x77);
  // A hello cut short by its proof is refused, not read past its end.
  auto cut = Encode(13, proved);
  cut.resize(cut.size() - 16);
  EXPECT_FALSE(Decode(cut).ok());

  HelloRequest pin{};
  pin.client_pid = 77;
  pin.client_nonce = 0xabcdef0012345678;
  pin.start_time = 123456;
  pin.boot_id[15] = 0x5a;
  pin.flags = kHelloWantsMap;
  const auto pbytes = Encode(9, pin);
  auto pm = Decode(pbytes);
  ASSERT_TRUE(pm.ok()) << pm.status().ToString();
  const auto back = pm->As<HelloRequest>();
  EXPECT_EQ(back.start_time, 123456u);
  EXPECT_EQ(back.boot_id[15], 0x5a);
  EXPECT_EQ(back.flags, kHelloWantsMap);

  const auto ebytes = Encode(10, EvictReply{3, kEvictKilled | kEvictExited});
  auto em = Decode(ebytes);
  ASSERT_TRUE(em.ok());
  EXPECT_EQ(em->opcode, Opcode::kEvictReply);
  EXPECT_EQ(em->As<EvictReply>().connections_closed, 3u);
  EXPECT_EQ(em->As<EvictReply>().flags, kEvictKilled | kEvictExited);
}

TEST(Wire, RejectsEvictAndGoodbyeMessagesOfTheWrongSize) {
  for (auto bytes : {Encode(1, EvictRequest{42}), Encode(2, GoodbyeRequest{42}),
                     Encode(3, GoodbyeReply{1, 0})}) {
    auto short_body = bytes;
    short_body.resize(bytes.size() - 4);
    EXPECT_FALSE(Decode(short_body).ok());
    auto long_body = bytes;
    long_body.push_back(std::byte{0});
    EXPECT_FALSE(Decode(long_body).ok());
  }
  const auto gbytes = Encode(4, GoodbyeRequest{0xfeed});
  auto gm = Decode(gbytes);
  ASSERT_TRUE(gm.ok()) << gm.status().ToString();
  EXPECT_EQ(gm->opcode, Opcode::kGoodbyeRequest);
  EXPECT_EQ(gm->As<GoodbyeRequest>().tag, 0xfeedu);
}

TEST(Wire, HelloMapRefusalNamesEveryReason) {
  EXPECT_EQ(HelloMapRefusal(kHelloMayMap), "");
  EXPECT_NE(HelloMapRefusal(kHelloOtherBoot).find("boot ids differ"), std::string::npos);
  EXPECT_NE(HelloMapRefusal(kHelloStartMismatch | kHelloNoSignal).find("may not signal"),
            std::string::npos);
  EXPECT_NE(HelloMapRefusal(0).find("did not pin"), std::string::npos);
}

TEST(Wire, ErrorRepliesCarryCodeAndReason) {
  auto bytes = EncodeError(5, Status::OutOfMemory("server 3: pool full"));
  auto m = Decode(bytes);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->opcode, Opcode::kErrorReply);
  Status s = DecodeError(*m);
  EXPECT_EQ(s.code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(s.message(), "server 3: pool full");
}

TEST(Wire, EveryStatusCodeCrossesTheWireAndNoOtherNumberDoes) {
  for (auto c = static_cast<uint32_t>(StatusCode::kInvalidArgument);
       c <= static_cast<uint32_t>(kLastStatusCode); ++c) {
    const auto bytes = EncodeError(1, Status(static_cast<StatusCode>(c), "why"));
    auto m = Decode(bytes);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(static_cast<uint32_t>(DecodeError(*m).code()), c);
    EXPECT_NE(StatusCodeName(static_cast<StatusCode>(c)), "Unknown");
  }
  const auto beyond_bytes = EncodeError(
      1, Status(static_cast<StatusCode>(static_cast<uint32_t>(kLastStatusCode) + 1), "why"));
  auto beyond = Decode(beyond_bytes);
  ASSERT_TRUE(beyond.ok());
  EXPECT_EQ(DecodeError(*beyond).code(), StatusCode::kProtocol);
}

TEST(Wire, LongErrorReasonsAreCutToTheTailLimit) {
  const auto bytes =
      EncodeError(2, Status::Internal(std::string(3 * transport::kMaxDeclaredTail, 'x')));
  auto m = Decode(bytes);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Status s = DecodeError(*m);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_EQ(s.message().size(), transport::kMaxDeclaredTail);
}

TEST(Wire, RejectsTruncatedMessagesAtEveryLength) {
  auto bytes = Encode(1, StatsReply{});
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto m = Decode(std::span(bytes.data(), n));
    ASSERT_FALSE(m.ok()) << "accepted a " << n << "-byte prefix";
    EXPECT_EQ(m.status().code(), StatusCode::kProtocol);
  }
}

TEST(Wire, RejectsWrongMagicVersionOpcodeAndSizes) {
  auto base = Encode(1, LeaseRequest{4096});
  // What decoding `base` with `value` written at `offset` says.
  auto decode_patched = [&](size_t offset, auto value) -> Status {
    auto b = base;
    std::memcpy(b.data() + offset, &value, sizeof(value));
    auto m = Decode(b);
    return m.ok() ? Status::Ok() : m.status();
  };
  Status magic = decode_patched(0, uint32_t{0xdeadbeef});
  EXPECT_NE(magic.message().find("magic"), std::string::npos);
  Status version = decode_patched(4, uint16_t{kVersion + 1});
  ASSERT_FALSE(version.ok());
  EXPECT_NE(version.message().find("version " + std::to_string(kVersion + 1) + " not supported"),
            std::string::npos);
  // A version-1 hello is refused by its version, before its size is looked at.
  auto old = Encode(1, HelloRequest{});
  std::memcpy(old.data() + 4, "\x01\x00", 2);
  EXPECT_NE(Decode(old).status().message().find("version 1"), std::string::npos);
  Status opcode = decode_patched(6, uint16_t{999});
  EXPECT_NE(opcode.message().find("unknown opcode 999"), std::string::npos);
  EXPECT_FALSE(decode_patched(8, uint32_t{9}).ok());         // body_size lies (short)
  EXPECT_FALSE(decode_patched(8, uint32_t{1u << 31}).ok());  // body_size lies (huge)
  EXPECT_FALSE(decode_patched(12, uint32_t{1}).ok());        // reserved flags set
  auto longer = base;
  longer.push_back(std::byte{0});
  EXPECT_FALSE(Decode(longer).ok());  // trailing garbage
}

TEST(Wire, RejectsTailLengthsThatLie) {
  auto bytes = EncodeError(1, Status::Internal("abc"));
  // text_size is at header + 4.
  uint32_t huge = transport::kMaxDeclaredTail + 1;
  std::memcpy(bytes.data() + sizeof(transport::FrameHeader) + 4, &huge, 4);
  EXPECT_FALSE(Decode(bytes).ok());
  uint32_t longer = 4;  // claims 4 bytes of text, message has 3
  std::memcpy(bytes.data() + sizeof(transport::FrameHeader) + 4, &longer, 4);
  EXPECT_FALSE(Decode(bytes).ok());
}

TEST(Wire, RandomMutationsNeverMisreport) {
  const uint64_t seed = 1234;
  std::mt19937_64 rng(seed);
  std::vector<std::vector<std::byte>> corpus = {
      Encode(1, HelloRequest{1, 2}), EncodeError(2, Status::Internal("x")),
      Encode(3, StatsReply{}),       Encode(4, EvictRequest{5}),
      Encode(5, GoodbyeRequest{6}),  Encode(6, ChallengeRequest{}),
      Encode(7, ChallengeReply{})};
  for (int i = 0; i < 20000; ++i) {
    auto b = corpus[rng() % corpus.size()];
    const int flips = 1 + rng() % 4;
    for (int k = 0; k < flips; ++k) b[rng() % b.size()] = std::byte(rng());
    if (rng() % 4 == 0) b.resize(rng() % (b.size() + 8));
    auto m = Decode(b);
    if (m.ok()) {  // whatever is accepted is self-consistent
      ASSERT_EQ(sizeof(transport::FrameHeader) + m->body.size() + m->tail.size(), b.size())
          << "seed " << seed << " iteration " << i;
    }
  }
}

}  // namespace
}  // namespace farpool::wire
