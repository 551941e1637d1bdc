// Memory operations carried in a BatchRequest (transport/wire.h): how a client that has no
// one-sided path to a server's region (TCP) sends a whole batch of reads, writes, compare-and-
// swaps and fetch-and-adds as one message, and how the server executes it.
//
// Layout of a request's tail: for each operation an OpHeader, then (writes only) its data,
// padded with zeros to a multiple of 8 bytes. A reply's tail holds, in request order, each
// read's data and each atomic's previous value (8 bytes); writes contribute nothing.
//
// Two compound operations save round trips where a pointer must be followed or a lock taken
// (see their sections below): kLookupRead walks a chain of buckets of (key, value) entries and
// reads the bytes the value found points to; kInsertIfAbsent inserts an entry under the
// chain's lock word as a one-sided inserter would; kLookupLockRead is a lookup-read that takes
// the record's lock word (if free) before it reads the record. They know nothing of any database:
// the bucket layout and the lock word travel in the request. kWaitCompareAndSwap is a compare-and-
// swap that a memory server may hold back while the word is *held* (a predicate that travels
// in the request), answering once it swapped or its bound passed (see its section).
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
#include <string>
#include <vector>

#include "farpool/pool.h"
#include "farpool/status.h"

namespace farpool::memory_ops {

enum class OpKind : uint8_t {
  kRead = 1,
  kWrite = 2,
  kCompareAndSwap = 3,
  kFetchAdd = 4,
  kLookupRead = 5,
  kInsertIfAbsent = 6,
  kWaitCompareAndSwap = 7,
  kLookupLockRead = 8,
};

struct OpHeader {
  uint8_t kind;  // OpKind
  uint8_t reserved[3];
  uint32_t size;     // bytes read or written; 8 for atomics; lookup-read: the record's bytes
  uint64_t offset;   // in the server's region; atomics: 8-byte aligned; lookup-read: the first
                     // bucket, 8-byte aligned
  uint64_t operand;  // compare-and-swap (and wait-): expected; fetch-and-add: delta; lookup-
                     // read and insert-if-absent: the key
  uint64_t desired;  // compare-and-swap (and wait-); insert-if-absent: the value (nonzero)
};
static_assert(sizeof(OpHeader) == 32);

// ---- kLookupRead: "find key K in a bucket chain, read what its value points to".
//
// The bucket at `offset` is an array of `bucket_size` bytes holding `entry_count` entries of
// 16 bytes (key, value: two 8-byte words) from `entries_offset`, and a next-bucket word (a
// GlobalAddress, 0 for none) at `next_offset`. Values and next words are GlobalAddresses
// (farpool/address.h: server id in the top 16 bits). The server copies the bucket (word-wise,
// as a read), takes the first entry whose key == K and value != 0, and if there is none
// follows the next word while it names a bucket on this server, up to `max_buckets` buckets.
// If the value found names this server and `size` > 0, it reads `size` bytes there. The
// reply for the operation is a LookupReply followed by `size` bytes (zeros unless kFound).
//
// Bounds: the first bucket is checked with the request (region, root area or a lease) like a
// read; every further bucket and the record are checked when reached (their addresses are
// data, which concurrent writers may change): one that fails ends the operation with
// kOutOfBounds naming it, and the rest of the batch executes as usual. The operation writes
// nothing, so a rejected lookup has no effect.
struct LookupParams {       // follows the OpHeader of a kLookupRead in the request
  uint32_t bucket_size;     // 16..kMaxLookupBucket, a multiple of 8
  uint16_t entries_offset;  // multiple of 8; entries end inside the bucket
  uint16_t entry_count;     // >= 1
  uint16_t next_offset;     // multiple of 8; the word is inside the bucket
  uint16_t max_buckets;     // 1..kMaxLookupBuckets
  uint32_t reserved;        // 0
};
static_assert(sizeof(LookupParams) == 16);
inline constexpr uint32_t kMaxLookupBucket = 4096;
inline constexpr uint16_t kMaxLookupBuckets = 64;

enum class LookupOutcome : uint64_t {
  kAbsent = 0,        // no live entry for the key in the chain
  kFound = 1,         // value = the entry's value; the record's bytes follow
  kFoundNotRead = 2,  // value = the entry's value, on another server (or size 0): not read
  kContinue = 3,      // value = the next bucket, on another server or past max_buckets
  kOutOfBounds = 4,   // value = the offset on this server of a bucket or record that is
                      // outside the region or outside every lease: nothing read
};
struct LookupReply {
  uint64_t outcome;  // LookupOutcome
  uint64_t value;    // see LookupOutcome
};
static_assert(sizeof(LookupReply) == 16);

// ---- kInsertIfAbsent: "insert (K, V) into a bucket chain unless K is there", as a one-sided
// inserter does it (Batch::InsertIfAbsent in farpool/pool.h has the steps), so that it
// composes with inserters and lock holders on every other path: the head's lock word is
// CASed from 0 to `lock_word` (held: kBusy, nothing changed); the chain is walked like a
// lookup's (on this server, up to max_buckets; else kNotDone) for a live entry of K (kFound)
// and the first free entry (value 0); K is stored into it and its value word CASed from 0 to
// V; the lock is CASed back to 0. No free entry: kNotDone. A failed entry or release CAS
// (someone broke our lock: the requester was fenced) gives kLockBroken. OpHeader: size 0,
// offset = the head bucket (8-byte aligned), operand = K, desired = V. The reply is an
// InsertReply. Bounds as for kLookupRead: the first bucket with the request, further buckets
// when reached (kOutOfBounds naming it, lock released, nothing else changed).
struct InsertParams {    // follows the OpHeader of a kInsertIfAbsent in the request
  LookupParams layout;   // the buckets, checked as for kLookupRead
  uint64_t lock_word;    // nonzero
  uint16_t lock_offset;  // multiple of 8; the word is inside the bucket
  uint16_t reserved[3];  // 0
};
static_assert(sizeof(InsertParams) == 32);

enum class InsertOutcome : uint64_t {
  kInserted = 0,     // value = V
  kFound = 1,        // value = the live entry's value
  kBusy = 2,         // value = the lock word found
  kNotDone = 3,      // value = 0
  kOutOfBounds = 4,  // value = the offset of a further bucket outside the region or the leases
  kLockBroken = 5,   // value = the word found by the failed CAS
};
struct InsertReply {
  uint64_t outcome;  // InsertOutcome
  uint64_t value;
};
static_assert(sizeof(InsertReply) == 16);

// ---- kWaitCompareAndSwap: "CAS the word from `expected` to `desired`; while it is held by
// someone, wait (up to a bound) and try again whenever it changes". The reply is the previous
// value, as a compare-and-swap's (8 bytes).
//
// The word is *free* when (word & held_mask) == 0, *held* when (word & held_mask) != 0 and
// word != not_held, and neither otherwise (not_held: a word that looks held but will never be
// released, e.g. a removed record's lock). One attempt is a CPU compare-and-swap from
// `expected`; with kWaitTakeFree, a free word that is not `expected` is swapped too (the CAS
// is repeated from the word found while it is free: what a client that retries "with the word
// it saw" does). So the operation swapped iff the previous value is `expected`, or (with
// kWaitTakeFree) the previous value is free. An attempt that found the word held may be held
// back by the memory server (MemoryServer: waiters per word, FIFO, re-attempted when its loop
// changes the word and on a short timer, answered at the latest `wait_us` after it began to
// wait); everywhere else (Execute, mapped and one-sided clients) the operation is one attempt
// and the caller polls. Every answer is one a client retrying the CAS could have seen, so it
// composes with every other path. Bounds: as a compare-and-swap's (8 bytes, aligned, region,
// root area or a lease), checked with the request and again before an attempt after a wait.
//
// kWaitOnly makes it a *wait-until-free* that changes nothing: an attempt loads the word, which
// counts as held while it is held (above) and still equals `expected` (the holder the caller
// saw), so a server answers as soon as that holder let go of it (released, broken, or moved on
// to another word) or at the bound. The reply is the word found; nothing is swapped (`desired`
// must be 0; excludes kWaitTakeFree). A reader that must not read past a holder (a record
// being installed) puts its read behind it, after a fence: one round trip, answered the moment
// the holder's release is executed. Being a load, it changes nothing a replicated server would
// forward, and every answer is one a client polling the word could have seen.
struct WaitParams {    // follows the OpHeader of a kWaitCompareAndSwap in the request
  uint64_t held_mask;  // nonzero
  uint64_t not_held;   // a word that is not waited for although (word & held_mask) != 0
  uint32_t wait_us;    // the bound, at most kMaxWaitUs; 0: one attempt
  uint32_t flags;      // kWaitTakeFree or kWaitOnly, else 0
};
static_assert(sizeof(WaitParams) == 24);
inline constexpr uint32_t kWaitTakeFree = 1;
inline constexpr uint32_t kWaitOnly = 2;
inline constexpr uint32_t kMaxWaitUs = 1'000'000;

// ---- kLookupLockRead: "find key K in a bucket chain, lock the record its value points to if
// it is free, then read the record" (a locking read's lookup, lock and copy in one message).
//
// The walk is kLookupRead's (LookupParams, the same bounds and outcomes). Where it is kFound
// (the record is on this server and inside the region and a lease), the 8-byte word at
// `lock_offset` in the record is *free* when (word & held_mask) == 0; a free word is swapped to
// `desired` (OpHeader.desired, nonzero) by a CPU compare-and-swap repeated from the word found
// while it is free (kWaitCompareAndSwap's take-free attempt); a held word is left alone. Then the
// record's `size` bytes are read (so a swapped copy shows `desired` and the version the previous
// word named). It never waits. OpHeader: size = the record's bytes (lock_offset + 8 <= size),
// offset = the first bucket, operand = K, desired = the lock word. The reply is a LookupReply, the
// lock word found (8 bytes: the previous value if swapped; 0 unless kFound), then `size` bytes
// (zeros unless kFound). Swapped iff kFound and the word found is free. A record whose lock word is
// not 8-byte aligned is kOutOfBounds. Every answer is one a client doing the lookup-read, then a
// take-free compare-and-swap, then the read, with nothing in between, could have seen, so it
// composes with every other path.
struct LockReadParams {  // follows the OpHeader of a kLookupLockRead in the request
  LookupParams layout;   // the buckets, checked as for kLookupRead
  uint64_t held_mask;    // nonzero
  uint32_t lock_offset;  // multiple of 8; the word is inside the record
  uint32_t reserved;     // 0
};
static_assert(sizeof(LockReadParams) == 32);

// The checks of a WaitParams and of the operation's `desired` (Execute's, also used by
// clients): empty if well-formed.
std::string CheckWaitParams(const WaitParams& params, uint64_t desired);
// The wire parameters of a Batch::WaitCompareAndSwap's spec (checked by CheckWaitParams).
WaitParams ParamsOf(const WaitSpec& spec);

// The outcome of one attempt of a wait-compare-and-swap on `word` (see above).
struct WaitAttempt {
  uint64_t previous;
  bool held;  // the word was held: a server may wait and attempt again
};
WaitAttempt AttemptWaitCompareAndSwap(uint64_t* word, uint64_t expected, uint64_t desired,
                                      const WaitParams& params);
// Whether a wait-compare-and-swap that answered `previous` swapped (never, with kWaitOnly).
bool WaitCompareAndSwapSwapped(uint64_t previous, uint64_t expected, const WaitParams& params);

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
  // REQUIRES: Fits(OpKind::kLookupRead, size).
  void LookupRead(uint64_t bucket_offset, const LookupParams& params, uint64_t key, uint32_t size);
  // REQUIRES: Fits(OpKind::kInsertIfAbsent, 0).
  void InsertIfAbsent(uint64_t bucket_offset, const InsertParams& params, uint64_t key,
                      uint64_t value);
  // REQUIRES: Fits(OpKind::kWaitCompareAndSwap, 8); with kWaitOnly, desired 0.
  void WaitCompareAndSwap(uint64_t offset, uint64_t expected, uint64_t desired,
                          const WaitParams& params);
  // REQUIRES: Fits(OpKind::kLookupLockRead, size).
  void LookupLockRead(uint64_t bucket_offset, const LockReadParams& params, uint64_t key,
                      uint64_t desired, uint32_t size);

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

// Bytes of a region: [offset, offset + size).
struct Range {
  uint64_t offset;
  uint64_t size;
};

// The region a server executes requests on.
struct Region {
  std::byte* base = nullptr;
  uint64_t size = 0;
  // Whether [offset, offset + size) may be touched: inside the root area or one lease.
  std::function<bool(uint64_t offset, uint64_t size)> accessible;
  // The server's id: lookup-reads follow only addresses on this server.
  uint16_t server_id = 0;
  // If set, every range an operation may have changed is appended (a primary forwards their
  // bytes to its backup; a memory server re-attempts the waiters of a word changed): writes,
  // compare-and-swaps that swapped, fetch-and-adds, the lock word and entry an insert-if-
  // absent took.
  std::vector<Range>* changed = nullptr;
  // Only writes are accepted (a backup applying its primary's forwards).
  bool writes_only = false;
  // If set (a server whose backups share its pages): where the insert-if-absent whose lock is
  // at `offset` records itself, at wire::kInsertIntentOffset of the root area of the region
  // (own part or served slot) that holds the lock: two words {the lock's offset from that root
  // + 1, lock word}, written before the lock is taken and cleared (first word 0) once it is
  // released. A backup that adopts the pages of a server
  // killed in between releases that lock (pool/server/mirror.h).
  std::function<uint64_t*(uint64_t offset)> insert_intent;
};

// The checks of a LookupParams (Execute's, also used by clients before they post one):
// empty if well-formed, else why not.
std::string CheckLookupParams(const LookupParams& params);

// Executes one checked lookup-read on `region` (the first bucket at `bucket_offset` must be
// inside it; everything else is checked here): writes the LookupReply and `size` bytes
// (zeros unless kFound) to `out`. Used by the server and by clients that map the region.
void ExecuteLookupRead(const Region& region, uint64_t bucket_offset, const LookupParams& params,
                       uint64_t key, uint32_t size, std::byte* out);

// The checks of an InsertParams (Execute's, also used by clients): empty if well-formed.
std::string CheckInsertParams(const InsertParams& params);

// Executes one checked insert-if-absent on `region` (the first bucket at `bucket_offset`
// must be inside it; everything else is checked here): writes the InsertReply to `out`. Used
// by the server and by clients that map the region.
void ExecuteInsertIfAbsent(const Region& region, uint64_t bucket_offset, const InsertParams& params,
                           uint64_t key, uint64_t value, std::byte* out);
// An insert-if-absent's InsertReply (at `reply`) as executed by server `server_id`, into
// `result`; InvalidArgument naming the address for kOutOfBounds, Protocol for an unknown
// outcome.
Status DecodeInsertReply(const std::byte* reply, uint16_t server_id, InsertResult* result);

// The checks of a LockReadParams for a record of `size` bytes and of `desired` (Execute's,
// also used by clients): empty if well-formed.
std::string CheckLockReadParams(const LockReadParams& params, uint32_t size, uint64_t desired);

// Executes one checked lookup-lock-read on `region` (the first bucket at `bucket_offset` must
// be inside it): writes the LookupReply, the word found and `size` bytes to `out`. Used by the
// server and by clients that map the region.
void ExecuteLookupLockRead(const Region& region, uint64_t bucket_offset,
                           const LockReadParams& params, uint64_t key, uint64_t desired,
                           uint32_t size, std::byte* out);
// A lookup-lock-read's reply (at `reply`) as executed by server `server_id`: the lookup into
// result->lookup, the word found and whether it was swapped; the record's bytes to `record`
// if kFound. Errors as DecodeLookupReply's.
Status DecodeLockReadReply(const std::byte* reply, uint16_t server_id, uint64_t held_mask,
                           uint32_t size, void* record, LockReadResult* result);

// Scans one copy of a bucket: the value of the first entry with `key` and a nonzero value
// (0 if none), and the bucket's next word.
struct BucketScan {
  uint64_t value;
  uint64_t next;
};
BucketScan ScanBucket(const std::byte* bucket, const LookupParams& params, uint64_t key);

// The wire parameters of a Batch::LookupRead's spec (walks of at most kMaxLookupBuckets).
LookupParams ParamsOf(const LookupSpec& spec);
// A lookup-read's LookupReply (at `reply`) as executed by server `server_id`, into `result`;
// InvalidArgument naming the address for kOutOfBounds, Protocol for an unknown outcome.
Status DecodeLookupReply(const std::byte* reply, uint16_t server_id, LookupResult* result);

// One request being executed: checked as a whole first, then executed in order, possibly in
// several steps: a memory server stops it at a wait-compare-and-swap that finds its word held
// and resumes it later (the operations after it wait too: a batch's order is kept). Owns a
// copy of the request. Not thread-safe.
class Execution {
 public:
  // Checks every operation of a request's tail (`op_count` operations in `ops`) against
  // `region`. Errors: InvalidArgument naming the first bad operation (unknown kind, nonzero
  // reserved bytes, a size of 0 or beyond the limits, a misaligned atomic or lookup bucket,
  // malformed parameters, a range outside the region or outside every lease, a count that
  // disagrees with the tail, truncated or trailing bytes); nothing is executed then.
  static Result<Execution> Check(uint32_t op_count, std::span<const std::byte> ops,
                                 const Region& region);

