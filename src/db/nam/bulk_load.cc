// The bulk loader of the NAM engines (Database::NewLoader; the contract is db.h's Loader).
//
// How it works:
//   NewLoader  claims a session slot for the load, takes the rows' commit stamp (one
//              fetch-and-add of the counter) and creates the table's descriptor in state
//              kDescLoading, its reclaimer word the loader session's lock word: no process
//              opens it (only kDescLive tables are), so nobody can reach what the load writes.
//   Add        builds the row's record image (lock word "unlocked, newest version 1", the
//              key, cell 1 holding version 1 with the stamp; the other cells empty) in a slot
//              of a slab chunk that the loader leased whole (Recycler::ReserveChunk), on the
//              server of the key's head bucket, so consecutive rows of a server lie side by
//              side. Blobs of kBytes columns go next to their record the same way.
//   Flush      (every kFlushRows rows per server, and at Finish) one batch: the objects of each
//              server in writes of up to kMaxRun bytes (adjacent slots merged), a fence, then
//              each row's hash index entry inserted near memory (HashIndex::PostInsert: the
//              record is whole before its entry goes live). One round trip for all servers;
//              a chain the server could not extend (full, or leaving the server) is inserted
//              one-sided afterwards (GetOrInsertMany). An entry found instead of ours is a
//              duplicate key.
//   Finish     flushes, builds the B+tree of an ordered table bottom-up from the sorted keys
//              (BTree::BuildSorted), gives the unused slots back, and publishes the table
//              under the DDL lock: CAS of the reclaimer word from the loader's word (so a GC
//              that adopted the load of a session it judged dead and a publish never both
//              happen), then the state word kDescLive: the one write that makes table and rows
//              visible.
// Crashes: a dead loader's descriptor is adopted by the garbage collector of another process
// once its session is fenced (AdoptDroppedTables takes kDescLoading tables as dropped ones)
// and reclaimed from its hash index: every record flushed is there. What it cannot find (the
// batch in flight, the loader's unused slots, B+tree nodes of an unpublished build) leaks.
// An abandoned load (an error, the loader destroyed unfinished) is queued for reclamation at
// once (AbandonLoad).
#include <algorithm>
#include <cstring>
#include <map>

#include "db/nam/nam_internal.h"
#include "db/row_access.h"

namespace farpool::db {
namespace {

// Rows per memory server between two flushes (one round trip; over TCP messages of up to
// 64 KiB, a few hundred rows each). Measured at scale 10 over TCP: 1024 loads in 2.4-2.5 s
// what 256 loads in 2.8-4.1 s.
constexpr size_t kFlushRows = 1024;
// Adjacent objects are merged into writes of at most this many bytes (the pool's largest
// write carried inside a message; larger ones take the one-sided path).
constexpr uint64_t kMaxRun = 16 << 10;

class NamLoader final : public Loader {
 public:
  NamLoader(NamDatabase& db, std::unique_ptr<NamSession> session, std::unique_ptr<NamTable> table,
            uint64_t stamp)
      : db_(db), s_(std::move(session)), t_(std::move(table)), name_(t_->name_), stamp_(stamp) {
    for (uint16_t id : db_.memory().servers()) servers_[id];
  }
  ~NamLoader() override {
    if (!done_) (void)Fail(Status::Aborted("loader destroyed before Finish"));
  }

  Status Add(int64_t key, const Row& row) override;
  Result<const Table*> Finish() override;
  uint64_t rows() const override { return rows_; }

 private:
  // An object to write: its address and its bytes, padded to its slot (so that the objects of
  // adjacent slots are adjacent bytes).
  struct Object {
    GlobalAddress at;
    std::string bytes;
  };
  struct Pending {
    int64_t key;
    GlobalAddress record;
    InsertResult inserted;
  };
  // Slots reserved from whole chunks and not used yet, per class size: [next, objects.end()).
  struct Slots {
    std::vector<GlobalAddress> objects;
    size_t next = 0;
  };
  struct Server {
    std::map<uint64_t, Slots> free;  // by slot size
    std::vector<Object> objects;
    std::vector<Pending> pending;
  };

