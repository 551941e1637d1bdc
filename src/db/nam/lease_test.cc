// Leases of session slots in one process, at the level of the slot's owner word: renewals and
// claims whose outcome a failure of the memory left unknown (a failover cut the reply), and a
// real fence after them (docs/database.md "Leases and fencing"). The fault tests with real
// processes are in lease_fault_test.cc and db_process_test.cc.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "db/db_test_util.h"
#include "db/index/index_test_util.h"
#include "db/nam/nam_internal.h"

namespace farpool::db {
namespace {

// A database on local memory, reached by the test through memory that can lose the reply of
// one compare-and-swap (KillableMemory::LoseCasReply).
class LeaseTest : public testing::Test {
 protected:
  void SetUp() override { Start(std::chrono::seconds(2)); }
  void Start(std::chrono::milliseconds lease) {
    lossy_.reset();
    auto t = TestDatabase::Start("local", lease);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    t_ = std::move(*t);
    lossy_ = std::make_unique<KillableMemory>(nam().memory());
    access_ = std::make_unique<Access>(*lossy_, count_);
  }
  NamDatabase& nam() { return static_cast<NamDatabase&>(t_->db()); }
  const Access& access() { return *access_; }
  uint64_t Word(uint32_t slot) {
    uint64_t word = 0;
    EXPECT_TRUE(access().Read(nam().SlotAddr(slot), &word, 8).ok());
    return word;
  }
  // The first free session slot.
  uint32_t FirstFreeSlot() {
    for (uint32_t s = 0;; ++s) {
      if (OwnerState(Word(s)) == kSlotFree) return s;
    }
  }

  std::unique_ptr<TestDatabase> t_;
  std::unique_ptr<KillableMemory> lossy_;
  OpCount count_;
  std::unique_ptr<Access> access_;
};

// A renewal whose CAS landed but whose reply was lost (a failover cut it: "operations in flight
// may or may not have taken effect"). The next renewal finds the very word it would write: its
// own renewal, not a fence, so it renews from it and keeps the lease. It used to take itself
// for fenced: the session stopped renewing, and lease + margin later another process evicted the
// live one (the network soak with kills, 2026-11-29). A real fence after it is still one.
TEST_F(LeaseTest, ARenewalWhoseReplyWasLostKeepsTheLease) {
  SlotImage image;
  auto lease = nam().ClaimSlot(access(), &image);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  SlotLease& l = **lease;
  nam().Unregister(&l);  // renewed by this test only
  const GlobalAddress slot = nam().SlotAddr(l.slot);
  const uint64_t before = l.owner;
  lossy_->LoseCasReply(slot);
  EXPECT_FALSE(nam().Renew(access(), l).ok());  // landed; the reply lost
  EXPECT_FALSE(l.fenced);
  ASSERT_EQ(Word(l.slot), OwnerRenewed(before));

  Status s = nam().Renew(access(), l);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(l.fenced);
  uint64_t word = Word(l.slot);
  EXPECT_EQ(word, OwnerRenewed(OwnerRenewed(before)));
  EXPECT_EQ(word, l.owner);

  // Fenced by another process (next epoch, recovering under its tag).
  const uint64_t fence = OwnerWord(OwnerEpoch(word) + 1, kSlotRecovering, 0x5eed0f3c);
  ASSERT_TRUE(access().Cas(slot, word, fence).ok());
  s = nam().Renew(access(), l);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_TRUE(l.fenced);
  EXPECT_EQ(Word(l.slot), fence) << "a fenced session wrote its slot";
}

// A claim of a free slot is two CASes on its owner word (to recovering under this process's
// tag, then to active). The reply of the second is lost, though it landed: the word says so,
// and the slot is this session's. Taken for failed, it stayed active under this process's tag
// with nobody renewing it, and lease + margin later another process evicted this live one.
TEST_F(LeaseTest, AClaimWhoseLastReplyWasLostKeepsItsSlot) {
  const uint32_t slot = FirstFreeSlot();
  lossy_->LoseCasReply(nam().SlotAddr(slot), /*skip=*/1);
  SlotImage image;
  auto lease = nam().ClaimSlot(access(), &image);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ((*lease)->slot, slot);
  const uint64_t word = Word(slot);
  EXPECT_EQ(word, (*lease)->owner);
  EXPECT_EQ(OwnerState(word), kSlotActive);
  EXPECT_TRUE(nam().Renew(access(), **lease).ok());
  nam().Unregister(lease->get());
}

// The reply of the claim's first CAS (the fence: to recovering under this process's tag) is
// lost, though it landed. The claim fails, and the slot is given up as a recovery given up
// (tag 0: anyone takes it over at once), never left recovering under this process's tag,
// which others would take for a stalled recoverer and evict this live process for.
TEST_F(LeaseTest, AClaimWhoseFenceReplyWasLostGivesTheSlotUp) {
  const uint32_t slot = FirstFreeSlot();
  lossy_->LoseCasReply(nam().SlotAddr(slot));
  SlotImage image;
  auto lease = nam().ClaimSlot(access(), &image);
  EXPECT_EQ(lease.status().code(), StatusCode::kUnavailable) << lease.status().ToString();
  // Given up (recovering, tag 0), or taken over since by the maintenance thread (an epoch
  // later): never the claim's fence under this process's tag.
  const uint64_t word = Word(slot);
  const uint64_t claim_fence =
      OwnerWord(OwnerEpoch(image.owner) + 1, kSlotRecovering, nam().memory().process_tag());
  EXPECT_NE(word, claim_fence) << "left recovering under this live process's tag";
  EXPECT_GE(OwnerEpoch(word), OwnerEpoch(image.owner) + 1);
  auto next = nam().ClaimSlot(access(), &image);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  nam().Unregister(next->get());
}

// A session abandoned after a failure of the memory (its commit could not settle, a lock
// batch failed) gives its slot up: its own process fences and recovers the slot at its next
// maintenance pass. Left to expire, the slot was fenced by others after lease + margin, who
// evicted the live process first. With a 60 s lease, only the process's own take-over frees
// the slot within the test's 30 s.
TEST_F(LeaseTest, AnAbandonedSessionsSlotIsTakenOverByItsOwnProcess) {
  Start(std::chrono::seconds(60));
  const uint32_t slot = FirstFreeSlot();
  auto session = nam().NewSession();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  const uint64_t before = Word(slot);
  ASSERT_EQ(OwnerState(before), kSlotActive) << "the session did not take the first free slot";
  static_cast<NamSession&>(**session).Abandon();
  EXPECT_EQ((*session)->Begin().status().code(), StatusCode::kUnavailable);
  uint64_t word = before;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (OwnerState(word) != kSlotFree && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    word = Word(slot);
  }
  EXPECT_EQ(OwnerState(word), kSlotFree) << "the abandoned slot was not taken over";
  EXPECT_EQ(OwnerEpoch(word), OwnerEpoch(before) + 1) << "freed without a fence";
  session->reset();  // closing it changes nothing: the slot is someone else's
  EXPECT_EQ(OwnerState(Word(slot)), kSlotFree);
}

}  // namespace
}  // namespace farpool::db