  enum class Wait : uint8_t {
    kNever,          // every wait-compare-and-swap is one attempt
    kMay,            // stop at a wait-compare-and-swap (wait_us > 0) that finds its word held
    kExpireCurrent,  // the stopped one is attempted once more and answered; later ones may stop
  };
  // Executes operations from the first not yet executed; returns whether all are done (else
  // stopped: waiting_offset()). REQUIRES: !done(); after a stop, Recheck passed.
  bool Run(const Region& region, Wait wait);
  bool done() const { return next_ == checked_.size(); }
  // REQUIRES: stopped. The word the stopped operation waits for, and its bound.
  uint64_t waiting_offset() const { return checked_[next_].header.offset; }
  uint32_t waiting_us() const { return checked_[next_].wait.wait_us; }
  // The operations not yet executed are checked against region.accessible again (a lease may
  // have been released while the request waited): InvalidArgument naming the first that fails.
  Status Recheck(const Region& region) const;
  // REQUIRES: done(). The reply's tail.
  std::vector<std::byte> TakeReply() { return std::move(reply_); }

 private:
  struct Checked {
    OpHeader header;
    size_t data_at;       // writes: where the data is in ops_ (an offset: ops_ moves with us)
    LookupParams lookup;  // lookup-reads
    InsertParams insert;  // insert-if-absent
    WaitParams wait;      // wait-compare-and-swap
    LockReadParams lock;  // lookup-lock-read
  };
  std::vector<std::byte> ops_;
  std::vector<Checked> checked_;
  size_t next_ = 0;
  std::vector<std::byte> reply_;
  size_t out_ = 0;  // where the next reply bytes go
};

// Checks a request, then executes it at once (Execution with Wait::kNever): returns the reply's
// tail. Errors as Execution::Check's; nothing is executed then.
Result<std::vector<std::byte>> Execute(uint32_t op_count, std::span<const std::byte> ops,
                                       const Region& region);

}  // namespace farpool::memory_ops
