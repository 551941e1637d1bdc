// Garbage collection of the NAM engines: the recycler (slab chunks given back when empty), freeing
// cut version chains and blobs, and reclaiming dropped tables (nam_internal.h has the rules).
#include <bit>
#include <cstring>
#include <map>
#include <utility>

#include "db/nam/nam_internal.h"

namespace farpool::db {

// ================================================================ Recycler

namespace {
// The table at RootImage::chunk_dirs: a count, then per server (id, directory, chunks,
// chunk size).
struct DirEntry {
  uint64_t id, dir, chunks, chunk_size;
};
}  // namespace

int Recycler::ClassOf(uint64_t size) {
  const int c = size <= 1 ? 0 : 64 - std::countl_zero(size - 1);
  return std::max(c, kMinClass);
}

Recycler::Slab Recycler::SlabOf(uint64_t chunk_size, int c) {
  const uint64_t most = chunk_size / ClassBytes(c);
  const uint64_t bitmap = ((most + 511) / 512) * 64;  // whole 64-byte lines of bits
  return {bitmap, (chunk_size - bitmap) / ClassBytes(c)};
}

Recycler::Recycler(Memory& memory, std::vector<Server> servers)
    : memory_(memory), servers_(std::move(servers)), caches_(servers_.size() * kClasses) {}

Result<GlobalAddress> Recycler::CreateDirectories(const Access& access) {
  std::vector<DirEntry> entries;
  for (uint16_t id : access.memory().servers()) {
    FARPOOL_ASSIGN_OR_RETURN(RegionGeometry g, access.memory().Geometry(id));
    FARPOOL_ASSIGN_OR_RETURN(
        GlobalAddress dir,
        AllocZeroed(access, std::max<uint64_t>(g.chunks(), 1) * 8, Placement::OnServer(id)));
    entries.push_back({id, dir.raw(), g.chunks(), g.chunk_size});
  }
  const uint64_t bytes = 8 + entries.size() * sizeof(DirEntry);
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress table, access.Alloc(bytes));
  std::vector<unsigned char> image(bytes);
  const uint64_t n = entries.size();
  std::memcpy(image.data(), &n, 8);
  std::memcpy(image.data() + 8, entries.data(), entries.size() * sizeof(DirEntry));
  FARPOOL_RETURN_IF_ERROR(access.Write(table, image.data(), bytes));
  return table;
}

Result<std::unique_ptr<Recycler>> Recycler::Open(const Access& access, GlobalAddress dirs) {
  uint64_t n = 0;
  FARPOOL_RETURN_IF_ERROR(access.Read(dirs, &n, 8));
  if (n == 0 || n > 65536) {
    return Status::Internal("the recycler's directory table at " + dirs.ToString() + " names " +
                            std::to_string(n) + " servers");
  }
  std::vector<DirEntry> entries(n);
  FARPOOL_RETURN_IF_ERROR(access.Read(dirs + 8, entries.data(), n * sizeof(DirEntry)));
  std::vector<Server> servers;
  for (const DirEntry& e : entries) {
    FARPOOL_ASSIGN_OR_RETURN(RegionGeometry g, access.memory().Geometry(uint16_t(e.id)));
    if (g.chunk_size != e.chunk_size || g.chunks() != e.chunks) {
      return Status::InvalidArgument(
          "server " + std::to_string(e.id) + " has " + std::to_string(g.chunks()) + " chunks of " +
          std::to_string(g.chunk_size) + " B, the database was made with " +
          std::to_string(e.chunks) + " of " + std::to_string(e.chunk_size) + " B");
    }
    servers.push_back({uint16_t(e.id), GlobalAddress::FromRaw(e.dir), e.chunks, e.chunk_size});
  }
  return std::unique_ptr<Recycler>(new Recycler(access.memory(), std::move(servers)));
}

Recycler::Stats Recycler::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

Result<size_t> Recycler::IndexOf(uint16_t id) const {
  for (size_t i = 0; i < servers_.size(); ++i) {
    if (servers_[i].id == id) return i;
  }
  return Status::InvalidArgument("server " + std::to_string(id) +
                                 " is not one of the database's servers");
}

Result<GlobalAddress> Recycler::Alloc(const Access& access, LockOwner& owner, uint64_t size,
                                      Placement placement) {
  RoundTripScope cause(RoundTripCause::kAllocator);
  const int c = ClassOf(size);
  FARPOOL_ASSIGN_OR_RETURN(uint16_t first, memory_.ServerFor(placement));
  // A server the pool learned after the database was made (`cluster add`) has no directory
  // here: its turn goes to one of the database's servers.
  auto known = IndexOf(first);
  size_t si = known.ok() ? *known : first % servers_.size();
  // Placement is a preference: a full server's objects go to the next one.
  const size_t tries = servers_.size();
  Status last;
  for (size_t t = 0; t < tries; ++t, si = (si + 1) % servers_.size()) {
    auto a = AllocOn(access, owner, si, c, size);
    if (a.ok() || a.status().code() != StatusCode::kOutOfMemory) return a;
    last = a.status();
  }
  return last;
}

