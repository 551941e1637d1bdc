// SharedWatch: a thread that looks at a set of lock words in the pool every interval, for the
// VFS's readers that keep their SHARED bit between read transactions (docs/files.md, "Read
// transactions without a round trip"): what it sees tells them when a writer wants the
// database, and they give the bit up.
//
// How it works: every `interval` the thread calls `collect`, which names the words to look at
// (each with an id of the caller's choosing), reads them all in one batch (one round trip per
// server holding any of them; none over shared memory, where a read is a load) and hands the
// values to `seen`. When `collect` names none, the thread sleeps until Wake(). Errors of a read
// are not reported: the words are read again next time (the callers' safety does not rest on
// the watch, only their writers' progress: a reader's bit is never dropped by the watch
// itself, and a stale or failed look only delays a writer by an interval).
//
// Thread-safety: Wake() and looks() may be called from any thread. `collect` and `seen` run on
// the watch thread. REQUIRES: the pool outlives this; the destructor is not called while
// holding a lock that `collect` or `seen` take (it joins the thread).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "farpool/pool.h"

namespace farpool::tier {

class SharedWatch {
 public:
  struct Word {
    uint64_t id;
    GlobalAddress address;
  };
  using CollectFn = std::function<std::vector<Word>()>;
  using SeenFn = std::function<void(const std::vector<Word>&, const std::vector<uint64_t>&)>;

  SharedWatch(Pool& pool, std::chrono::microseconds interval, CollectFn collect, SeenFn seen);
  ~SharedWatch();  // stops and joins the thread

  // A word may have become worth watching: the thread looks at once if it was asleep.
  void Wake();
  // Batches of reads issued so far (over TCP one round trip each per server read), off every
  // transaction's path: what `PRAGMA farpool_round_trips` leaves out.
  uint64_t looks() const { return looks_.load(std::memory_order_relaxed); }

 private:
  void Run();

  Pool& pool_;
  const std::chrono::microseconds interval_;
  const CollectFn collect_;
  const SeenFn seen_;
  std::atomic<uint64_t> looks_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                // GUARDED_BY(mu_)
  bool woken_ = false;               // GUARDED_BY(mu_)
  std::atomic<bool> asleep_{false};  // waiting for Wake() (nothing to watch)
  std::thread thread_;
};

}  // namespace farpool::tier
