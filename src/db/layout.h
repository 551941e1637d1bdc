// Layouts of the database's structures in memory (pool or local) and the small pure helpers
// that read them. Everything is 8-byte words, little-endian, copied with memcpy.
//
// Record (one per key, never moved; found through the indexes; removed once its deletion is
// visible to every snapshot, see kRemovedLock):
//
//   | lock u64 | key i64 | cell[0] | cell[1] | cell[2] |
//   cell = | stamp u64 | seq u64 | flags u64 | chain u64 | payload (P bytes) | checksum u64 |
//
//   lock   unlocked: newest_seq << 1 (bit 0 clear), so a CAS that expects the version a
//          transaction read both locks the record and proves it unchanged. Locked:
//          slot << 48 | epoch << 1 | 1 (the session that holds it; see LockWord), with bit 47
//          set while it is held by a locking read (ReadLockWord) whose commit has not begun:
//          its holder has taken no stamp yet, so readers need not wait for it (see there).
//   cells  the kCells newest versions; version number `seq` lives in cell seq % kCells, so an
//          unlocked record with newest version n holds exactly n-2, n-1, n (those >= 1).
//          stamp is the commit timestamp (see Stamp), flags bit 0 = deleted (a tombstone),
//          flags >> 8 = how many chain nodes were reachable from `chain` when it was written
//          (a hint that tells a writer when to trim the chain; never used for visibility).
//          chain is the head of the list of versions older than those in the cells: when
//          version S evicts S-kCells, that old cell is copied to a new node whose chain is the
//          previous newest cell's chain, and S's chain points at the node.
//   checksum  over stamp, seq, flags and payload: a reader that copies a cell while its writer
//          overwrites it sees a mismatch and reads again (the pool's reads are not atomic;
//          Pilaf's self-verifying cells). seq == 0 is an empty cell.
//
// Version nodes of the chain have the layout of a cell. Everything but `chain` is immutable
// once linked; `chain` (outside the checksum, one aligned word) may be set to 0 by the holder
// of the record's lock when every version below the node is garbage (a trim).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "farpool/address.h"

namespace farpool::db {

inline constexpr int kCells = 3;
inline constexpr uint64_t kCellHeader = 32;  // stamp, seq, flags, chain
inline constexpr uint64_t kRecordHeader = 16;
inline constexpr uint64_t kFlagDeleted = 1;

inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// A 64-bit hash of `n` bytes (n a multiple of 8); never 0.
inline uint64_t Checksum(const void* data, uint64_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0x243F6A8885A308D3ULL ^ n;
  for (uint64_t i = 0; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ Mix64(w + i)) * 0x9E3779B97F4A7C15ULL;
    h ^= h >> 29;
  }
  return h == 0 ? 1 : h;
}

// ---------------------------------------------------------------- stamps

// Commit timestamps are values of the database's commit counter (fetch-and-add); a snapshot is
// the counter read at Begin and sees exactly the versions with stamp <= snapshot. The counter
// word's top 16 bits count batches of record removals (the removal epoch), so that one read at
// Begin tells a session both its snapshot and whether cached record addresses may be stale.
inline constexpr uint64_t kCounterMask = (uint64_t{1} << 48) - 1;
inline constexpr uint64_t kRemovalStep = (uint64_t{1} << 48) + 1;  // next epoch and a stamp
inline uint64_t CounterOf(uint64_t word) { return word & kCounterMask; }
inline uint64_t RemovalEpochOf(uint64_t word) { return word >> 48; }

// ---------------------------------------------------------------- lock words

inline constexpr uint64_t kEpochMask = (uint64_t{1} << 46) - 1;
inline uint64_t LockWord(uint32_t slot, uint64_t epoch) {
  return (uint64_t{slot} << 48) | ((epoch & kEpochMask) << 1) | 1;
}
inline bool IsLocked(uint64_t word) { return (word & 1) != 0; }
// The lock word of a removed record (a deleted key whose record was unlinked from the indexes;
// its memory is freed once no transaction can still hold its address). It names slot 0xFFFF,
// which no session has, so it is never mistaken for a lock and never broken.
inline constexpr uint64_t kRemovedLock = ~uint64_t{0};
inline uint32_t LockSlot(uint64_t word) { return static_cast<uint32_t>(word >> 48); }
inline uint64_t LockEpoch(uint64_t word) { return (word >> 1) & kEpochMask; }
inline uint64_t UnlockedWord(uint64_t newest_seq) { return newest_seq << 1; }
// A lock taken by a locking read (Transaction::GetForUpdate): the holder's lock word with bit
// 47 set (no epoch reaches it). The holder changes it to its plain lock word by CAS in its
// commit's lock round, before it takes its stamp (CommitRun::Lock), and releases it unchanged
// otherwise. So a reader that read the counter for its snapshot and then met a read lock knows
// that the holder's stamp, if it ever commits, is newer than its snapshot: the versions in the
// cells (whole and consecutive) are what it may read, without waiting. Recovery treats it as
// the lock of an undecided commit (BreakRecordLock: the cells are unchanged); a commit log
// never names a record under a read lock (recovery.cc matches the plain word only).
inline constexpr uint64_t kReadLockBit = uint64_t{1} << 47;
inline uint64_t ReadLockWord(uint64_t lock_word) { return lock_word | kReadLockBit; }
inline bool IsReadLock(uint64_t word) {
  return IsLocked(word) && word != kRemovedLock && (word & kReadLockBit) != 0;
}
inline uint64_t UnlockedSeq(uint64_t word) { return word >> 1; }

