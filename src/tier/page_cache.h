// PageCache: byte ranges of one file (a database's pages) kept in this process's memory,
// bounded, the least recently used dropped first. The SQLite VFS keeps one per open database
// and process, across transactions, for as long as the file's data version says nobody else
// wrote (src/tier/sqlite_vfs.cc, docs/files.md "The VFS page cache"); whether the bytes are
// current is the caller's to decide: the cache only stores them.
//
// Ranges are what the caller read or wrote (SQLite reads whole pages); they do not overlap: a
// range put over others replaces them, and a write patches every range it touches.
//
// Thread-safety: none; the VFS calls it under its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <vector>

namespace farpool::tier {

class PageCache {
 public:
  // `capacity`: bytes to keep; the last range put is kept even when it alone is larger.
  explicit PageCache(uint64_t capacity) : capacity_(capacity) {}

  // Copies [offset, offset + n) into `out` if one range holds all of it.
  bool Get(uint64_t offset, void* out, uint64_t n);
  // Keeps `n` bytes read at `offset`, replacing the ranges they overlap.
  void Put(uint64_t offset, const void* data, uint64_t n);
  // The file's bytes [offset, offset + n) are now `data`: every range they touch is patched,
  // and they are kept as a range of their own unless one range held them all.
  void Write(uint64_t offset, const void* data, uint64_t n);
  // Drops every range that reaches `size` or beyond (the file was cut to `size`).
  void Truncate(uint64_t size);
  void Clear();

  void set_capacity(uint64_t capacity);
  uint64_t capacity() const { return capacity_; }
  uint64_t bytes() const { return bytes_; }
  size_t ranges() const { return ranges_.size(); }

 private:
  struct Range {
    std::vector<unsigned char> bytes;
    std::list<uint64_t>::iterator use;  // its place in uses_
  };
  using Ranges = std::map<uint64_t, Range>;
  // The range holding `offset`, or end().
  Ranges::iterator Holding(uint64_t offset);
  Ranges::iterator Erase(Ranges::iterator it);
  // Drops the least recently used ranges until the bytes fit (the most recent one stays).
  void Shrink();

  uint64_t capacity_;
  uint64_t bytes_ = 0;
  Ranges ranges_;             // by offset
  std::list<uint64_t> uses_;  // offsets, most recently used first
};

}  // namespace farpool::tier
