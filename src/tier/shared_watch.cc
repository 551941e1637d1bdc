#include "tier/shared_watch.h"

namespace farpool::tier {

SharedWatch::SharedWatch(Pool& pool, std::chrono::microseconds interval, CollectFn collect,
                         SeenFn seen)
    : pool_(pool), interval_(interval), collect_(std::move(collect)), seen_(std::move(seen)) {
  thread_ = std::thread([this] { Run(); });
}

SharedWatch::~SharedWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SharedWatch::Wake() {
  // Called at the start and end of read transactions: a notify only when the thread sleeps.
  if (!asleep_.load(std::memory_order_acquire)) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    woken_ = true;
  }
  cv_.notify_all();
}

void SharedWatch::Run() {
  std::vector<uint64_t> values;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    const std::vector<Word> words = collect_();
    if (!words.empty()) {
      values.assign(words.size(), 0);
      Batch batch(pool_);
      Status s;
      for (size_t i = 0; i < words.size() && s.ok(); ++i) {
        s = batch.Read(words[i].address, &values[i], 8);
      }
      if (s.ok()) s = batch.Wait();
      looks_.fetch_add(1, std::memory_order_relaxed);
      if (s.ok()) seen_(words, values);
    }
    lock.lock();
    if (words.empty()) {
      // Asleep until Wake(); a Wake() between collect_ and here finds asleep_ false and no
      // notify comes, so the flag is set before looking again (collect_ runs once more).
      asleep_.store(true, std::memory_order_release);
      lock.unlock();
      const std::vector<Word> again = collect_();
      lock.lock();
      if (again.empty()) cv_.wait(lock, [this] { return stop_ || woken_; });
      asleep_.store(false, std::memory_order_release);
      woken_ = false;
    } else {
      cv_.wait_for(lock, interval_, [this] { return stop_; });
    }
  }
}

}  // namespace farpool::tier