Result<GlobalAddress> Recycler::AllocOn(const Access& access, LockOwner& owner, size_t si, int c,
                                        uint64_t size) {
  const Server& sv = servers_[si];
  if (!IsSlabClass(si, c)) {  // a run of its own, straight from the server
    const uint64_t run = (size + sv.chunk_size - 1) / sv.chunk_size * sv.chunk_size;
    FARPOOL_ASSIGN_OR_RETURN(GlobalAddress a, memory_.LeaseRun(sv.id, run));
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.fresh;
    return a;
  }
  std::lock_guard<std::mutex> l(mu_);
  Cache& cache = caches_[si * kClasses + c];
  cache.used = true;
  if (cache.objects.empty()) {
    FARPOOL_RETURN_IF_ERROR(Reserve(access, owner, si, c));
  } else if (cache.freed_on_top > 0) {
    --cache.freed_on_top;
    ++stats_.reused;
  }
  const GlobalAddress a = GlobalAddress::FromRaw(cache.objects.back());
  cache.objects.pop_back();
  return a;
}

Status Recycler::Reserve(const Access& access, LockOwner& owner, size_t si, int c) {
  const Server& sv = servers_[si];
  const Slab slab = SlabOf(sv.chunk_size, c);
  Cache& cache = caches_[si * kClasses + c];
  // The chunk we reserved from last, if it still has room (its word as we last saw it: a
  // guess that the CAS corrects).
  if (cache.has_hint) {
    FARPOOL_ASSIGN_OR_RETURN(uint64_t got, ReserveFrom(access, owner, si, c, cache.hint_chunk,
                                                       &cache.hint_word, Want(c)));
    if (got > 0) {
      stats_.fresh += got;
      return Status::Ok();
    }
    cache.has_hint = false;
  }
  if (MonoNs() >= cache.scan_after) {
    std::vector<uint64_t> words(sv.chunks);
    FARPOOL_RETURN_IF_ERROR(access.Read(sv.dir, words.data(), sv.chunks * 8));
    // The fullest of the chunks with room for a whole reservation first (then the fullest of
    // the others): reservations fill chunks up and leave the emptiest to drain, without
    // paying a reservation's round trips for a slot or two.
    struct Room {
      bool whole;
      uint64_t live, chunk;
      auto operator<=>(const Room&) const = default;
    };
    std::vector<Room> room;
    for (uint64_t k = 0; k < sv.chunks; ++k) {
      const uint64_t w = words[k];
      if (EntryState(w) == kOpen && EntryClass(w) == c && EntryLive(w) < slab.slots)
        room.push_back({slab.slots - EntryLive(w) >= Want(c), EntryLive(w), k});
    }
    std::sort(room.rbegin(), room.rend());
    for (const auto& [whole, live, k] : room) {
      FARPOOL_ASSIGN_OR_RETURN(uint64_t got,
                               ReserveFrom(access, owner, si, c, k, &words[k], Want(c)));
      if (got > 0) {
        stats_.fresh += got;
        cache.has_hint = true;
        cache.hint_chunk = k;
        cache.hint_word = words[k];
        return Status::Ok();
      }
    }
    cache.scan_after = MonoNs() + kScanRetryNs;
  }
  return OpenChunk(access, owner, si, c);
}

Result<uint64_t> Recycler::ReserveFrom(const Access& access, LockOwner& owner, size_t si, int c,
                                       uint64_t chunk, uint64_t* word, uint64_t want) {
  const Server& sv = servers_[si];
  const Slab slab = SlabOf(sv.chunk_size, c);
  const GlobalAddress entry = sv.dir + chunk * 8;
  uint64_t take = 0;
  for (int attempt = 0;; ++attempt) {
    const uint64_t w = *word;
    if (EntryState(w) != kOpen || EntryClass(w) != c || EntryLive(w) >= slab.slots ||
        attempt == 8) {
      return uint64_t{0};
    }
    take = std::min(want, slab.slots - EntryLive(w));
    FARPOOL_RETURN_IF_ERROR(owner.CheckLease());
    FARPOOL_ASSIGN_OR_RETURN(*word, access.Cas(entry, w, w + take));
    if (*word == w) {
      *word = w + take;
      break;
    }
  }
  // We hold `take` counts: at least that many bits are clear or being cleared (bits set <=
  // live). Claim them by CAS, word by word. Counts we fail to turn into objects are given
  // back (else the chunk could never empty).
  uint64_t left = take;
  Status s = ClaimBits(access, owner, si, c, chunk, &left);
  if (!s.ok() && left > 0) (void)access.Faa(entry, -left);
  FARPOOL_RETURN_IF_ERROR(s);
  return take;
}

