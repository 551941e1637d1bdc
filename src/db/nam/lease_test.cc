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

// A renewal whose CAS landed but whose reply was lost (a failover cut it: "operations in flight
// may or may not have taken effect"). The next renewal finds the very word it would write: its
// own renewal, not a fence, so it renews from it and keeps the lease. It used to take itself
// for fenced: the session stopped renewing, and lease + margin later another process evicted the
// live one (the network soak with kills, 2026-11-29). A real fence after it is still one.
TEST(LeaseTest, ARenewalWhoseReplyWasLostKeepsTheLease) {
  auto t = TestDatabase::Start("local");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto& nam = static_cast<NamDatabase&>((*t)->db());
  OpCount count;
  Access access(nam.memory(), count);
  SlotImage image;
  auto lease = nam.ClaimSlot(access, &image);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  SlotLease& l = **lease;
  nam.Unregister(&l);  // renewed by this test only
  const GlobalAddress slot = nam.SlotAddr(l.slot);
  const uint64_t before = l.owner;
  auto lost = access.Cas(slot, before, OwnerRenewed(before));  // landed; the reply "lost"
  ASSERT_TRUE(lost.ok() && *lost == before);

  Status s = nam.Renew(access, l);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(l.fenced);
  uint64_t word = 0;
  ASSERT_TRUE(access.Read(slot, &word, 8).ok());
  EXPECT_EQ(word, OwnerRenewed(OwnerRenewed(before)));
  EXPECT_EQ(word, l.owner);

  // Fenced by another process (next epoch, recovering; tag 0: nobody writes for it).
  const uint64_t fence = OwnerWord(OwnerEpoch(word) + 1, kSlotRecovering, 0);
  ASSERT_TRUE(access.Cas(slot, word, fence).ok());
  s = nam.Renew(access, l);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_TRUE(l.fenced);
  ASSERT_TRUE(access.Read(slot, &word, 8).ok());
  EXPECT_EQ(word, fence) << "a fenced session wrote its slot";
}

// The first free session slot of `nam`.
uint32_t FirstFreeSlot(NamDatabase& nam, const Access& access) {
  for (uint32_t s = 0;; ++s) {
    uint64_t word = 0;
    EXPECT_TRUE(access.Read(nam.SlotAddr(s), &word, 8).ok());
    if (OwnerState(word) == kSlotFree) return s;
  }
}

// A claim of a free slot is two CASes on its owner word (to recovering under this process's
// tag, then to active). The reply of the second is lost, though it landed: the word says so,
// and the slot is this session's. Taken for failed, it stayed active under this process's tag
// with nobody renewing it, and lease + margin later another process evicted this live one.
TEST(LeaseTest, AClaimWhoseLastReplyWasLostKeepsItsSlot) {
  auto t = TestDatabase::Start("local");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto& nam = static_cast<NamDatabase&>((*t)->db());
  KillableMemory lossy(nam.memory());
  OpCount count;
  Access access(lossy, count);
  const uint32_t slot = FirstFreeSlot(nam, access);
  lossy.LoseCasReply(nam.SlotAddr(slot), /*skip=*/1);
  SlotImage image;
  auto lease = nam.ClaimSlot(access, &image);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ((*lease)->slot, slot);
  uint64_t word = 0;
  ASSERT_TRUE(access.Read(nam.SlotAddr(slot), &word, 8).ok());
  EXPECT_EQ(word, (*lease)->owner);
  EXPECT_EQ(OwnerState(word), kSlotActive);
  EXPECT_TRUE(nam.Renew(access, **lease).ok());
  nam.Unregister(lease->get());
}

// The reply of the claim's first CAS (the fence: to recovering under this process's tag) is
// lost, though it landed. The claim fails, and the slot is given up as a recovery given up
// (tag 0: anyone takes it over at once), never left recovering under this process's tag,
// which others would take for a stalled recoverer and evict this live process for.
TEST(LeaseTest, AClaimWhoseFenceReplyWasLostGivesTheSlotUp) {
  auto t = TestDatabase::Start("local");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto& nam = static_cast<NamDatabase&>((*t)->db());
  KillableMemory lossy(nam.memory());
  OpCount count;
  Access access(lossy, count);
  const uint32_t slot = FirstFreeSlot(nam, access);
  lossy.LoseCasReply(nam.SlotAddr(slot));
  SlotImage image;
  auto lease = nam.ClaimSlot(access, &image);
  EXPECT_EQ(lease.status().code(), StatusCode::kUnavailable) << lease.status().ToString();
  uint64_t word = 0;
  ASSERT_TRUE(access.Read(nam.SlotAddr(slot), &word, 8).ok());
  EXPECT_EQ(OwnerState(word), kSlotRecovering);
  EXPECT_EQ(OwnerTag(word), 0u) << "left recovering under this live process's tag";
  auto next = nam.ClaimSlot(access, &image);  // taken over at once
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ((*next)->slot, slot);
  nam.Unregister(next->get());
}

// A session abandoned after a failure of the memory (its commit could not settle, a lock
// batch failed) gives its slot up: its own process fences and recovers the slot at its next
// maintenance pass. Left to expire, the slot was fenced by others after lease + margin, who
// evicted the live process first. With a 60 s lease, only the process's own take-over frees
// the slot within the test's 30 s.
TEST(LeaseTest, AnAbandonedSessionsSlotIsTakenOverByItsOwnProcess) {
  auto t = TestDatabase::Start("local", std::chrono::seconds(60));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto& nam = static_cast<NamDatabase&>((*t)->db());
  OpCount count;
  Access access(nam.memory(), count);
  const uint32_t slot = FirstFreeSlot(nam, access);
  auto session = nam.NewSession();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  uint64_t before = 0;
  ASSERT_TRUE(access.Read(nam.SlotAddr(slot), &before, 8).ok());
  ASSERT_EQ(OwnerState(before), kSlotActive) << "the session did not take the first free slot";
  static_cast<NamSession&>(**session).Abandon();
  EXPECT_EQ((*session)->Begin().status().code(), StatusCode::kUnavailable);
  uint64_t word = before;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (OwnerState(word) != kSlotFree && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(access.Read(nam.SlotAddr(slot), &word, 8).ok());
  }
  EXPECT_EQ(OwnerState(word), kSlotFree) << "the abandoned slot was not taken over";
  EXPECT_EQ(OwnerEpoch(word), OwnerEpoch(before) + 1) << "freed without a fence";
  session->reset();  // closing it changes nothing: the slot is someone else's
  ASSERT_TRUE(access.Read(nam.SlotAddr(slot), &word, 8).ok());
  EXPECT_EQ(OwnerState(word), kSlotFree);
}

}  // namespace
}  // namespace farpool::db
