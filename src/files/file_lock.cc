#include "files/file_lock.h"

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace farpool::files {
namespace {

static_assert(kLeaseSlots <= 56, "one reader bit per lease slot below the writer field");
constexpr uint64_t kReaders = (uint64_t{1} << 56) - 1;
constexpr int kWriterShift = 56;
constexpr uint64_t kWriterField = uint64_t{0x3f} << kWriterShift;
constexpr uint64_t kPendingBit = uint64_t{1} << 62;
constexpr uint64_t kExclusiveBit = uint64_t{1} << 63;

int Writer(uint64_t w) { return static_cast<int>((w & kWriterField) >> kWriterShift) - 1; }
uint64_t WithWriter(uint64_t w, int slot) {
  return (w & ~kWriterField) | (uint64_t(slot + 1) << kWriterShift);
}
// `w` without anything slot `slot` holds; with `keep_shared`, its SHARED bit stays.
uint64_t Without(uint64_t w, int slot, bool keep_shared) {
  if (!keep_shared) w &= ~(uint64_t{1} << slot);
  if (Writer(w) == slot) w &= ~(kWriterField | kPendingBit | kExclusiveBit);
  return w;
}

// A number of the calling thread that no other thread ever has: a std::thread::id may be
// reused once its thread ended, and the connections a release was posted on end with it.
uint64_t ThreadToken() {
  static std::atomic<uint64_t> next{1};
  thread_local const uint64_t token = next.fetch_add(1, std::memory_order_relaxed);
  return token;
}

}  // namespace

Status FileLock::Conflict(int slot, const char* what) {
  FARPOOL_ASSIGN_OR_RETURN(bool dead, leases_.Dead(slot));
  if (!dead) {
    return Status::Aborted(std::string(what) + " is held by the process of lease slot " +
                           std::to_string(slot));
  }
  return leases_.Reclaim(slot);
}

Result<uint64_t> FileLock::Swap(uint64_t expected, uint64_t desired,
                                const std::function<Status(Batch&)>& with) {
  uint64_t prev = 0;
  Batch batch(pool_);
  FARPOOL_RETURN_IF_ERROR(batch.CompareAndSwap(word_, expected, desired, &prev));
  if (with) {
    FARPOOL_RETURN_IF_ERROR(batch.Fence());
    FARPOOL_RETURN_IF_ERROR(with(batch));
  }
  FARPOOL_RETURN_IF_ERROR(batch.Wait());
  seen_ = prev == expected ? desired : prev;
  return prev;
}

Result<uint64_t> FileLock::Add(uint64_t delta, const std::function<Status(Batch&)>& with) {
  uint64_t prev = 0;
  Batch batch(pool_);
  FARPOOL_RETURN_IF_ERROR(batch.FetchAdd(word_, delta, &prev));
  if (with) {
    FARPOOL_RETURN_IF_ERROR(batch.Fence());
    FARPOOL_RETURN_IF_ERROR(with(batch));
  }
  FARPOOL_RETURN_IF_ERROR(batch.Wait());
  seen_ = prev + delta;
  return prev;
}

Status FileLock::Settle() {
  if (posted_by_ == ThreadToken()) {
    // This thread's next operation on the word's server is ordered behind the release.
    posted_by_ = 0;
    return Status::Ok();
  }
  return Drain();
}

Status FileLock::Drain() {
  if (posted_by_ == 0) return Status::Ok();
  // The release has landed once our bit is clear (nobody else sets it); a read is ordered
  // behind it on the posting thread's connection, another thread's may have to look again.
  const uint64_t mine = uint64_t{1} << leases_.slot();
  const auto deadline = std::chrono::steady_clock::now() + kDrainPatience;
  for (;;) {
    uint64_t w = 0;
    FARPOOL_RETURN_IF_ERROR(ReadWord(&w));
    if ((w & mine) == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::TimedOut("the posted release of this process's SHARED lock did not land in " +
                              std::to_string(kDrainPatience.count()) + " s");
    }
    std::this_thread::yield();
  }
  posted_by_ = 0;
  return Status::Ok();
}

Status FileLock::Lock(LockLevel level, const std::function<Status(Batch&)>& with) {
  FARPOOL_RETURN_IF_ERROR(leases_.Check());
  FARPOOL_RETURN_IF_ERROR(Settle());
  const int me = leases_.slot();
  const uint64_t mine = uint64_t{1} << me;
  // w starts as a guess (what this handle last saw), good only as a CAS's expected value: a
  // wrong guess makes the CAS fail and return the word, as reading it first would. Anything
  // else decided from w (a conflict, nothing to change, readers to wait for) needs the word
  // as the server has it, so such a decision on a guess reads the word first.
  uint64_t w = seen_;
  bool fresh = false;
  for (;;) {
    const int writer = Writer(w);
    const bool other_writer = writer >= 0 && writer != me;
    uint64_t desired = w;
    LockLevel reached = level;
    const char* conflict = nullptr;
    if (level == LockLevel::kShared) {
      if (other_writer && (w & (kPendingBit | kExclusiveBit)) != 0) {
        conflict = "a PENDING or EXCLUSIVE lock";
      }
      desired = w | mine;
    } else {
      if (other_writer) conflict = "a RESERVED or higher lock";
      desired = WithWriter(w, me) | mine;
      if (level != LockLevel::kReserved) {
        desired |= kPendingBit;
        if ((w & kReaders & ~mine) == 0) {
          desired |= kExclusiveBit;
          reached = LockLevel::kExclusive;
        } else {
          reached = LockLevel::kPending;
        }
      }
    }
    if (!fresh && (conflict != nullptr || desired == w)) {
      FARPOOL_RETURN_IF_ERROR(ReadWord(&w));
      fresh = true;
      continue;
    }
    if (conflict != nullptr) {
      FARPOOL_RETURN_IF_ERROR(Conflict(writer, conflict));
      FARPOOL_RETURN_IF_ERROR(ReadWord(&w));
      continue;
    }
    if (level == LockLevel::kShared && fresh && (w & mine) == 0) {
      // The word changed since this handle last saw it (other readers come and go): rather
      // than CAS again from the value just returned, which they may change again before it
      // arrives (a CAS per change, without bound), add our bit. Exact whatever else changes:
      // it is clear (fresh from the server) and only we set it.
      FARPOOL_ASSIGN_OR_RETURN(const uint64_t prev, Add(mine, with));
      const int now_writer = Writer(prev);
      if (now_writer < 0 || now_writer == me || (prev & (kPendingBit | kExclusiveBit)) == 0) {
        level_ = LockLevel::kShared;
        return Status::Ok();
      }
      // A writer took PENDING meanwhile: our bit comes out again (before SQLITE_BUSY, so that
      // it does not keep the writer waiting), and the conflict is judged as above.
      FARPOOL_RETURN_IF_ERROR(Add(~mine + 1, {}).status());
      w = prev;
      continue;
    }
    if (desired != w) {
      FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, Swap(w, desired, with));
      fresh = true;
      if (prev != w) {
        w = prev;
        continue;
      }
      w = desired;
    } else if (with) {
      Batch batch(pool_);
      FARPOOL_RETURN_IF_ERROR(with(batch));
      FARPOOL_RETURN_IF_ERROR(batch.Wait());
    }
    level_ = reached;
    if (reached != LockLevel::kPending || level == LockLevel::kPending) return Status::Ok();
    // EXCLUSIVE waits for the other readers; a dead one is swept and the request retried.
    bool swept = false;
    for (int s = 0; s < kLeaseSlots; ++s) {
      if (s == me || (w & (uint64_t{1} << s)) == 0) continue;
      Status c = Conflict(s, "a SHARED lock");
      if (c.ok()) {
        swept = true;
      } else if (c.code() != StatusCode::kAborted) {
        return c;
      }
    }
    if (!swept) {
      return Status::Aborted("EXCLUSIVE waits for other readers to leave (PENDING held)");
    }
    FARPOOL_RETURN_IF_ERROR(ReadWord(&w));
  }
}