Status Recycler::ClaimBits(const Access& access, LockOwner& owner, size_t si, int c, uint64_t chunk,
                           uint64_t* left) {
  const Slab slab = SlabOf(servers_[si].chunk_size, c);
  const GlobalAddress base = ChunkBase(si, chunk);
  const uint64_t nwords = slab.bitmap_bytes / 8;
  std::vector<uint64_t> bits(nwords);
  FARPOOL_RETURN_IF_ERROR(access.Read(base, bits.data(), slab.bitmap_bytes));
  Cache& cache = caches_[si * kClasses + c];
  for (int round = 0; *left > 0; ++round) {
    if (round == 10000) {
      return Status::Internal("slab chunk " + base.ToString() + " of class " +
                              std::to_string(ClassBytes(c)) + " B counts room for " +
                              std::to_string(*left) + " more objects but its bitmap has none");
    }
    struct Claim {
      uint64_t word, expected, mask, previous = 0;
    };
    std::vector<Claim> claims;
    uint64_t planned = 0;
    for (uint64_t i = 0; i < nwords && planned < *left; ++i) {
      uint64_t mask = 0;
      for (uint64_t free = ~bits[i]; free != 0 && planned < *left; free &= free - 1) {
        mask |= free & -free;
        ++planned;
      }
      if (mask != 0) claims.push_back({i, bits[i], mask});
    }
    if (claims.empty()) {  // others' bits are still being cleared: look again
      FARPOOL_RETURN_IF_ERROR(access.Read(base, bits.data(), slab.bitmap_bytes));
      std::this_thread::yield();
      continue;
    }
    FARPOOL_RETURN_IF_ERROR(owner.CheckLease());
    Access::Batch b(access);
    for (Claim& cl : claims) {
      FARPOOL_RETURN_IF_ERROR(
          b.Cas(base + cl.word * 8, cl.expected, cl.expected | cl.mask, &cl.previous));
    }
    FARPOOL_RETURN_IF_ERROR(b.Wait());
    for (const Claim& cl : claims) {
      if (cl.previous != cl.expected) {
        bits[cl.word] = cl.previous;
        continue;
      }
      bits[cl.word] |= cl.mask;
      for (uint64_t m = cl.mask; m != 0; m &= m - 1) {
        const uint64_t slot = cl.word * 64 + std::countr_zero(m);
        cache.objects.push_back((base + slab.bitmap_bytes + slot * ClassBytes(c)).raw());
        --*left;
      }
    }
  }
  return Status::Ok();
}

Status Recycler::OpenChunk(const Access& access, LockOwner& owner, size_t si, int c) {
  const Server& sv = servers_[si];
  const Slab slab = SlabOf(sv.chunk_size, c);
  const uint64_t take = std::min(Want(c), slab.slots);
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress base, memory_.LeaseRun(sv.id, sv.chunk_size));
  FARPOOL_ASSIGN_OR_RETURN(uint64_t published, Publish(access, owner, si, c, base, take));
  ++stats_.chunks_opened;
  Cache& cache = caches_[si * kClasses + c];
  cache.has_hint = true;
  cache.hint_chunk = (base.offset() - RegionGeometry::kRootAreaSize) / sv.chunk_size;
  cache.hint_word = published;
  for (uint64_t i = 0; i < take; ++i) {
    cache.objects.push_back((base + slab.bitmap_bytes + i * ClassBytes(c)).raw());
  }
  stats_.fresh += take;
  return Status::Ok();
}

Result<uint64_t> Recycler::Publish(const Access& access, LockOwner& owner, size_t si, int c,
                                   GlobalAddress base, uint64_t take) {
  const Server& sv = servers_[si];
  const Slab slab = SlabOf(sv.chunk_size, c);
  const uint64_t chunk = (base.offset() - RegionGeometry::kRootAreaSize) / sv.chunk_size;
  // The bitmap: our `take` slots, and the padding bits past the last slot (set for good).
  std::vector<uint64_t> bits(slab.bitmap_bytes / 8, 0);
  auto set = [&](uint64_t i) { bits[i / 64] |= uint64_t{1} << (i % 64); };
  for (uint64_t i = 0; i < take; ++i) set(i);
  for (uint64_t i = slab.slots; i < bits.size() * 64; ++i) set(i);
  // Until the open CAS is sent nobody else can know the chunk: a failure gives it back.
  auto give_back = [&](const Status& why) {
    (void)memory_.ReleaseRun(base, sv.chunk_size);
    return why;
  };
  if (Status s = owner.CheckLease(); !s.ok()) return give_back(s);
  if (Status s = access.Write(base, bits.data(), slab.bitmap_bytes); !s.ok()) return give_back(s);
  // Publish over whatever the word says (the server leased the chunk to us, so nobody holds
  // it; a word still open is stale, left by an earlier version that gave a chunk back after its
  // open CAS failed on the transport but had landed): the next generation, open, our count. A
  // stale reservation fails its CAS.
  const GlobalAddress entry = sv.dir + chunk * 8;
  uint64_t word = 0;
  if (Status s = access.Read(entry, &word, 8); !s.ok()) return give_back(s);
  for (;;) {
    const uint64_t open = Entry(kOpen, c, EntryGen(word) + 1, take);
    owner.FaultPoint("recycler.opening");
    auto prev = access.Cas(entry, word, open);
    if (prev.ok() && *prev == word) return open;
    if (prev.ok()) {
      word = *prev;
      continue;
    }
    // Its outcome may be unknown: only we write the next generation into this word (we hold
    // the chunk's lease), and reservers and withdrawals keep a word's generation, so the word
    // read again says whether the CAS landed. A failure of the memory under that read too (a
    // failover under way; a primary not serving until its backup answers again) is waited out
    // as a commit's round is (CommitRun::Retrying): a read changes nothing.
    owner.FaultPoint("recycler.open-failed");
    uint64_t now = 0;
    auto memory_failure = [](const Status& x) {
      return x.code() == StatusCode::kUnavailable || x.code() == StatusCode::kTimedOut;
    };
    Status s = access.Read(entry, &now, 8);
    if (memory_failure(s) && access.memory().replicated()) {
      LockWait wait(kSettleOpenNs, 1'000'000, 100'000'000);
      while (memory_failure(s) && wait.Pause()) s = access.Read(entry, &now, 8);
    }
    if (!s.ok()) {
      return prev.status().WithContext(
          "opening slab chunk " + base.ToString() +
          " (the outcome is unknown and the word could not be read again: the chunk stays "
          "leased; " +
          s.ToString() + ")");
    }
    if (EntryState(now) == kOpen && EntryClass(now) == c && EntryGen(now) == EntryGen(open)) {
      return now;  // landed: our counts are in it
    }
    return give_back(prev.status());
  }
}

