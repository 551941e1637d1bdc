#include "pool/memory_ops.h"

#include <cstring>
#include <string>

#include "common/far_copy.h"
#include "transport/wire.h"

namespace farpool::memory_ops {
namespace {

uint64_t Padded(uint64_t size) { return (size + 7) & ~uint64_t{7}; }

bool IsAtomic(OpKind kind) { return kind == OpKind::kCompareAndSwap || kind == OpKind::kFetchAdd; }

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
  }
  return "unknown";
}

// One checked operation of a request.
struct Checked {
  OpHeader header;
  const std::byte* data;  // writes: the data in the request
};

}  // namespace

uint64_t RequestBuilder::RequestBytes(OpKind kind, uint64_t size) {
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
      return sizeof(uint64_t);
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
  if (data != nullptr) std::memcpy(bytes_.data() + at + sizeof(h), data, h.size);
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

void RequestBuilder::Clear() {
  bytes_.clear();
  op_count_ = 0;
  reply_size_ = 0;
}

Result<std::vector<std::byte>> Execute(uint32_t op_count, std::span<const std::byte> ops,
                                       const Region& region) {
  std::vector<Checked> checked;
  checked.reserve(op_count);
  size_t at = 0;
  uint64_t reply_size = 0;
  for (uint32_t i = 0; i < op_count; ++i) {
    auto bad = [&](const std::string& why) {
      return Status::InvalidArgument("batch operation " + std::to_string(i) + " of " +
                                     std::to_string(op_count) + ": " + why);
    };
    if (ops.size() - at < sizeof(OpHeader)) return bad("truncated header");
    Checked c;
    std::memcpy(&c.header, ops.data() + at, sizeof(OpHeader));
    at += sizeof(OpHeader);
    const OpHeader& h = c.header;
    const auto kind = static_cast<OpKind>(h.kind);
    if (h.kind < static_cast<uint8_t>(OpKind::kRead) ||
        h.kind > static_cast<uint8_t>(OpKind::kFetchAdd)) {
      return bad("unknown kind " + std::to_string(h.kind));
    }
    if (h.reserved[0] != 0 || h.reserved[1] != 0 || h.reserved[2] != 0) {
      return bad("reserved bytes are not zero");
    }
    auto bad_op = [&](const std::string& why) {
      return bad(std::string(KindName(kind)) + " of " + std::to_string(h.size) +
                 " bytes at offset " + std::to_string(h.offset) + ": " + why);
    };
    if (IsAtomic(kind)) {
      if (h.size != sizeof(uint64_t)) return bad_op("atomics are 8 bytes");
      if (h.offset % 8 != 0) return bad_op("not 8-byte aligned");
    } else {
      if (h.size == 0 || h.size > wire::kMaxBatchTail) return bad_op("size out of range");
    }
    const bool operand_used = IsAtomic(kind), desired_used = kind == OpKind::kCompareAndSwap;
    if ((!operand_used && h.operand != 0) || (!desired_used && h.desired != 0)) {
      return bad_op("unused operand is not zero");
    }
    if (h.size > region.size || h.offset > region.size - h.size) {
      return bad_op("beyond the region of " + std::to_string(region.size) + " bytes");
    }
    if (!region.accessible(h.offset, h.size)) {
      return bad_op("not inside the root area or a leased chunk");
    }
    c.data = nullptr;
    if (kind == OpKind::kWrite) {
      const uint64_t padded = Padded(h.size);
      if (ops.size() - at < padded) return bad_op("data truncated");
      c.data = ops.data() + at;
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

  std::vector<std::byte> reply(reply_size);
  std::byte* out = reply.data();
  for (const Checked& c : checked) {
    std::byte* target = region.base + c.header.offset;
    switch (static_cast<OpKind>(c.header.kind)) {
      case OpKind::kRead:
        FarRead(out, target, c.header.size);
        out += c.header.size;
        break;
      case OpKind::kWrite:
        FarWrite(target, c.data, c.header.size);
        break;
      case OpKind::kCompareAndSwap: {
        uint64_t expected = c.header.operand;
        __atomic_compare_exchange_n(reinterpret_cast<uint64_t*>(target), &expected,
                                    c.header.desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        std::memcpy(out, &expected, sizeof(expected));  // the previous value either way
        out += sizeof(expected);
        break;
      }
      case OpKind::kFetchAdd: {
        const uint64_t previous = __atomic_fetch_add(reinterpret_cast<uint64_t*>(target),
                                                     c.header.operand, __ATOMIC_SEQ_CST);
        std::memcpy(out, &previous, sizeof(previous));
        out += sizeof(previous);
        break;
      }
    }
  }
  return reply;
}

}  // namespace farpool::memory_ops