Status FileLock::ReadWord(uint64_t* w) {
  FARPOOL_RETURN_IF_ERROR(pool_.Read(word_, w, 8));
  seen_ = *w;
  return Status::Ok();
}

Status FileLock::Unlock(LockLevel level) {
  const int me = leases_.slot();
  if (level == LockLevel::kNone && level_ == LockLevel::kShared) {
    // Only our SHARED bit is ours in the word, and it is set (our CAS set it; a sweeper clears
    // it only after the servers evicted us, when nothing of ours lands any more): subtracting
    // it is exact whatever else changed, so the release needs no reply.
    const uint64_t mine = uint64_t{1} << me;
    Batch batch(pool_);
    FARPOOL_RETURN_IF_ERROR(batch.FetchAdd(word_, ~mine + 1, nullptr));
    FARPOOL_RETURN_IF_ERROR(batch.Post());
    seen_ &= ~mine;
    level_ = LockLevel::kNone;
    posted_by_ = ThreadToken();
    return Status::Ok();
  }
  FARPOOL_RETURN_IF_ERROR(Settle());
  // A guess, as in Lock. Only this handle sets its bits, and seen_ holds them from its own
  // CAS, so when seen_ shows none of ours the word has none either.
  uint64_t w = seen_;
  for (;;) {
    const uint64_t desired = Without(w, me, level == LockLevel::kShared);
    if (desired == w) break;
    FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, Swap(w, desired, {}));
    if (prev == w) break;
    w = prev;
  }
  level_ = level;
  return Status::Ok();
}