Status Recycler::Return(const Access& access, LockOwner& owner, size_t si, int c,
                        std::span<const uint64_t> objects) {
  if (objects.empty()) return Status::Ok();
  const Server& sv = servers_[si];
  const Slab slab = SlabOf(sv.chunk_size, c);
  struct Give {
    std::map<uint64_t, uint64_t> masks;  // bitmap word -> bits
    uint64_t count = 0, previous = 0;
  };
  std::map<uint64_t, Give> chunks;
  for (uint64_t raw : objects) {
    const GlobalAddress a = GlobalAddress::FromRaw(raw);
    const uint64_t rel = a.offset() - RegionGeometry::kRootAreaSize;
    const uint64_t chunk = rel / sv.chunk_size, in = rel % sv.chunk_size;
    if (a.offset() < RegionGeometry::kRootAreaSize || chunk >= sv.chunks ||
        in < slab.bitmap_bytes || (in - slab.bitmap_bytes) % ClassBytes(c) != 0) {
      return Status::InvalidArgument("Free of " + a.ToString() + ": not a slot of class " +
                                     std::to_string(ClassBytes(c)) + " B");
    }
    const uint64_t slot = (in - slab.bitmap_bytes) / ClassBytes(c);
    Give& g = chunks[chunk];
    g.masks[slot / 64] |= uint64_t{1} << (slot % 64);
    ++g.count;
  }
  FARPOOL_RETURN_IF_ERROR(owner.CheckLease());
  {
    // Bits first, then (after the fence) the counts that cover them.
    Access::Batch b(access);
    size_t words = 0;
    for (const auto& [chunk, g] : chunks) words += g.masks.size();
    std::vector<uint64_t> unused(words);  // the bitmap words' previous values
    size_t w = 0;
    for (const auto& [chunk, g] : chunks) {
      for (const auto& [word, mask] : g.masks) {
        FARPOOL_RETURN_IF_ERROR(b.Faa(ChunkBase(si, chunk) + word * 8, -mask, &unused[w++]));
      }
    }
    FARPOOL_RETURN_IF_ERROR(b.Fence());
    for (auto& [chunk, g] : chunks) {
      FARPOOL_RETURN_IF_ERROR(b.Faa(sv.dir + chunk * 8, -g.count, &g.previous));
    }
    FARPOOL_RETURN_IF_ERROR(b.Wait());
  }
  Status first;
  for (const auto& [chunk, g] : chunks) {
    if (EntryState(g.previous) != kOpen || EntryLive(g.previous) != g.count) continue;
    // We emptied it: withdraw it (unless a reserver got in first) and give it back.
    const uint64_t empty = g.previous - g.count;
    auto prev = access.Cas(sv.dir + chunk * 8, empty, Entry(kWithdrawn, c, EntryGen(empty), 0));
    if (!prev.ok()) {
      if (first.ok()) first = prev.status();
      continue;
    }
    if (*prev != empty) continue;
    Status released = memory_.ReleaseRun(ChunkBase(si, chunk), sv.chunk_size);
    if (released.ok()) {
      ++stats_.chunks_released;
    } else if (first.ok()) {
      first = released.WithContext("releasing an emptied slab chunk (it stays leased)");
    }
  }
  return first;
}

Status Recycler::ReserveChunk(const Access& access, LockOwner& owner, uint16_t server,
                              uint64_t size, std::vector<GlobalAddress>* objects) {
  const int c = ClassOf(size);
  FARPOOL_ASSIGN_OR_RETURN(size_t si, IndexOf(server));
  const Server& sv = servers_[si];
  if (!IsSlabClass(si, c)) {
    return Status::InvalidArgument("recycler: objects of " + std::to_string(size) +
                                   " bytes do not fit a slab chunk of server " +
                                   std::to_string(server));
  }
  const Slab slab = SlabOf(sv.chunk_size, c);
  FARPOOL_ASSIGN_OR_RETURN(GlobalAddress base, memory_.LeaseRun(sv.id, sv.chunk_size));
  FARPOOL_RETURN_IF_ERROR(Publish(access, owner, si, c, base, slab.slots).status());
  for (uint64_t i = 0; i < slab.slots; ++i)
    objects->push_back(base + slab.bitmap_bytes + i * ClassBytes(c));
  std::lock_guard<std::mutex> l(mu_);
  ++stats_.chunks_opened;
  stats_.fresh += slab.slots;
  return Status::Ok();
}

