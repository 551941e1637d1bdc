// Memory operations carried in a BatchRequest (transport/wire.h): how a client that has no
// one-sided path to a server's region (TCP) sends a whole batch of reads, writes, compare-and-
// swaps and fetch-and-adds as one message, and how the server executes it.
//
// Layout of a request's tail: for each operation an OpHeader, then (writes only) its data,
// padded with zeros to a multiple of 8 bytes. A reply's tail holds, in request order, each
// read's data and each atomic's previous value (8 bytes); writes contribute nothing.
//
// Semantics are exactly those of the one-sided path, so clients on different fabrics share
// one region safely: atomics are CPU atomics on the 8-byte word (atomic with respect to
// same-host clients' CPU atomics and to UCX's emulated atomics, which the same server thread
// runs); reads and writes are word-wise copies with no atomicity beyond 8-byte words. The
// server checks every operation of a request before it executes any (a malformed or
// out-of-bounds request changes nothing and gets an error naming the operation), then executes
// them in order. Clients promise no order within a batch (Batch's contract), so the order is
// an implementation detail, not an API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "farpool/status.h"

namespace farpool::memory_ops {

enum class OpKind : uint8_t { kRead = 1, kWrite = 2, kCompareAndSwap = 3, kFetchAdd = 4 };

struct OpHeader {
  uint8_t kind;  // OpKind
  uint8_t reserved[3];
  uint32_t size;     // bytes read or written; 8 for atomics
  uint64_t offset;   // in the server's region; atomics: 8-byte aligned
  uint64_t operand;  // compare-and-swap: expected; fetch-and-add: delta
  uint64_t desired;  // compare-and-swap only
};
static_assert(sizeof(OpHeader) == 32);

// Reads and writes larger than this take the one-sided path even over TCP (UCX's rendezvous
// moves them without a copy through the server's message loop).
inline constexpr uint64_t kMaxInlineBytes = 16 << 10;

// Builds the tail of one BatchRequest. Not thread-safe.
class RequestBuilder {
 public:
  // Bytes `op` adds to the request and to the reply.
  static uint64_t RequestBytes(OpKind kind, uint64_t size);
  static uint64_t ReplyBytes(OpKind kind, uint64_t size);
  // Whether an operation of `kind` and `size` still fits in this request (both the request's
  // and the reply's tail within wire::kMaxBatchTail). An empty builder fits every operation of
  // at most kMaxInlineBytes.
  bool Fits(OpKind kind, uint64_t size) const;

  // REQUIRES: Fits(kind, size).
  void Read(uint64_t offset, uint32_t size);
  void Write(uint64_t offset, const void* data, uint32_t size);
  void CompareAndSwap(uint64_t offset, uint64_t expected, uint64_t desired);
  void FetchAdd(uint64_t offset, uint64_t delta);

  uint32_t op_count() const { return op_count_; }
  std::span<const std::byte> bytes() const { return bytes_; }
  uint64_t reply_size() const { return reply_size_; }
  bool empty() const { return op_count_ == 0; }
  void Clear();

 private:
  // `data`: a write's h.size bytes, else null.
  void Append(const OpHeader& h, const void* data);

  std::vector<std::byte> bytes_;
  uint32_t op_count_ = 0;
  uint64_t reply_size_ = 0;
};

// The region a server executes requests on.
struct Region {
  std::byte* base = nullptr;
  uint64_t size = 0;
  // Whether [offset, offset + size) may be touched: inside the root area or one lease.
  std::function<bool(uint64_t offset, uint64_t size)> accessible;
};

// Checks every operation of a request's tail (`op_count` operations in `ops`), then executes
// them on `region`; returns the reply's tail. Errors: InvalidArgument naming the first bad
// operation (unknown kind, nonzero reserved bytes, a size of 0 or beyond the limits, a
// misaligned atomic, a range outside the region or outside every lease, a count that
// disagrees with the tail, truncated or trailing bytes); nothing is executed then.
Result<std::vector<std::byte>> Execute(uint32_t op_count, std::span<const std::byte> ops,
                                       const Region& region);

}  // namespace farpool::memory_ops