bool FileLock::WriterElsewhere(uint64_t word) const {
  const int writer = Writer(word);
  return writer >= 0 && writer != leases_.slot();
}

Status FileLock::AwaitReaders(std::chrono::microseconds patience) {
  FARPOOL_RETURN_IF_ERROR(Settle());
  const uint64_t others = kReaders & ~(uint64_t{1} << leases_.slot());
  const auto deadline = std::chrono::steady_clock::now() + patience;
  for (;;) {
    uint64_t w = 0;
    FARPOOL_RETURN_IF_ERROR(ReadWord(&w));
    if ((w & others) == 0) return Status::Ok();
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::Aborted("EXCLUSIVE waits for other readers to leave (PENDING held)");
    }
    std::this_thread::sleep_for(patience / 32);
  }
}

Result<bool> FileLock::ReservedElsewhere() {
  const int me = leases_.slot();
  for (;;) {
    uint64_t w = 0;
    FARPOOL_RETURN_IF_ERROR(ReadWord(&w));
    const int writer = Writer(w);
    if (writer < 0 || writer == me) return false;
    Status c = Conflict(writer, "RESERVED");
    if (c.code() == StatusCode::kAborted) return true;
    FARPOOL_RETURN_IF_ERROR(c);
  }
}

Status ClearSlot(FileStore& store, int slot) {
  Pool& pool = store.pool();
  FARPOOL_ASSIGN_OR_RETURN(std::vector<GlobalAddress> headers, store.Headers());
  std::vector<uint64_t> words(headers.size());
  Batch batch(pool);
  for (size_t i = 0; i < headers.size(); ++i) {
    FARPOOL_RETURN_IF_ERROR(batch.Read(headers[i] + offsetof(FileHeader, lock), &words[i], 8));
  }
  FARPOOL_RETURN_IF_ERROR(batch.Wait());
  for (size_t i = 0; i < headers.size(); ++i) {
    uint64_t w = words[i];
    for (;;) {
      const uint64_t desired = Without(w, slot, false);
      if (desired == w) break;
      FARPOOL_ASSIGN_OR_RETURN(
          uint64_t prev, pool.CompareAndSwap(headers[i] + offsetof(FileHeader, lock), w, desired));
      if (prev == w) break;
      w = prev;
    }
  }
  return Status::Ok();
}

}  // namespace farpool::files