Status Recycler::FreeMany(const Access& access, LockOwner& owner, uint64_t size,
                          std::span<const GlobalAddress> objects) {
  const int c = ClassOf(size);
  std::map<size_t, std::vector<uint64_t>> by_server;
  for (GlobalAddress a : objects) {
    FARPOOL_ASSIGN_OR_RETURN(size_t si, IndexOf(a.server()));
    if (!IsSlabClass(si, c)) {
      FARPOOL_RETURN_IF_ERROR(Free(access, owner, a, size));
      continue;
    }
    by_server[si].push_back(a.raw());
  }
  std::lock_guard<std::mutex> l(mu_);
  Status first;
  for (const auto& [si, raw] : by_server) {
    Status s = Return(access, owner, si, c, raw);
    stats_.freed += raw.size();
    if (first.ok()) first = s;
  }
  return first;
}

Status Recycler::Free(const Access& access, LockOwner& owner, GlobalAddress address,
                      uint64_t size) {
  RoundTripScope cause(RoundTripCause::kAllocator);
  if (address.is_null()) return Status::InvalidArgument("Free of the null address");
  const int c = ClassOf(size);
  FARPOOL_ASSIGN_OR_RETURN(size_t si, IndexOf(address.server()));
  if (!IsSlabClass(si, c)) {
    const uint64_t chunk = servers_[si].chunk_size;
    FARPOOL_RETURN_IF_ERROR(memory_.ReleaseRun(address, (size + chunk - 1) / chunk * chunk));
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.freed;
    return Status::Ok();
  }
  std::lock_guard<std::mutex> l(mu_);
  Cache& cache = caches_[si * kClasses + c];
  cache.objects.push_back(address.raw());
  ++cache.freed_on_top;
  ++stats_.freed;
  // Up to two reservations' worth stay here for reuse; the older half of the rest goes back.
  if (cache.objects.size() > 2 * Want(c)) {
    const size_t n = cache.objects.size() - Want(c);
    Status s = Return(access, owner, si, c, std::span(cache.objects).first(n));
    // Returned or not (a failure after the batch cannot tell which), they are not ours now.
    cache.objects.erase(cache.objects.begin(), cache.objects.begin() + n);
    cache.freed_on_top = std::min<uint64_t>(cache.freed_on_top, cache.objects.size());
    return s;
  }
  return Status::Ok();
}

Status Recycler::ReturnIdle(const Access& access, LockOwner& owner) {
  RoundTripScope cause(RoundTripCause::kAllocator);
  std::lock_guard<std::mutex> l(mu_);
  Status first;
  for (size_t i = 0; i < caches_.size(); ++i) {
    Cache& cache = caches_[i];
    if (!cache.used && !cache.objects.empty()) {
      Status s = Return(access, owner, i / kClasses, int(i % kClasses), cache.objects);
      cache.objects.clear();
      cache.freed_on_top = 0;
      if (first.ok()) first = s;
    }
    cache.used = false;
  }
  return first;
}

Status Recycler::Flush(const Access& access, LockOwner& owner) {
  RoundTripScope cause(RoundTripCause::kAllocator);
  std::lock_guard<std::mutex> l(mu_);
  Status first;
  for (size_t i = 0; i < caches_.size(); ++i) {
    Cache& cache = caches_[i];
    Status s = Return(access, owner, i / kClasses, int(i % kClasses), cache.objects);
    cache.objects.clear();
    cache.freed_on_top = 0;
    if (first.ok()) first = s;
  }
  return first;
}

// ================================================================ versions and blobs

Status NamDatabase::FreeBlobs(const Access& access, LockOwner& owner, const NamTable& t,
                              const unsigned char* payload) {
  for (const auto& [blob, size] : BlobRefs(t, payload)) {
    FARPOOL_RETURN_IF_ERROR(recycler_->Free(access, owner, blob, size));
    ++gc_.blobs_freed;
  }
  return Status::Ok();
}

void NamDatabase::RetireChain(const NamTable* t, GlobalAddress chain) {
  ++gc_.chains_cut;
  std::lock_guard<std::mutex> l(retire_mu_);
  retired_.push_back({t, chain});
}

// Frees the nodes of a chain nobody can reach any more, with their versions' blobs.
static Status FreeChain(NamDatabase& db, const Access& access, LockOwner& owner, const NamTable& t,
                        GlobalAddress at) {
  std::vector<unsigned char> node(t.layout_.cell_size());
  while (!at.is_null()) {
    FARPOOL_RETURN_IF_ERROR(access.Read(at, node.data(), node.size()));
    const CellView c = DecodeCell(node.data(), t.layout_);
    if (!c.valid) {
      return Status::Internal("version node " + at.ToString() + " of table '" + t.name_ +
                              "' fails its checksum while being freed");
    }
    FARPOOL_RETURN_IF_ERROR(db.FreeBlobs(access, owner, t, c.payload));
    FARPOOL_RETURN_IF_ERROR(db.recycler().Free(access, owner, at, t.layout_.cell_size()));
    ++db.gc_.nodes_freed;
    at = GlobalAddress::FromRaw(c.chain);
  }
  return Status::Ok();
}

void NamDatabase::QueueRemoval(const NamTable* t, GlobalAddress record, int64_t key, uint64_t seq,
                               uint64_t stamp) {
  std::lock_guard<std::mutex> l(retire_mu_);
  removals_.push_back({t, record, key, seq, stamp});
}

