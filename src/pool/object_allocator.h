// ObjectAllocator: carves objects out of chunks that this client leased from memory servers
// (MEMSCALE's reservation phase, then local allocation with no round trip).
//
// How it works: objects of up to chunk_size/4 bytes are rounded up to a power-of-two size
// class (64 B minimum, so every object is cache-line and atomic aligned) and placed in a slot
// of a slab chunk of that class; larger objects get a run of whole chunks of their own. Per
// server, a fixed table has one ChunkState per chunk of the region, so "which object covers
// this address" is an array index, and CheckLive (on every read and write) takes no lock.
// A chunk whose last object is freed, and a freed large object's run, stay leased as
// "freed" memory: later allocations reuse them, and reads or writes into them are rejected
// as use-after-free. Trim() (also run by the Pool's destructor, and before a lease is refused
// for lack of room) gives freed memory back to its servers; after that the client can no
// longer tell freed memory from another client's.
//
// Invariants (under mu_): a chunk's state is kNone unless this allocator holds its lease; a
// slab's live bitmap has exactly live_count bits set; a slab is in partial[class] iff
// live_count < slot count; a run (offset, size) is in retained iff its chunks are kFreed.
//
// Servers: a fixed-capacity table (`capacity` at construction). AddServer appends one (a server
// the Pool learned from the cluster map) and publishes it with a release store of the count;
// an index is valid once AddServer has returned it, and stays valid.
//
// Thread-safety: Allocate, Free, Trim and AddServer are serialised by one mutex (they may block
// on a lease round trip); CheckLive is lock-free and safe concurrently with them, for an index
// its caller learned after AddServer returned it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "farpool/status.h"

namespace farpool {

class ObjectAllocator {
 public:
  struct Geometry {
    uint64_t region_size;  // includes the root area
    uint64_t chunk_size;
  };
  // Lease `size` bytes (a chunk multiple) on server `index`; returns the offset.
  using LeaseFn = std::function<Result<uint64_t>(size_t index, uint64_t size)>;
  using ReleaseFn = std::function<Status(size_t index, uint64_t offset, uint64_t size)>;

  // REQUIRES: servers.size() <= capacity.
  ObjectAllocator(const std::vector<Geometry>& servers, size_t capacity, LeaseFn lease,
                  ReleaseFn release);
  ~ObjectAllocator();

  // Adds a server; returns its index (the number of servers before). ResourceExhausted when
  // the table is full.
  Result<size_t> AddServer(const Geometry& geometry);

  // Returns the offset of a new object of at least `size` bytes on server `index`.
  // REQUIRES: size > 0.
  Result<uint64_t> Allocate(size_t index, uint64_t size);
  // Errors: InvalidArgument if `offset` is not the start of a live object allocated here.
  Status Free(size_t index, uint64_t offset);
  // InvalidArgument if [offset, offset+size) lies in a chunk this allocator leased but not
  // inside one live object (freed, or crossing an object's end). Ranges in chunks leased by
  // other clients cannot be judged here and are accepted.
  Status CheckLive(size_t index, uint64_t offset, uint64_t size) const;

  // Releases every freed-but-retained run of every server. Returns the first error.
  Status Trim();

  // The largest object that goes into a slab; larger ones get whole chunks.
  uint64_t max_slab_object(size_t index) const;

 private:
  struct ChunkState;
  struct Server;

  Result<uint64_t> AllocateSlot(size_t index, unsigned cls);
  Result<uint64_t> AllocateRun(size_t index, uint64_t size);
  // A run of exactly `size` bytes: a retained one, else a new lease (trimming on a full pool).
  Result<uint64_t> TakeRun(size_t index, uint64_t size);
  void Retain(size_t index, uint64_t offset, uint64_t size);
  Status TrimLocked(size_t index);

  LeaseFn lease_;
  ReleaseFn release_;
  static std::unique_ptr<Server> MakeServer(const Geometry& geometry);

  std::vector<std::unique_ptr<Server>> servers_;  // `capacity` entries, the first count_ set
  std::atomic<size_t> count_{0};
  std::mutex mu_;
};

}  // namespace farpool