  // An object of `size` bytes on server `id`: the next reserved slot of its class (a new
  // whole chunk when there is none), or a run of its own for a size no slab class holds.
  Result<GlobalAddress> Take(uint16_t id, uint64_t size, uint64_t* slot);
  Status Flush();
  // Abandons the load: gives back the unused slots, hands the table to the GC. Returns `s`.
  Status Fail(Status s);
  // Gives the unused reserved slots back to the recycler.
  Status ReturnSlots();
  std::string Where() const { return "loading table '" + name_ + "'"; }

  NamDatabase& db_;
  std::unique_ptr<NamSession> s_;
  std::unique_ptr<NamTable> t_;  // null once abandoned (AbandonLoad has it)
  const std::string name_;
  const uint64_t stamp_;
  std::map<uint16_t, Server> servers_;
  size_t pending_ = 0;
  std::vector<std::pair<int64_t, uint64_t>> sorted_;  // ordered tables: key -> record
  uint64_t rows_ = 0;
  bool done_ = false;
};

Result<GlobalAddress> NamLoader::Take(uint16_t id, uint64_t size, uint64_t* slot) {
  *slot = Recycler::SlotBytes(size);
  Slots& f = servers_[id].free[*slot];
  if (f.next == f.objects.size()) {
    f.objects.clear();
    f.next = 0;
    Status s = db_.recycler().ReserveChunk(s_->access_, *s_, id, size, &f.objects);
    if (s.code() == StatusCode::kInvalidArgument) {  // too big for a slab chunk
      *slot = size;
      return db_.recycler().Alloc(s_->access_, *s_, size, Placement::OnServer(id));
    }
    FARPOOL_RETURN_IF_ERROR(s.WithContext(Where()));
  }
  return f.objects[f.next++];
}

Status NamLoader::Add(int64_t key, const Row& row) {
  if (done_) return Status::InvalidArgument(Where() + ": the loader is finished");
  Status s = CheckLoadRow(t_->schema_, t_->name_, key, row);
  if (!s.ok()) return Fail(s);
  const RecordLayout& layout = t_->layout_;
  const uint16_t id = t_->hash_->HeadServer(key);
  Server& sv = servers_[id];
  std::string payload = RowAccess::payload(row);
  payload.resize(layout.payload, '\0');
  const std::vector<std::string>& bytes = RowAccess::bytes(row);
  for (uint32_t c : t_->bytes_columns_) {
    uint64_t ref[2] = {0, c < bytes.size() ? bytes[c].size() : 0};
    if (ref[1] > 0) {
      uint64_t slot;
      auto blob = Take(id, ref[1], &slot);
      if (!blob.ok()) return Fail(blob.status());
      ref[0] = blob->raw();
      std::string image(bytes[c]);
      image.resize(std::max(slot, ref[1]), '\0');
      sv.objects.push_back({*blob, std::move(image)});
    }
    std::memcpy(payload.data() + t_->schema_.Offset(c), ref, 16);
  }
  uint64_t slot;
  auto record = Take(id, layout.record_size(), &slot);
  if (!record.ok()) return Fail(record.status());
  std::string image(std::max(slot, layout.record_size()), '\0');
  auto* p = reinterpret_cast<unsigned char*>(image.data());
  const uint64_t lock = UnlockedWord(1);
  std::memcpy(p, &lock, 8);
  std::memcpy(p + 8, &key, 8);
  EncodeCell(p + layout.cell_offset(1), layout, stamp_, /*seq=*/1, /*flags=*/0, /*chain=*/0,
             payload.data());
  sv.objects.push_back({*record, std::move(image)});
  sv.pending.push_back({key, *record, {}});
  if (t_->btree_) sorted_.push_back({key, record->raw()});
  ++rows_;
  if (++pending_ >= kFlushRows * servers_.size()) {
    s = Flush();
    if (!s.ok()) return Fail(s);
  }
  return Status::Ok();
}

Status NamLoader::Flush() {
  if (pending_ == 0) return Status::Ok();
  const Access& access = s_->access_;
  FARPOOL_RETURN_IF_ERROR(s_->CheckLease());
  // Taken out of servers_ first: once anything is posted, the rows may be live in the index,
  // where the GC finds them, and must not be freed by Fail.
  std::vector<std::vector<Object>> objects;
  std::vector<Pending> pending;
  for (auto& [id, sv] : servers_) {
    objects.push_back(std::move(sv.objects));
    sv.objects.clear();
    pending.insert(pending.end(), sv.pending.begin(), sv.pending.end());
    sv.pending.clear();
  }
  pending_ = 0;
  {
    Access::Batch b(access);
    for (std::vector<Object>& objs : objects) {
      std::sort(objs.begin(), objs.end(),
                [](const Object& x, const Object& y) { return x.at < y.at; });
      for (size_t i = 0; i < objs.size();) {
        std::string& run = objs[i].bytes;  // the run's bytes stay here until the Wait
        size_t j = i + 1;
        for (; j < objs.size() && objs[j].at == objs[i].at + run.size() &&
               run.size() + objs[j].bytes.size() <= kMaxRun;
             ++j) {
          run += objs[j].bytes;
        }
        FARPOOL_RETURN_IF_ERROR(b.Write(objs[i].at, run.data(), run.size()));
        i = j;
      }
    }
    // Every record is whole on its server before its entry can go live there.
    FARPOOL_RETURN_IF_ERROR(b.Fence());
    for (Pending& p : pending)
      FARPOOL_RETURN_IF_ERROR(t_->hash_->PostInsert(b, *s_, p.key, p.record, &p.inserted));
    FARPOOL_RETURN_IF_ERROR(b.Wait());
  }
  std::vector<HashIndex::Insert> late;
  auto check = [&](int64_t key, GlobalAddress ours, GlobalAddress found) -> Status {
    if (found == ours) return Status::Ok();
    // Ours never went live: its slot is ours to give back.
    (void)db_.recycler().Free(access, *s_, ours, t_->layout_.record_size());
    return Status::InvalidArgument(Where() + ": duplicate key " + std::to_string(key));
  };
  for (const Pending& p : pending) {
    FARPOOL_ASSIGN_OR_RETURN(GlobalAddress found, t_->hash_->FinishInsert(p.key, p.inserted));
    if (found.is_null()) {
      late.push_back({&*t_->hash_, p.key, p.record});
    } else {
      FARPOOL_RETURN_IF_ERROR(check(p.key, p.record, found));
    }
  }
  s_->FaultPoint("bulk.flushed");
  if (late.empty()) return Status::Ok();
  // GetOrInsertMany wants distinct keys: a key twice among them is a duplicate anyway.
  std::sort(late.begin(), late.end(), [](const auto& x, const auto& y) { return x.key < y.key; });
  for (size_t i = 1; i < late.size(); ++i) {
    if (late[i].key == late[i - 1].key)
      return check(late[i].key, late[i].record, late[i - 1].record);
  }
  std::vector<GlobalAddress> ours;
  for (const auto& in : late) ours.push_back(in.record);
  FARPOOL_RETURN_IF_ERROR(HashIndex::GetOrInsertMany(access, *s_, late));
  for (size_t i = 0; i < late.size(); ++i)
    FARPOOL_RETURN_IF_ERROR(check(late[i].key, ours[i], late[i].record));
  return Status::Ok();
}

Status NamLoader::ReturnSlots() {
  Status first;
  for (auto& [id, sv] : servers_) {
    for (auto& [slot, f] : sv.free) {
      Status s =
          db_.recycler().FreeMany(s_->access_, *s_, slot, std::span(f.objects).subspan(f.next));
      if (first.ok()) first = s;
      f.objects.clear();
      f.next = 0;
    }
  }
  return first;
}

Status NamLoader::Fail(Status s) {
  if (done_) return s;
  done_ = true;
  // The objects of an unflushed batch are not in the index: the GC cannot find them.
  for (auto& [id, sv] : servers_) {
    for (const Object& o : sv.objects)
      (void)db_.recycler().Free(s_->access_, *s_, o.at, o.bytes.size());
  }
  (void)ReturnSlots();
  db_.AbandonLoad(std::move(t_), s_->lock_word());
  return s;
}

Result<const Table*> NamLoader::Finish() {
  if (done_) return Status::InvalidArgument(Where() + ": the loader is finished");
  Status s = Flush();
  if (s.ok() && t_->btree_) {
    std::sort(sorted_.begin(), sorted_.end());
    s = t_->btree_->BuildSorted(s_->access_, *s_, sorted_);
    sorted_ = {};
    s_->FaultPoint("bulk.built");
  }
  if (s.ok()) s = ReturnSlots();
  if (!s.ok()) return Fail(s);
  auto published = db_.PublishLoaded(*t_, *s_);
  if (!published.ok()) return Fail(published.status());
  done_ = true;
  return published;
}

}  // namespace

Result<std::unique_ptr<Loader>> NamDatabase::NewLoader(const std::string& name,
                                                       const Schema& schema,
                                                       const TableOptions& options) {
  FARPOOL_ASSIGN_OR_RETURN(std::unique_ptr<NamSession> session, OpenSession(access_));
  const Access& access = session->access_;
  // The rows' stamp: every snapshot taken from now on sees them (once the table is live).
  FARPOOL_ASSIGN_OR_RETURN(uint64_t word, access.Faa(RootField(kRootCounter), 1));
  const uint64_t stamp = CounterOf(word) + 1;
  NoteCounter(stamp);
  FARPOOL_ASSIGN_OR_RETURN(
      uint32_t id, NewDescriptor(name, schema, options, kDescLoading, session->lock_word()));
  auto table = ReadTable(access, id);
  if (!table.ok()) {
    // The descriptor is there: the GC frees it once this session is gone.
    return table.status();
  }
  return std::unique_ptr<Loader>(
      std::make_unique<NamLoader>(*this, std::move(session), std::move(*table), stamp));
}

Result<const Table*> NamDatabase::PublishLoaded(const NamTable& t, LockOwner& loader) {
  FARPOOL_ASSIGN_OR_RETURN(std::shared_ptr<NamSession> sys, System());
  const Access& access = sys->access_;
  FARPOOL_RETURN_IF_ERROR(LockDdl(*sys));
  auto body = [&]() -> Status {
    FARPOOL_RETURN_IF_ERROR(LoadTables(access));
    {
      std::lock_guard<std::mutex> l(mu_);
      if (tables_.count(t.name_)) {
        return Status::AlreadyExists("table '" + t.name_ +
                                     "' was created while it was being loaded");
      }
    }
    // The table is ours again (no GC may adopt it from here on), then live.
    FARPOOL_RETURN_IF_ERROR(loader.CheckLease());
    FARPOOL_ASSIGN_OR_RETURN(
        uint64_t prev, access.Cas(t.desc_ + kDescReclaimer, loader.lock_word(), sys->lock_word()));
    if (prev != loader.lock_word()) {
      return Status::Unavailable("loading table '" + t.name_ +
                                 "': the load was taken over by the garbage collector (its "
                                 "session lost its lease)");
    }
    Hook("bulk.publish");
    const uint64_t live = kDescLive;
    FARPOOL_RETURN_IF_ERROR(sys->CheckLease());
    return access.Write(t.desc_, &live, 8);
  };
  Status s = body();
  Status u = UnlockDdl(*sys);
  FARPOOL_RETURN_IF_ERROR(s);
  FARPOOL_RETURN_IF_ERROR(u);
  return OpenTable(t.name_);
}

void NamDatabase::AbandonLoad(std::unique_ptr<NamTable> t, uint64_t loader) {
  auto sys = System();
  if (!sys.ok()) return;  // the load stays ours: the GC adopts it once our session is gone
  // From the loader's word to the system session's (a GC that adopted it first keeps it).
  auto prev = (*sys)->access_.Cas(t->desc_ + kDescReclaimer, loader, (*sys)->lock_word());
  if (!prev.ok() || *prev != loader) return;
  const NamTable* table = t.get();
  {
    std::lock_guard<std::mutex> l(mu_);
    dropped_.push_back(std::move(t));
  }
  std::lock_guard<std::mutex> l(retire_mu_);
  drop_queue_.push_back({table, latest_counter(), (*sys)->lock_word()});
}

}  // namespace farpool::db