// Removing a deleted record, once every snapshot sees the deletion (LWM >= its stamp):
//   1. lock it (CAS from the tombstone's unlocked word; a failure means it was written again:
//      nothing to do — a later deletion queues it anew) and check it holds that tombstone;
//   2. mark it removed (CAS to kRemovedLock): the one atomic step that decides. Readers and
//      writers that reach it (from an index or a session's cache) see it is gone;
//   3. free its versions' blobs and chain (nobody can read them any more);
//   4. unlink it from the B+tree and the hash index. A remover that dies before this leaves
//      entries naming a removed record; whoever meets one finishes the unlinking
//      (NamSession::HelpUnlink) and such a record is never freed (a bounded leak);
//   5. after the batch, bump the removal epoch in the counter word (sessions drop cached
//      addresses at their next Begin) and free the record's memory once the LWM passes that
//      stamp, when no transaction that could hold the address is left.
Result<bool> NamDatabase::RemoveRecord(const Access& access, NamSession& me, const NamTable& t,
                                       GlobalAddress record, int64_t key, uint64_t seq,
                                       uint64_t stamp, bool* unlinked) {
  *unlinked = false;
  FARPOOL_RETURN_IF_ERROR(me.CheckLease());
  FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(record, UnlockedWord(seq), me.lock_word()));
  if (prev != UnlockedWord(seq)) return false;
  RecordImage img;
  img.bytes.resize(t.layout_.record_size());
  Status s = access.Read(record, img.bytes.data(), img.bytes.size());
  if (s.ok()) {
    img.Decode(t.layout_);
    // The stamp too: the memory of a record removed by someone else may hold this key's
    // record again by now, at the same version.
    if (img.torn || !CellsConsecutive(img) || img.newest_seq() != seq || img.key != key ||
        !(img.cells[img.newest].flags & kFlagDeleted) || img.cells[img.newest].stamp != stamp) {
      (void)access.Cas(record, me.lock_word(), UnlockedWord(seq));
      return false;
    }
  }
  if (s.ok()) s = me.CheckLease();
  if (!s.ok()) {
    (void)access.Cas(record, me.lock_word(), UnlockedWord(seq));
    return s;
  }
  FARPOOL_ASSIGN_OR_RETURN(prev, access.Cas(record, me.lock_word(), kRemovedLock));
  if (prev != me.lock_word()) {
    return Status::Unavailable("removing key " + std::to_string(key) + " of '" + t.name_ +
                               "': this process's lease was lost");
  }
  ++gc_.records_removed;
  for (const CellView& c : img.cells) {
    if (!c.empty()) FARPOOL_RETURN_IF_ERROR(FreeBlobs(access, me, t, c.payload));
  }
  FARPOOL_RETURN_IF_ERROR(
      FreeChain(*this, access, me, t, GlobalAddress::FromRaw(img.cells[img.newest].chain)));
  if (t.btree_) FARPOOL_RETURN_IF_ERROR(t.btree_->Remove(access, me, key, record.raw()));
  FARPOOL_RETURN_IF_ERROR(t.hash_->Remove(access, me, key, record));
  *unlinked = true;
  return true;
}

Result<bool> NamDatabase::TableLive(const Access& access, const NamTable& t) {
  uint64_t words[2];
  FARPOOL_RETURN_IF_ERROR(access.Read(t.desc_, words, 16));
  return words[0] == kDescLive && words[1] == t.incarnation_;
}

Status NamDatabase::ReclaimRetired(const Access& access) {
  std::lock_guard<std::mutex> reclaiming(reclaim_mu_);
  {
    std::lock_guard<std::mutex> l(retire_mu_);
    if (retired_.empty() && drop_queue_.empty() && removals_.empty() && unlinked_.empty()) {
      return Status::Ok();
    }
  }
  // The lock owner of this pass (taken before the work, which stays queued if there is none).
  FARPOOL_ASSIGN_OR_RETURN(std::shared_ptr<NamSession> sys, System());
  NamSession& me = *sys;
  std::deque<Retired> chains;
  std::vector<DropWait> tables;
  std::vector<Removal> removals;
  std::vector<Unlinked> unreachable;
  const uint64_t lwm_now = lwm();
  {
    std::lock_guard<std::mutex> l(retire_mu_);
    chains.swap(retired_);
    while (!drop_queue_.empty() && drop_queue_.front().stamp <= lwm_now) {
      tables.push_back(drop_queue_.front());
      drop_queue_.pop_front();
    }
    // Deletions commit roughly in stamp order per process; take those every snapshot sees.
    for (auto it = removals_.begin(); it != removals_.end();) {
      if (it->stamp <= lwm_now) {
        removals.push_back(*it);
        it = removals_.erase(it);
      } else {
        ++it;
      }
    }
    while (!unlinked_.empty() && unlinked_.front().stamp <= lwm_now) {
      unreachable.push_back(unlinked_.front());
      unlinked_.pop_front();
    }
  }
  Status first;
  auto note = [&](const Status& s) {
    if (!s.ok() && first.ok()) first = s;
  };
  for (const Retired& r : chains) note(FreeChain(*this, access, me, *r.table, r.chain));
  for (const Unlinked& u : unreachable) note(recycler_->Free(access, me, u.record, u.size));
  std::vector<Unlinked> unlinked;
  // This pass reads records and frees what hangs off them: it holds a snapshot announcement
  // meanwhile, so that no table it works on is reclaimed under it (a drop after the
  // announcement waits for it; a drop before it is seen by TableLive).
  const bool announced = !removals.empty() && me.TakeSnapshot().ok();
  if (!announced && !removals.empty()) {
    // Not now: the deletions wait for the next pass.
    std::lock_guard<std::mutex> l(retire_mu_);
    removals_.insert(removals_.end(), removals.begin(), removals.end());
    removals.clear();
  }
  std::map<const NamTable*, bool> live;
  for (const Removal& r : removals) {
    auto it = live.find(r.table);
    if (it == live.end()) {
      auto l = TableLive(access, *r.table);
      if (!l.ok()) {
        note(l.status());
        continue;
      }
      it = live.emplace(r.table, *l).first;
    }
    if (!it->second) continue;  // dropped: the table's reclamation frees the record
    bool done = false;
    auto removed = RemoveRecord(access, me, *r.table, r.record, r.key, r.seq, r.stamp, &done);
    if (!removed.ok()) note(removed.status());
    if (done) unlinked.push_back({r.record, r.table->layout_.record_size(), 0});
  }
  if (announced) me.EndTransaction(/*withdraw=*/true);
  if (!unlinked.empty()) {
    auto word = access.Faa(RootField(kRootCounter), kRemovalStep);
    if (word.ok()) {
      const uint64_t stamp = CounterOf(*word) + 1;
      NoteCounter(stamp);
      std::lock_guard<std::mutex> l(retire_mu_);
      for (Unlinked& u : unlinked) {
        u.stamp = stamp;
        unlinked_.push_back(u);
      }
    } else {
      note(word.status());  // the records stay marked removed; their memory leaks
    }
  }
  for (const DropWait& d : tables) {
    // The job is ours unless another process adopted it (it found the reclaimer word dead:
    // ours, after our system session was fenced and replaced).
    auto prev = access.Cas(d.table->desc_ + kDescReclaimer, d.word, kReclaimStarted);
    if (!prev.ok()) {
      note(prev.status());
      std::lock_guard<std::mutex> l(retire_mu_);
      drop_queue_.push_back(d);  // nothing started: try again next pass
      continue;
    }
    if (*prev == d.word) note(ReclaimTable(access, me, *d.table));
  }
  return first;
}

