#include "pool/memory_ops.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/far_copy.h"
#include "transport/wire.h"

namespace farpool::memory_ops {
namespace {

uint64_t Padded(uint64_t size) { return (size + 7) & ~uint64_t{7}; }

bool IsAtomic(OpKind kind) {
  return kind == OpKind::kCompareAndSwap || kind == OpKind::kFetchAdd ||
         kind == OpKind::kWaitCompareAndSwap;
}

const char* KindName(OpKind kind) {
  switch (kind) {
    case OpKind::kRead:
      return "read";
    case OpKind::kWrite:
      return "write";
    case OpKind::kCompareAndSwap:
      return "compare-and-swap";
    case OpKind::kFetchAdd:
      return "fetch-and-add";
    case OpKind::kLookupRead:
      return "lookup-read";
    case OpKind::kInsertIfAbsent:
      return "insert-if-absent";
    case OpKind::kWaitCompareAndSwap:
      return "wait-compare-and-swap";
    case OpKind::kLookupLockRead:
      return "lookup-lock-read";
  }
  return "unknown";
}

// The parameters that follow a compound operation's header in the request (0: none).
uint64_t ParamsBytes(OpKind kind) {
  if (kind == OpKind::kLookupRead) return sizeof(LookupParams);
  if (kind == OpKind::kInsertIfAbsent) return sizeof(InsertParams);
  if (kind == OpKind::kWaitCompareAndSwap) return sizeof(WaitParams);
  if (kind == OpKind::kLookupLockRead) return sizeof(LockReadParams);
  return 0;
}

constexpr int kShift = 48;  // GlobalAddress: server id in the top 16 bits
constexpr uint64_t kOffsetMask = (uint64_t{1} << kShift) - 1;

}  // namespace

uint64_t RequestBuilder::RequestBytes(OpKind kind, uint64_t size) {
  if (ParamsBytes(kind) > 0) return sizeof(OpHeader) + ParamsBytes(kind);
  return sizeof(OpHeader) + (kind == OpKind::kWrite ? Padded(size) : 0);
}

uint64_t RequestBuilder::ReplyBytes(OpKind kind, uint64_t size) {
  switch (kind) {
    case OpKind::kRead:
      return size;
    case OpKind::kWrite:
      return 0;
    case OpKind::kCompareAndSwap:
    case OpKind::kFetchAdd:
    case OpKind::kWaitCompareAndSwap:
      return sizeof(uint64_t);
    case OpKind::kLookupRead:
      return sizeof(LookupReply) + size;
    case OpKind::kInsertIfAbsent:
      return sizeof(InsertReply);
    case OpKind::kLookupLockRead:
      return sizeof(LookupReply) + sizeof(uint64_t) + size;
  }
  return 0;
}

bool RequestBuilder::Fits(OpKind kind, uint64_t size) const {
  return bytes_.size() + RequestBytes(kind, size) <= wire::kMaxBatchTail &&
         reply_size_ + ReplyBytes(kind, size) <= wire::kMaxBatchTail;
}

void RequestBuilder::Append(const OpHeader& h, const void* data) {
  const auto kind = static_cast<OpKind>(h.kind);
  const size_t at = bytes_.size();
  bytes_.resize(at + RequestBytes(kind, h.size));  // zero-fills a write's padding
  std::memcpy(bytes_.data() + at, &h, sizeof(h));
  if (data != nullptr) {
    const uint64_t n = ParamsBytes(kind) > 0 ? ParamsBytes(kind) : h.size;
    std::memcpy(bytes_.data() + at + sizeof(h), data, n);
  }
  ++op_count_;
  reply_size_ += ReplyBytes(kind, h.size);
}

void RequestBuilder::Read(uint64_t offset, uint32_t size) {
  Append({static_cast<uint8_t>(OpKind::kRead), {}, size, offset, 0, 0}, nullptr);
}

void RequestBuilder::Write(uint64_t offset, const void* data, uint32_t size) {
  Append({static_cast<uint8_t>(OpKind::kWrite), {}, size, offset, 0, 0}, data);
}

void RequestBuilder::CompareAndSwap(uint64_t offset, uint64_t expected, uint64_t desired) {
  Append({static_cast<uint8_t>(OpKind::kCompareAndSwap),
          {},
          sizeof(uint64_t),
          offset,
          expected,
          desired},
         nullptr);
}

void RequestBuilder::FetchAdd(uint64_t offset, uint64_t delta) {
  Append({static_cast<uint8_t>(OpKind::kFetchAdd), {}, sizeof(uint64_t), offset, delta, 0},
         nullptr);
}

void RequestBuilder::LookupRead(uint64_t bucket_offset, const LookupParams& params, uint64_t key,
                                uint32_t size) {
  Append({static_cast<uint8_t>(OpKind::kLookupRead), {}, size, bucket_offset, key, 0}, &params);
}

void RequestBuilder::InsertIfAbsent(uint64_t bucket_offset, const InsertParams& params,
                                    uint64_t key, uint64_t value) {
  Append({static_cast<uint8_t>(OpKind::kInsertIfAbsent), {}, 0, bucket_offset, key, value},
         &params);
}

void RequestBuilder::WaitCompareAndSwap(uint64_t offset, uint64_t expected, uint64_t desired,
                                        const WaitParams& params) {
  Append({static_cast<uint8_t>(OpKind::kWaitCompareAndSwap),
          {},
          sizeof(uint64_t),
          offset,
          expected,
          desired},
         &params);
}

void RequestBuilder::LookupLockRead(uint64_t bucket_offset, const LockReadParams& params,
                                    uint64_t key, uint64_t desired, uint32_t size) {
  Append({static_cast<uint8_t>(OpKind::kLookupLockRead), {}, size, bucket_offset, key, desired},
         &params);
}

void RequestBuilder::Clear() {
  bytes_.clear();
  op_count_ = 0;
  reply_size_ = 0;
}

std::string CheckLookupParams(const LookupParams& p) {
  if (p.bucket_size < 16 || p.bucket_size > kMaxLookupBucket || p.bucket_size % 8 != 0) {
    return "bucket size " + std::to_string(p.bucket_size) + " out of range";
  }
  if (p.entries_offset % 8 != 0 || p.entry_count == 0 ||
      uint64_t{p.entries_offset} + 16 * uint64_t{p.entry_count} > p.bucket_size) {
    return "entries (" + std::to_string(p.entry_count) + " at " + std::to_string(p.entries_offset) +
           ") not inside the bucket";
  }
  if (p.next_offset % 8 != 0 || uint64_t{p.next_offset} + 8 > p.bucket_size) {
    return "next word at " + std::to_string(p.next_offset) + " not inside the bucket";
  }
  if (p.max_buckets == 0 || p.max_buckets > kMaxLookupBuckets) {
    return "max buckets " + std::to_string(p.max_buckets) + " out of range";
  }
  if (p.reserved != 0) return "reserved parameter is not zero";
  return {};
}

std::string CheckInsertParams(const InsertParams& p) {
  if (std::string why = CheckLookupParams(p.layout); !why.empty()) return why;
  if (p.lock_word == 0) return "lock word is zero";
  if (p.lock_offset % 8 != 0 || uint64_t{p.lock_offset} + 8 > p.layout.bucket_size) {
    return "lock word at " + std::to_string(p.lock_offset) + " not inside the bucket";
  }
  if (p.reserved[0] != 0 || p.reserved[1] != 0 || p.reserved[2] != 0) {
    return "reserved parameter is not zero";
  }
  return {};
}

std::string CheckLockReadParams(const LockReadParams& p, uint32_t size, uint64_t desired) {
  if (std::string why = CheckLookupParams(p.layout); !why.empty()) return why;
  if (p.held_mask == 0) return "held mask is zero";
  if (desired == 0) return "lock word is zero";
  if (p.lock_offset % 8 != 0 || uint64_t{p.lock_offset} + 8 > size) {
    return "lock word at " + std::to_string(p.lock_offset) + " not inside the record of " +
           std::to_string(size) + " bytes";
  }
  if (p.reserved != 0) return "reserved parameter is not zero";
  return {};
}

std::string CheckWaitParams(const WaitParams& p, uint64_t desired) {
  if (p.held_mask == 0) return "held mask is zero";
  if (p.wait_us > kMaxWaitUs) {
    return "wait of " + std::to_string(p.wait_us) + " us beyond " + std::to_string(kMaxWaitUs);
  }
  if ((p.flags & ~(kWaitTakeFree | kWaitOnly)) != 0) {
    return "unknown flags " + std::to_string(p.flags);
  }
  if ((p.flags & kWaitOnly) != 0) {
    if ((p.flags & kWaitTakeFree) != 0) return "wait-only and take-free exclude each other";
    if (desired != 0) return "wait-only with a nonzero desired word";
  }
  return {};
}

WaitParams ParamsOf(const WaitSpec& spec) {
  const int64_t us = spec.wait.count();  // out of range: refused by CheckWaitParams
  return {spec.held_mask, spec.not_held,
          us < 0 || us > int64_t{UINT32_MAX} ? UINT32_MAX : static_cast<uint32_t>(us),
          (spec.take_free ? kWaitTakeFree : 0) | (spec.wait_only ? kWaitOnly : 0)};
}

WaitAttempt AttemptWaitCompareAndSwap(uint64_t* word, uint64_t expected, uint64_t desired,
                                      const WaitParams& params) {
  if ((params.flags & kWaitOnly) != 0) {
    const uint64_t found = __atomic_load_n(word, __ATOMIC_SEQ_CST);
    return {found,
            found == expected && (found & params.held_mask) != 0 && found != params.not_held};
  }
  for (;;) {
    uint64_t found = expected;
    if (__atomic_compare_exchange_n(word, &found, desired, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST)) {
      return {expected, false};
    }
    const bool free = (found & params.held_mask) == 0;
    // Again from the word found: each failure means someone else changed the word.
    if (free && (params.flags & kWaitTakeFree) != 0) {
      expected = found;
      continue;
    }
    return {found, !free && found != params.not_held};
  }
}

bool WaitCompareAndSwapSwapped(uint64_t previous, uint64_t expected, const WaitParams& params) {
  if ((params.flags & kWaitOnly) != 0) return false;
  return previous == expected ||
         ((params.flags & kWaitTakeFree) != 0 && (previous & params.held_mask) == 0);
}

BucketScan ScanBucket(const std::byte* bucket, const LookupParams& params, uint64_t key) {
  BucketScan r{0, 0};
  std::memcpy(&r.next, bucket + params.next_offset, 8);
  for (uint32_t i = 0; i < params.entry_count; ++i) {
    uint64_t entry[2];
    std::memcpy(entry, bucket + params.entries_offset + 16 * i, 16);
    if (entry[0] == key && entry[1] != 0) {
      r.value = entry[1];
      break;
    }
  }
  return r;
}

void ExecuteLookupRead(const Region& region, uint64_t bucket_offset, const LookupParams& params,
                       uint64_t key, uint32_t size, std::byte* out) {
  auto inside = [&](uint64_t offset, uint64_t n) {
    return n <= region.size && offset <= region.size - n && region.accessible(offset, n);
  };
  LookupReply reply{static_cast<uint64_t>(LookupOutcome::kAbsent), 0};
  std::memset(out, 0, sizeof(LookupReply) + size);
  std::byte bucket[kMaxLookupBucket];
  uint64_t at = bucket_offset;  // checked by the caller
  for (uint32_t walked = 0;; ++walked) {
    FarRead(bucket, region.base + at, params.bucket_size);
    const BucketScan scan = ScanBucket(bucket, params, key);
    if (scan.value != 0) {
      reply.value = scan.value;
      const uint64_t off = scan.value & kOffsetMask;
      if ((scan.value >> kShift) != region.server_id || size == 0) {
        reply.outcome = static_cast<uint64_t>(LookupOutcome::kFoundNotRead);
      } else if (!inside(off, size)) {
        reply = {static_cast<uint64_t>(LookupOutcome::kOutOfBounds), off};
      } else {
        reply.outcome = static_cast<uint64_t>(LookupOutcome::kFound);
        FarRead(out + sizeof(LookupReply), region.base + off, size);
      }
      break;
    }
    if (scan.next == 0) break;  // kAbsent
    const uint64_t next_off = scan.next & kOffsetMask;
    if ((scan.next >> kShift) != region.server_id || walked + 1 >= params.max_buckets) {
      reply = {static_cast<uint64_t>(LookupOutcome::kContinue), scan.next};
      break;
    }
    if (next_off % 8 != 0 || !inside(next_off, params.bucket_size)) {
      reply = {static_cast<uint64_t>(LookupOutcome::kOutOfBounds), next_off};
      break;
    }
    at = next_off;
  }
  std::memcpy(out, &reply, sizeof(reply));
}

void ExecuteInsertIfAbsent(const Region& region, uint64_t bucket_offset, const InsertParams& params,
                           uint64_t key, uint64_t value, std::byte* out) {
  const LookupParams& layout = params.layout;
  auto word = [&](uint64_t offset) { return reinterpret_cast<uint64_t*>(region.base + offset); };
  auto cas = [&](uint64_t offset, uint64_t expected, uint64_t desired) {
    __atomic_compare_exchange_n(word(offset), &expected, desired, false, __ATOMIC_SEQ_CST,
                                __ATOMIC_SEQ_CST);
    return expected;  // the previous value either way
  };
  auto finish = [&](InsertOutcome outcome, uint64_t v) {
    const InsertReply reply{static_cast<uint64_t>(outcome), v};
    std::memcpy(out, &reply, sizeof(reply));
  };
  const uint64_t lock = bucket_offset + params.lock_offset;  // inside the checked first bucket
  // Cleared on every way out, after the lock's release (or the failed take).
  struct Intent {
    uint64_t* words;
    ~Intent() {
      if (words != nullptr) __atomic_store_n(&words[0], uint64_t{0}, __ATOMIC_SEQ_CST);
    }
  } intent{region.insert_intent ? region.insert_intent(lock) : nullptr};
  if (intent.words != nullptr) {
    // The offset within the region whose root area holds the words (its adopter's view).
    const auto root =
        static_cast<uint64_t>(reinterpret_cast<std::byte*>(intent.words) - region.base) -
        wire::kInsertIntentOffset;
    __atomic_store_n(&intent.words[1], params.lock_word, __ATOMIC_SEQ_CST);
    __atomic_store_n(&intent.words[0], lock - root + 1, __ATOMIC_SEQ_CST);
  }
  if (const uint64_t held = cas(lock, 0, params.lock_word); held != 0) {
    return finish(InsertOutcome::kBusy, held);
  }
  if (region.changed != nullptr) region.changed->push_back({lock, 8});
  // Under the lock, as a one-sided inserter: releases by CAS from our word.
  auto release = [&](InsertOutcome outcome, uint64_t v) {
    const uint64_t was = cas(lock, params.lock_word, 0);
    if (was != params.lock_word) return finish(InsertOutcome::kLockBroken, was);
    finish(outcome, v);
  };
  std::byte bucket[kMaxLookupBucket];
  uint64_t free_entry = 0;  // offset of the first free entry, if have_free
  bool have_free = false;
  for (uint64_t at = bucket_offset, walked = 0;; ++walked) {
    FarRead(bucket, region.base + at, layout.bucket_size);
    const BucketScan scan = ScanBucket(bucket, layout, key);
    if (scan.value != 0) return release(InsertOutcome::kFound, scan.value);
    for (uint32_t i = 0; i < layout.entry_count && !have_free; ++i) {
      uint64_t v;
      std::memcpy(&v, bucket + layout.entries_offset + 16 * i + 8, 8);
      have_free = v == 0;
      if (have_free) free_entry = at + layout.entries_offset + 16 * i;
    }
    if (scan.next == 0) break;
    const uint64_t next_off = scan.next & kOffsetMask;
    if ((scan.next >> kShift) != region.server_id || walked + 1 >= layout.max_buckets) {
      return release(InsertOutcome::kNotDone, 0);
    }
    if (next_off % 8 != 0 || next_off > region.size ||
        layout.bucket_size > region.size - next_off ||
        !region.accessible(next_off, layout.bucket_size)) {
      return release(InsertOutcome::kOutOfBounds, next_off);
    }
    at = next_off;
  }
  if (!have_free) return release(InsertOutcome::kNotDone, 0);
  // The key first (the entry is free: readers skip it), then the value word by CAS, which
  // makes the entry live in one atomic step.
  __atomic_store_n(word(free_entry), key, __ATOMIC_SEQ_CST);
  if (region.changed != nullptr) region.changed->push_back({free_entry, 16});
  if (const uint64_t was = cas(free_entry + 8, 0, value); was != 0) {
    const uint64_t unlocked = cas(lock, params.lock_word, 0);
    (void)unlocked;  // broken either way: someone filled the entry under our lock
    return finish(InsertOutcome::kLockBroken, was);
  }
  release(InsertOutcome::kInserted, value);
}

Status DecodeInsertReply(const std::byte* reply, uint16_t server_id, InsertResult* result) {
  InsertReply r;
  std::memcpy(&r, reply, sizeof(r));
  result->value = r.value;
  using Outcome = InsertResult::Outcome;
  switch (static_cast<InsertOutcome>(r.outcome)) {
    case InsertOutcome::kInserted:
      result->outcome = Outcome::kInserted;
      return Status::Ok();
    case InsertOutcome::kFound:
      result->outcome = Outcome::kFound;
      return Status::Ok();
    case InsertOutcome::kBusy:
      result->outcome = Outcome::kBusy;
      return Status::Ok();
    case InsertOutcome::kNotDone:
      result->outcome = Outcome::kNotDone;
      return Status::Ok();
    case InsertOutcome::kLockBroken:
      result->outcome = Outcome::kLockBroken;
      return Status::Ok();
    case InsertOutcome::kOutOfBounds:
      result->outcome = Outcome::kNotDone;
      result->value = 0;
      return Status::InvalidArgument(
          "insert-if-absent: " + GlobalAddress(server_id, r.value).ToString() +
          " (a bucket it reached) is outside the region or every lease");
  }
  return Status::Protocol("insert-if-absent reply with unknown outcome " +
                          std::to_string(r.outcome));
}

void ExecuteLookupLockRead(const Region& region, uint64_t bucket_offset,
                           const LockReadParams& params, uint64_t key, uint64_t desired,
                           uint32_t size, std::byte* out) {
  // The walk is the lookup-read's, without its read of the record (size 0): the record is
  // read below, after its lock word was taken or found held.
  std::byte lookup[sizeof(LookupReply)];
  ExecuteLookupRead(region, bucket_offset, params.layout, key, 0, lookup);
  LookupReply reply;
  std::memcpy(&reply, lookup, sizeof(reply));
  std::memset(out, 0, sizeof(LookupReply) + sizeof(uint64_t) + size);
  uint64_t found = 0;
  if (reply.outcome == static_cast<uint64_t>(LookupOutcome::kFoundNotRead) &&
      (reply.value >> kShift) == region.server_id) {
    const uint64_t off = reply.value & kOffsetMask;
    if (size > region.size || off > region.size - size || !region.accessible(off, size) ||
        (off + params.lock_offset) % 8 != 0) {
      reply = {static_cast<uint64_t>(LookupOutcome::kOutOfBounds), off};
    } else {
      const WaitParams take{params.held_mask, 0, 0, kWaitTakeFree};
      const WaitAttempt a = AttemptWaitCompareAndSwap(
          reinterpret_cast<uint64_t*>(region.base + off + params.lock_offset), 0, desired, take);
      found = a.previous;
      if (region.changed != nullptr && WaitCompareAndSwapSwapped(found, 0, take)) {
        region.changed->push_back({off + params.lock_offset, 8});
      }
      reply.outcome = static_cast<uint64_t>(LookupOutcome::kFound);
      FarRead(out + sizeof(LookupReply) + sizeof(uint64_t), region.base + off, size);
    }
  }
  std::memcpy(out, &reply, sizeof(reply));
  std::memcpy(out + sizeof(reply), &found, sizeof(found));
}

Status DecodeLockReadReply(const std::byte* reply, uint16_t server_id, uint64_t held_mask,
                           uint32_t size, void* record, LockReadResult* result) {
  result->found = 0;
  result->locked = false;
  LookupReply r;
  std::memcpy(&r, reply, sizeof(r));
  if (r.outcome == static_cast<uint64_t>(LookupOutcome::kOutOfBounds)) {
    result->lookup = LookupResult{};
    return Status::InvalidArgument(
        "lookup-lock-read: " + GlobalAddress(server_id, r.value).ToString() +
        " (a bucket or record it reached) is outside the region or "
        "every lease, or the record's lock word is not aligned");
  }
  FARPOOL_RETURN_IF_ERROR(DecodeLookupReply(reply, server_id, &result->lookup));
  if (result->lookup.outcome == LookupResult::Outcome::kFound) {
    std::memcpy(&result->found, reply + sizeof(LookupReply), sizeof(uint64_t));
    result->locked = (result->found & held_mask) == 0;
    std::memcpy(record, reply + sizeof(LookupReply) + sizeof(uint64_t), size);
  }
  return Status::Ok();
}

LookupParams ParamsOf(const LookupSpec& spec) {
  return {spec.bucket_size, spec.entries_offset, spec.entry_count,
          spec.next_offset, kMaxLookupBuckets,   0};
}

Status DecodeLookupReply(const std::byte* reply, uint16_t server_id, LookupResult* result) {
  LookupReply r;
  std::memcpy(&r, reply, sizeof(r));
  result->value = GlobalAddress::FromRaw(r.value);
  using Outcome = LookupResult::Outcome;
  switch (static_cast<LookupOutcome>(r.outcome)) {
    case LookupOutcome::kAbsent:
      result->outcome = Outcome::kAbsent;
      return Status::Ok();
    case LookupOutcome::kFound:
      result->outcome = Outcome::kFound;
      return Status::Ok();
    case LookupOutcome::kFoundNotRead:
      result->outcome = Outcome::kFoundNotRead;
      return Status::Ok();
    case LookupOutcome::kContinue:
      result->outcome = Outcome::kContinue;
      return Status::Ok();
    case LookupOutcome::kOutOfBounds:
      result->value = GlobalAddress();
      return Status::InvalidArgument(
          "lookup-read: " + GlobalAddress(server_id, r.value).ToString() +
          " (a bucket or record it reached) is outside the region or every lease");
  }
  return Status::Protocol("lookup-read reply with unknown outcome " + std::to_string(r.outcome));
}

namespace {

// The bytes an operation checks against the region and the leases at its offset.
uint64_t Touched(const OpHeader& h, uint64_t bucket_size) {
  const auto kind = static_cast<OpKind>(h.kind);
  return kind == OpKind::kLookupRead || kind == OpKind::kInsertIfAbsent ||
                 kind == OpKind::kLookupLockRead
             ? bucket_size
             : h.size;
}

}  // namespace

Result<Execution> Execution::Check(uint32_t op_count, std::span<const std::byte> request_ops,
                                   const Region& region) {
  Execution e;
  e.ops_.assign(request_ops.begin(), request_ops.end());
  const std::span<const std::byte> ops(e.ops_);
  std::vector<Checked>& checked = e.checked_;
  // No more operations than headers fit in the tail: a count from the wire must not size an
  // allocation (the fuzz target found a request that asked for 400 GB).
  checked.reserve(std::min<size_t>(op_count, ops.size() / sizeof(OpHeader)));
  size_t at = 0;
  uint64_t reply_size = 0;
  for (uint32_t i = 0; i < op_count; ++i) {
    auto bad = [&](const std::string& why) {
      return Status::InvalidArgument("batch operation " + std::to_string(i) + " of " +
                                     std::to_string(op_count) + ": " + why);
    };
    if (ops.size() - at < sizeof(OpHeader)) return bad("truncated header");
    Checked c{};
    std::memcpy(&c.header, ops.data() + at, sizeof(OpHeader));
    at += sizeof(OpHeader);
    const OpHeader& h = c.header;
    const auto kind = static_cast<OpKind>(h.kind);
    if (h.kind < static_cast<uint8_t>(OpKind::kRead) ||
        h.kind > static_cast<uint8_t>(OpKind::kLookupLockRead)) {
      return bad("unknown kind " + std::to_string(h.kind));
    }
    if (h.reserved[0] != 0 || h.reserved[1] != 0 || h.reserved[2] != 0) {
      return bad("reserved bytes are not zero");
    }
    if (region.writes_only && kind != OpKind::kWrite) return bad("only writes are accepted here");
    auto bad_op = [&](const std::string& why) {
      return bad(std::string(KindName(kind)) + " of " + std::to_string(h.size) +
                 " bytes at offset " + std::to_string(h.offset) + ": " + why);
    };
    const bool lookup = kind == OpKind::kLookupRead;
    const bool insert = kind == OpKind::kInsertIfAbsent;
    const bool wait = kind == OpKind::kWaitCompareAndSwap;
    const bool lock_read = kind == OpKind::kLookupLockRead;
    uint64_t touched = h.size;  // bytes at h.offset checked against the region and leases
    if (IsAtomic(kind)) {
      if (h.size != sizeof(uint64_t)) return bad_op("atomics are 8 bytes");
      if (h.offset % 8 != 0) return bad_op("not 8-byte aligned");
      if (wait) {
        if (ops.size() - at < sizeof(WaitParams)) return bad_op("parameters truncated");
        std::memcpy(&c.wait, ops.data() + at, sizeof(WaitParams));
        at += sizeof(WaitParams);
        if (std::string why = CheckWaitParams(c.wait, h.desired); !why.empty()) {
          return bad_op(why);
        }
      }
    } else if (insert) {
      if (h.size != 0) return bad_op("size is not 0");
      if (h.offset % 8 != 0) return bad_op("bucket not 8-byte aligned");
      if (h.desired == 0) return bad_op("value is zero");
      if (ops.size() - at < sizeof(InsertParams)) return bad_op("parameters truncated");
      std::memcpy(&c.insert, ops.data() + at, sizeof(InsertParams));
      at += sizeof(InsertParams);
      if (std::string why = CheckInsertParams(c.insert); !why.empty()) return bad_op(why);
      touched = c.insert.layout.bucket_size;
    } else if (lookup) {
      if (h.size > kMaxInlineBytes) return bad_op("record size out of range");
      if (h.offset % 8 != 0) return bad_op("bucket not 8-byte aligned");
      if (ops.size() - at < sizeof(LookupParams)) return bad_op("parameters truncated");
      std::memcpy(&c.lookup, ops.data() + at, sizeof(LookupParams));
      at += sizeof(LookupParams);
      if (std::string why = CheckLookupParams(c.lookup); !why.empty()) return bad_op(why);
      touched = c.lookup.bucket_size;
    } else if (lock_read) {
      if (h.size == 0 || h.size > kMaxInlineBytes) return bad_op("record size out of range");
      if (h.offset % 8 != 0) return bad_op("bucket not 8-byte aligned");
      if (ops.size() - at < sizeof(LockReadParams)) return bad_op("parameters truncated");
      std::memcpy(&c.lock, ops.data() + at, sizeof(LockReadParams));
      at += sizeof(LockReadParams);
      if (std::string why = CheckLockReadParams(c.lock, h.size, h.desired); !why.empty()) {
        return bad_op(why);
      }
      touched = c.lock.layout.bucket_size;
    } else {
      if (h.size == 0 || h.size > wire::kMaxBatchTail) return bad_op("size out of range");
    }
    const bool operand_used = IsAtomic(kind) || lookup || insert || lock_read,
               desired_used = kind == OpKind::kCompareAndSwap || insert || wait || lock_read;
    if ((!operand_used && h.operand != 0) || (!desired_used && h.desired != 0)) {
      return bad_op("unused operand is not zero");
    }
    if (touched > region.size || h.offset > region.size - touched) {
      return bad_op("beyond the region of " + std::to_string(region.size) + " bytes");
    }
    if (!region.accessible(h.offset, touched)) {
      return bad_op("not inside the root area or a leased chunk");
    }
    c.data_at = 0;
    if (kind == OpKind::kWrite) {
      const uint64_t padded = Padded(h.size);
      if (ops.size() - at < padded) return bad_op("data truncated");
      c.data_at = at;
      at += padded;
    }
    reply_size += RequestBuilder::ReplyBytes(kind, h.size);
    if (reply_size > wire::kMaxBatchTail) {
      return bad("reply would exceed " + std::to_string(wire::kMaxBatchTail) + " bytes");
    }
    checked.push_back(c);
  }
  if (at != ops.size()) {
    return Status::InvalidArgument("batch of " + std::to_string(op_count) + " operations has " +
                                   std::to_string(ops.size() - at) + " trailing bytes");
  }
  e.reply_.resize(reply_size);
  return e;
}

Status Execution::Recheck(const Region& region) const {
  for (size_t i = next_; i < checked_.size(); ++i) {
    const Checked& c = checked_[i];
    const auto kind = static_cast<OpKind>(c.header.kind);
    const uint64_t touched =
        Touched(c.header, kind == OpKind::kInsertIfAbsent   ? c.insert.layout.bucket_size
                          : kind == OpKind::kLookupLockRead ? c.lock.layout.bucket_size
                                                            : c.lookup.bucket_size);
    if (!region.accessible(c.header.offset, touched)) {
      return Status::InvalidArgument(
          "batch operation " + std::to_string(i) + " of " + std::to_string(checked_.size()) + ": " +
          KindName(static_cast<OpKind>(c.header.kind)) + " at offset " +
          std::to_string(c.header.offset) +
          ": no longer inside the root area or a leased chunk (released while it waited)");
    }
  }
  return Status::Ok();
}

bool Execution::Run(const Region& region, Wait wait) {
  for (; next_ < checked_.size(); ++next_) {
    const Checked& c = checked_[next_];
    std::byte* target = region.base + c.header.offset;
    std::byte* out = reply_.data() + out_;
    switch (static_cast<OpKind>(c.header.kind)) {
      case OpKind::kRead:
        FarRead(out, target, c.header.size);
        out_ += c.header.size;
        break;
      case OpKind::kWrite:
        FarWrite(target, ops_.data() + c.data_at, c.header.size);
        if (region.changed != nullptr) region.changed->push_back({c.header.offset, c.header.size});
        break;
      case OpKind::kCompareAndSwap: {
        uint64_t expected = c.header.operand;
        __atomic_compare_exchange_n(reinterpret_cast<uint64_t*>(target), &expected,
                                    c.header.desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        if (region.changed != nullptr && expected == c.header.operand) {
          region.changed->push_back({c.header.offset, 8});
        }
        std::memcpy(out, &expected, sizeof(expected));  // the previous value either way
        out_ += sizeof(expected);
        break;
      }
      case OpKind::kWaitCompareAndSwap: {
        const WaitAttempt a = AttemptWaitCompareAndSwap(reinterpret_cast<uint64_t*>(target),
                                                        c.header.operand, c.header.desired, c.wait);
        if (a.held && c.wait.wait_us > 0 && wait == Wait::kMay) return false;
        if (wait == Wait::kExpireCurrent) wait = Wait::kMay;
        if (region.changed != nullptr &&
            WaitCompareAndSwapSwapped(a.previous, c.header.operand, c.wait)) {
          region.changed->push_back({c.header.offset, 8});
        }
        std::memcpy(out, &a.previous, sizeof(a.previous));
        out_ += sizeof(a.previous);
        break;
      }
      case OpKind::kFetchAdd: {
        const uint64_t previous = __atomic_fetch_add(reinterpret_cast<uint64_t*>(target),
                                                     c.header.operand, __ATOMIC_SEQ_CST);
        if (region.changed != nullptr) region.changed->push_back({c.header.offset, 8});
        std::memcpy(out, &previous, sizeof(previous));
        out_ += sizeof(previous);
        break;
      }
      case OpKind::kLookupRead:
        ExecuteLookupRead(region, c.header.offset, c.lookup, c.header.operand, c.header.size, out);
        out_ += sizeof(LookupReply) + c.header.size;
        break;
      case OpKind::kInsertIfAbsent:
        ExecuteInsertIfAbsent(region, c.header.offset, c.insert, c.header.operand, c.header.desired,
                              out);
        out_ += sizeof(InsertReply);
        break;
      case OpKind::kLookupLockRead:
        ExecuteLookupLockRead(region, c.header.offset, c.lock, c.header.operand, c.header.desired,
                              c.header.size, out);
        out_ += sizeof(LookupReply) + sizeof(uint64_t) + c.header.size;
        break;
    }
  }
  return true;
}

Result<std::vector<std::byte>> Execute(uint32_t op_count, std::span<const std::byte> ops,
                                       const Region& region) {
  FARPOOL_ASSIGN_OR_RETURN(Execution e, Execution::Check(op_count, ops, region));
  e.Run(region, Execution::Wait::kNever);
  return e.TakeReply();
}

}  // namespace farpool::memory_ops