// ---------------------------------------------------------------- records

struct RecordLayout {
  uint64_t payload = 0;  // bytes, a multiple of 8
  uint64_t cell_size() const { return kCellHeader + payload + 8; }
  uint64_t record_size() const { return kRecordHeader + kCells * cell_size(); }
  uint64_t cell_offset(uint64_t seq) const { return kRecordHeader + (seq % kCells) * cell_size(); }
};

inline constexpr uint64_t kCellChain = 24;  // offset of `chain` in a cell or node
inline uint64_t ChainLength(uint64_t flags) { return flags >> 8; }
inline uint64_t WithChainLength(uint64_t flags, uint64_t n) { return (flags & 0xff) | (n << 8); }

// The checksum of a cell image: stamp, seq, flags and payload (not chain).
inline uint64_t CellChecksum(const unsigned char* cell, uint64_t payload) {
  return Checksum(cell, 24) ^ Mix64(Checksum(cell + kCellHeader, payload) + 1);
}

// A cell's fields, decoded from an image.
struct CellView {
  uint64_t stamp = 0, seq = 0, flags = 0, chain = 0;
  const unsigned char* payload = nullptr;
  bool valid = false;  // checksum matches (or the cell is empty)
  bool empty() const { return seq == 0; }
};

inline CellView DecodeCell(const unsigned char* cell, const RecordLayout& layout) {
  CellView v;
  std::memcpy(&v.stamp, cell, 8);
  std::memcpy(&v.seq, cell + 8, 8);
  std::memcpy(&v.flags, cell + 16, 8);
  std::memcpy(&v.chain, cell + 24, 8);
  v.payload = cell + kCellHeader;
  uint64_t sum;
  std::memcpy(&sum, cell + kCellHeader + layout.payload, 8);
  if (v.seq == 0) {
    v.valid = true;
  } else {
    v.valid = sum == CellChecksum(cell, layout.payload);
  }
  return v;
}

// Writes a complete cell image (with checksum) into `out` (layout.cell_size() bytes).
inline void EncodeCell(unsigned char* out, const RecordLayout& layout, uint64_t stamp, uint64_t seq,
                       uint64_t flags, uint64_t chain, const void* payload) {
  std::memcpy(out, &stamp, 8);
  std::memcpy(out + 8, &seq, 8);
  std::memcpy(out + 16, &flags, 8);
  std::memcpy(out + 24, &chain, 8);
  std::memcpy(out + kCellHeader, payload, layout.payload);
  uint64_t sum = CellChecksum(out, layout.payload);
  std::memcpy(out + kCellHeader + layout.payload, &sum, 8);
}

// Sets the stamp of a complete cell image, and its checksum: cells are logged before the
// commit's stamp is known (it comes back in the same round trip) and stamped afterwards.
inline void StampCell(unsigned char* cell, const RecordLayout& layout, uint64_t stamp) {
  std::memcpy(cell, &stamp, 8);
  const uint64_t sum = CellChecksum(cell, layout.payload);
  std::memcpy(cell + kCellHeader + layout.payload, &sum, 8);
}

// A decoded copy of a record.
struct RecordImage {
  std::vector<unsigned char> bytes;
  uint64_t lock = 0;
  int64_t key = 0;
  CellView cells[kCells];
  bool torn = false;  // some non-empty cell failed its checksum
  int newest = -1;    // index of the highest-seq cell, -1 if all empty
  uint64_t newest_seq() const { return newest < 0 ? 0 : cells[newest].seq; }

  void Decode(const RecordLayout& layout) {
    std::memcpy(&lock, bytes.data(), 8);
    std::memcpy(&key, bytes.data() + 8, 8);
    torn = false;
    newest = -1;
    for (int i = 0; i < kCells; ++i) {
      cells[i] = DecodeCell(bytes.data() + kRecordHeader + i * layout.cell_size(), layout);
      if (!cells[i].valid) torn = true;
      if (cells[i].valid && !cells[i].empty() && (newest < 0 || cells[i].seq > cells[newest].seq)) {
        newest = i;
      }
    }
  }
};

// True if the cells hold exactly the versions they must for the newest one: cell i holds the
// largest seq <= newest with seq % kCells == i (or is empty if that seq would be < 1). A copy
// taken while commits install can pass every checksum and still mix moments; this catches it.
inline bool CellsConsecutive(const RecordImage& img) {
  const uint64_t n = img.newest_seq();
  for (int i = 0; i < kCells; ++i) {
    const uint64_t back = (n % kCells + kCells - uint64_t(i)) % kCells;
    const uint64_t want = n >= back + 1 ? n - back : 0;
    if (img.cells[i].seq != want) return false;
  }
  return true;
}

// An image a snapshot reader may use: unlocked, every cell whole, cells consecutive, and the
// lock word naming the newest cell's version.
inline bool ConsistentImage(const RecordImage& img) {
  return !img.torn && !IsLocked(img.lock) && UnlockedSeq(img.lock) == img.newest_seq() &&
         CellsConsecutive(img);
}

}  // namespace farpool::db