Status NamDatabase::ReturnIdleMemory(const Access& access) {
  std::lock_guard<std::mutex> reclaiming(reclaim_mu_);
  FARPOOL_ASSIGN_OR_RETURN(std::shared_ptr<NamSession> sys, System());
  return recycler_->ReturnIdle(access, *sys);
}

void NamDatabase::ScheduleSweep(uint64_t counter) {
  std::lock_guard<std::mutex> l(retire_mu_);
  sweep_at_ = std::max(sweep_at_, counter);
}

// The sweep after a death (nam_internal.h). It runs once the LWM has passed the counter at
// the death, so every tombstone the dead process committed is visible to every snapshot and
// every drop it made is older than every snapshot. Its cost is a read of the catalog and of
// every record of every table (only after a session died). What it cannot find: chains the
// dead process had cut and records it had unlinked but not freed yet (nothing points at them
// any more), its recycler cache, and a table whose reclamation it had begun.
Status NamDatabase::SweepOrphans(const Access& access) {
  std::lock_guard<std::mutex> reclaiming(reclaim_mu_);
  uint64_t at;
  {
    std::lock_guard<std::mutex> l(retire_mu_);
    if (sweep_at_ == 0 || lwm() < sweep_at_) return Status::Ok();
    at = std::exchange(sweep_at_, 0);
  }
  auto sys = System();
  Status s = sys.ok() ? AdoptDroppedTables(access, **sys) : sys.status();
  if (s.ok()) s = QueueTombstones(access);
  if (!s.ok()) ScheduleSweep(at);  // again next pass
  return s;
}

// A dropped table (or one a dead loader was loading, kDescLoading) whose reclaimer word names a
// dead session: CAS it to our word (exactly one
// process wins) and reclaim it once the LWM passes the counter now (it was dropped before, so
// this only waits for snapshots that began since).
Status NamDatabase::AdoptDroppedTables(const Access& access, NamSession& me) {
  std::vector<unsigned char> area(kMaxTables * kDescSize);
  FARPOOL_RETURN_IF_ERROR(
      access.Read(GlobalAddress::FromRaw(root_.tables), area.data(), area.size()));
  uint64_t word;
  FARPOOL_RETURN_IF_ERROR(access.Read(RootField(kRootCounter), &word, 8));
  const uint64_t stamp = CounterOf(word);
  for (uint32_t i = 0; i < kMaxTables; ++i) {
    TableDesc d;
    std::memcpy(&d, area.data() + i * kDescSize, sizeof(d));
    if ((d.state != kDescDropped && d.state != kDescLoading) || !IsLocked(d.reclaimer)) continue;
    FARPOOL_ASSIGN_OR_RETURN(bool dead, me.HolderDead(d.reclaimer));
    if (!dead) continue;
    FARPOOL_ASSIGN_OR_RETURN(auto t, MakeTable(i, d));
    FARPOOL_RETURN_IF_ERROR(me.CheckLease());
    FARPOOL_ASSIGN_OR_RETURN(uint64_t prev,
                             access.Cas(t->desc_ + kDescReclaimer, d.reclaimer, me.lock_word()));
    if (prev != d.reclaimer) continue;  // someone else adopted it first
    const NamTable* adopted = t.get();
    {
      std::lock_guard<std::mutex> l(mu_);
      dropped_.push_back(std::move(t));
    }
    std::lock_guard<std::mutex> l(retire_mu_);
    drop_queue_.push_back({adopted, stamp, me.lock_word()});
  }
  return Status::Ok();
}

