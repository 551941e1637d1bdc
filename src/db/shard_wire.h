// Wire format of the sharded engine: coordinator (a compute process's session) <-> partition
// server (`farpool shard`, or a thread of the compute process), carried as UCX active messages
// (id kShardAm, sent eagerly) over farpool's transport layer. Every message is one frame of
// transport/frame.h (magic "FPS1", version 1):
//
//   | magic u32 | version u16 | opcode u16 | body_size u32 | flags u32 | request_id u64 |
//   | body (the opcode's fixed struct) | tail (items of the opcode, see each struct) |
//
// Fixed-width little-endian fields, one packed struct per message with a size static_assert.
// Every message of one phase for one partition is one message: a Read carries any number of
// keys, a Prepare the partition's whole write set. Decoding never trusts a length: Decode (the
// frame codec) checks the header, the opcode's fixed body and that opcodes without items have
// no tail; each Parse* checks that the tail is exactly its items (counts, per-item value sizes,
// enum values) and returns Protocol naming what is wrong.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "farpool/status.h"
#include "transport/frame.h"

namespace farpool::db::shard {

inline constexpr uint32_t kMagic = 0x31535046;  // "FPS1"
inline constexpr uint16_t kVersion = 1;
inline constexpr unsigned kShardAm = 8;           // UCX active-message id
inline constexpr size_t kMaxValue = 16ull << 20;  // one row's bytes
inline constexpr size_t kNameSize = 64;           // table names: 1..63 bytes
inline constexpr size_t kMaxColumns = 16;

enum class Opcode : uint16_t {
  kErrorReply = 1,    // a failed request: transport::ErrorBody + reason
  kBeginRequest = 2,  // timestamp service: the read timestamp
  kBeginReply = 3,
  kReadRequest = 4,  // point reads at a snapshot
  kReadReply = 5,
  kScanRequest = 6,     // range read at a snapshot
  kScanReply = 7,       // a ReadReply body
  kPrepareRequest = 8,  // lock + first-committer-wins validation of a write set
  kPrepareReply = 9,
  kDecideRequest = 10,  // timestamp service: the commit decision and timestamp
  kDecideReply = 11,
  kResolveRequest = 12,  // timestamp service: the outcome of a dead coordinator's transaction
  kResolveReply = 13,
  kCommitRequest = 14,  // install + release (commit_ts 0: release only = abort)
  kCommitReply = 15,
  kCreateTableRequest = 16,  // catalog (partition 0)
  kTableReply = 17,
  kOpenTableRequest = 18,
  kDropTableRequest = 19,
  kDropTableReply = 20,
  kListTablesRequest = 21,
  kListTablesReply = 22,
  kLockedRequest = 23,  // checker: locked records of a table, and expired lock holders
  kLockedReply = 24,
};
std::string_view OpcodeName(Opcode op);

struct BeginRequest {
  uint64_t reserved;
};
static_assert(sizeof(BeginRequest) == 8);
struct BeginReply {
  uint64_t read_ts;
};
static_assert(sizeof(BeginReply) == 8);

struct ReadRequest {  // tail: count × int64 key
  uint32_t table;
  uint32_t count;
  uint64_t read_ts;
};
static_assert(sizeof(ReadRequest) == 16);

enum class ReadState : uint8_t { kFound = 1, kNotFound = 2, kBusy = 3 };
// ReadReply / ScanReply tail: count × (ReadItem, value_size bytes of value).
struct ReadItem {
  int64_t key;
  uint8_t state;    // ReadState
  uint8_t expired;  // kBusy: the holder's lease has expired
  uint16_t reserved;
  uint32_t value_size;  // kFound only
  uint64_t holder;      // kBusy: the transaction holding the lock
};
static_assert(sizeof(ReadItem) == 24);
struct ReadReply {
  uint32_t count;
  uint32_t reserved;
};
static_assert(sizeof(ReadReply) == 8);

struct ScanRequest {
  uint32_t table;
  uint32_t limit;  // 0: no limit
  uint64_t read_ts;
  int64_t lo, hi;
  uint8_t reverse;
  uint8_t reserved[7];
};
static_assert(sizeof(ScanRequest) == 40);

enum class WriteOp : uint8_t { kPut = 1, kDelete = 2 };
struct WriteItem {  // followed by value_size bytes (kPut)
  uint32_t table;
  uint8_t op;  // WriteOp
  uint8_t reserved[3];
  int64_t key;
  uint32_t value_size;
  uint32_t reserved2;
};
static_assert(sizeof(WriteItem) == 24);
inline constexpr uint32_t kPrepareOnePhase = 1;  // also decide and install (single participant
                                                 // that is the timestamp service)
struct PrepareRequest {                          // tail: count × (WriteItem, value)
  uint64_t txn;
  uint64_t read_ts;
  uint32_t count;
  uint32_t lease_ms;  // the locks expire this long after they are taken
  uint32_t flags;
  uint32_t reserved;
};
static_assert(sizeof(PrepareRequest) == 32);
struct PrepareReply {
  uint32_t conflict;   // 0: prepared (all locked); 1: nothing locked, conflict
  uint32_t expired;    // conflict with a lock whose holder's lease has expired
  uint64_t holder;     // that holder, 0 if the conflict was a newer version
  uint64_t commit_ts;  // one-phase: the commit timestamp
};
static_assert(sizeof(PrepareReply) == 24);

struct DecideRequest {
  uint64_t txn;
  uint32_t install_here;  // this partition is a participant: install and release too
  uint32_t reserved;
};
static_assert(sizeof(DecideRequest) == 16);
struct DecideReply {
  uint64_t commit_ts;
};
static_assert(sizeof(DecideReply) == 8);

struct ResolveRequest {
  uint64_t txn;
};
static_assert(sizeof(ResolveRequest) == 8);
struct ResolveReply {
  uint64_t commit_ts;  // 0: aborted (now or before)
};
static_assert(sizeof(ResolveReply) == 8);

struct CommitRequest {
  uint64_t txn;
  uint64_t commit_ts;  // 0: abort
};
static_assert(sizeof(CommitRequest) == 16);
struct CommitReply {
  uint64_t released;  // records this transaction held here
};
static_assert(sizeof(CommitReply) == 8);

struct ColumnDesc {
  char name[24];
  uint32_t type;
  uint32_t length;
};
struct TableDesc {  // CreateTableRequest and TableReply body (id ignored in the request)
  uint32_t id;
  uint32_t flags;  // bit 0: ordered
  uint32_t ncols;
  uint32_t reserved;
  char name[kNameSize];
  ColumnDesc cols[kMaxColumns];
};
static_assert(sizeof(TableDesc) == 592);

struct NameRequest {  // OpenTableRequest, DropTableRequest
  char name[kNameSize];
};
static_assert(sizeof(NameRequest) == 64);
struct DropTableReply {
  uint64_t reserved;
};
static_assert(sizeof(DropTableReply) == 8);
struct ListTablesRequest {
  uint64_t reserved;
};
static_assert(sizeof(ListTablesRequest) == 8);
struct ListTablesReply {  // tail: count × char[kNameSize]
  uint32_t count;
  uint32_t reserved;
};
static_assert(sizeof(ListTablesReply) == 8);

struct LockedRequest {
  uint32_t table;  // UINT32_MAX: every table
  uint32_t reserved;
};
static_assert(sizeof(LockedRequest) == 8);
struct LockedReply {  // tail: count × uint64 expired holder
  uint64_t locked;
  uint32_t count;
  uint32_t reserved;
};
static_assert(sizeof(LockedReply) == 16);

// A decoded message: views into the caller's buffer.
using Message = transport::Message<Opcode>;

// This format for the frame codec.
const transport::FrameFormat& Format();

// Never reads outside `bytes`, which must outlive the Message: decoding a temporary buffer
// does not compile.
Result<Message> Decode(std::span<const std::byte> bytes);
Result<Message> Decode(std::vector<std::byte>&& bytes) = delete;

// Builds header + body + tail.
template <typename Body>
std::vector<std::byte> Encode(uint64_t request_id, Opcode op, const Body& body,
                              std::span<const std::byte> tail = {}) {
  return transport::EncodeFrame(Format(), request_id, static_cast<uint16_t>(op),
                                transport::BodyBytes(body), tail);
}
std::vector<std::byte> EncodeError(uint64_t request_id, const Status& status);
Status DecodeError(const Message& m);

// Appends items to a tail.
class TailWriter {
 public:
  template <typename T>
  void Put(const T& item) {
    const auto* p = reinterpret_cast<const std::byte*>(&item);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void PutBytes(std::string_view v) {
    const auto* p = reinterpret_cast<const std::byte*>(v.data());
    bytes_.insert(bytes_.end(), p, p + v.size());
  }
  std::vector<std::byte>& bytes() { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

// Parsed tails. Each Parse* consumes the whole tail or fails with Protocol.
struct ReadValue {
  ReadItem item;
  std::string_view value;
};
struct WriteValue {
  WriteItem item;
  std::string_view value;
};
Result<std::vector<int64_t>> ParseReadKeys(const Message& m);       // kReadRequest
Result<std::vector<ReadValue>> ParseReadItems(const Message& m);    // kRead/ScanReply
Result<std::vector<WriteValue>> ParseWriteItems(const Message& m);  // kPrepareRequest
Result<std::vector<std::string>> ParseNames(const Message& m);      // kListTablesReply
Result<std::vector<uint64_t>> ParseHolders(const Message& m);       // kLockedReply
// A name field (zero-padded, at most kNameSize - 1 bytes).
Result<std::string> NameOf(const char (&field)[kNameSize]);

}  // namespace farpool::db::shard