// Every unlocked record whose newest version is a tombstone that all snapshots see goes to the
// removal queue (RemoveRecord checks it again under its lock, so a record that a live process
// removes at the same time is removed once).
Status NamDatabase::QueueTombstones(const Access& access) {
  FARPOOL_RETURN_IF_ERROR(LoadTables(access));
  std::vector<const NamTable*> tables;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& [name, t] : tables_) tables.push_back(t.get());
  }
  const uint64_t lwm_now = lwm();
  constexpr size_t kBatch = 256;
  for (const NamTable* t : tables) {
    std::vector<std::pair<int64_t, GlobalAddress>> entries;
    FARPOOL_RETURN_IF_ERROR(t->hash_->ForEach(access, [&](int64_t key, GlobalAddress rec) {
      entries.push_back({key, rec});
      return Status::Ok();
    }));
    std::vector<RecordImage> images(kBatch);
    for (size_t first = 0; first < entries.size(); first += kBatch) {
      const size_t n = std::min(kBatch, entries.size() - first);
      Access::Batch b(access);
      for (size_t i = 0; i < n; ++i) {
        images[i].bytes.resize(t->layout_.record_size());
        FARPOOL_RETURN_IF_ERROR(
            b.Read(entries[first + i].second, images[i].bytes.data(), images[i].bytes.size()));
      }
      FARPOOL_RETURN_IF_ERROR(b.Wait());
      for (size_t i = 0; i < n; ++i) {
        RecordImage& img = images[i];
        img.Decode(t->layout_);
        const auto [key, rec] = entries[first + i];
        if (img.key != key || !ConsistentImage(img) || img.newest < 0) continue;
        const CellView& c = img.cells[img.newest];
        if ((c.flags & kFlagDeleted) && c.stamp <= lwm_now) {
          QueueRemoval(t, rec, key, img.newest_seq(), c.stamp);
        }
      }
    }
  }
  return Status::Ok();
}

// Every record of a dropped table, its versions and their blobs go back to the recycler, then
// the descriptor becomes free for a new table. Each record is claimed by one CAS from its
// unlocked word to kRemovedLock first, so that a concurrent removal (RemoveRecord) and this
// never both free it; a record left locked by a transaction that will abort is waited for
// (bounded; else it leaks). Then the B+tree's nodes and the hash index's buckets go back too
// (they came from the recycler: NamSession::AllocObject). Nothing reaches them any more: every
// snapshot from before the drop has ended (the LWM passed the drop's stamp), and no
// transaction uses a dropped table (Database::DropTable's contract).
Status NamDatabase::ReclaimTable(const Access& access, NamSession& me, const NamTable& t) {
  std::vector<GlobalAddress> records;
  FARPOOL_RETURN_IF_ERROR(t.hash_->ForEach(access, [&](int64_t, GlobalAddress rec) -> Status {
    records.push_back(rec);
    return Status::Ok();
  }));
  RecordImage img;
  img.bytes.resize(t.layout_.record_size());
  for (GlobalAddress rec : records) {
    Hook("gc.table-record");
    bool claimed = false;
    for (int tries = 0; tries < 1000 && !claimed; ++tries) {
      FARPOOL_RETURN_IF_ERROR(access.Read(rec, img.bytes.data(), img.bytes.size()));
      img.Decode(t.layout_);
      if (img.lock == kRemovedLock) break;  // a removal owns it
      if (IsLocked(img.lock)) {
        FARPOOL_ASSIGN_OR_RETURN(bool dead, me.HolderDead(img.lock));
        if (dead) FARPOOL_RETURN_IF_ERROR(BreakRecordLock(access, rec, t, img.lock));
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      if (!ConsistentImage(img)) continue;
      FARPOOL_RETURN_IF_ERROR(me.CheckLease());
      FARPOOL_ASSIGN_OR_RETURN(uint64_t prev, access.Cas(rec, img.lock, kRemovedLock));
      claimed = prev == img.lock;
    }
    if (!claimed) continue;
    for (const CellView& c : img.cells) {
      if (!c.empty()) FARPOOL_RETURN_IF_ERROR(FreeBlobs(access, me, t, c.payload));
    }
    if (img.newest >= 0) {
      FARPOOL_RETURN_IF_ERROR(
          FreeChain(*this, access, me, t, GlobalAddress::FromRaw(img.cells[img.newest].chain)));
    }
    FARPOOL_RETURN_IF_ERROR(recycler_->Free(access, me, rec, t.layout_.record_size()));
  }
  if (t.btree_) FARPOOL_RETURN_IF_ERROR(t.btree_->Destroy(access, me));
  FARPOOL_RETURN_IF_ERROR(t.hash_->Destroy(access, me));
  uint64_t empty = kDescEmpty;
  FARPOOL_RETURN_IF_ERROR(me.CheckLease());
  FARPOOL_RETURN_IF_ERROR(access.Write(t.desc_, &empty, 8));
  ++gc_.tables_reclaimed;
  return Status::Ok();
}

}  // namespace farpool::db
