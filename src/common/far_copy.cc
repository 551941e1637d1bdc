// far_copy.h: word-atomic copies under ThreadSanitizer, memcpy otherwise.
#include "common/far_copy.h"

#include <atomic>
#include <cstring>

namespace farpool {
namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool kWordAtomicCopies = true;
#else
constexpr bool kWordAtomicCopies = false;
#endif

// Copies `size` bytes; `far_src` (a read) or `far_dst` (a write) says which side is shared.
void CopyWords(std::byte* dst, const std::byte* src, uint64_t size, bool far_src) {
  uint64_t i = 0;
  auto copy_byte = [&](uint64_t k) {
    if (far_src) {
      dst[k] = std::atomic_ref<std::byte>(const_cast<std::byte&>(src[k]))
                   .load(std::memory_order_relaxed);
    } else {
      std::atomic_ref<std::byte>(dst[k]).store(src[k], std::memory_order_relaxed);
    }
  };
  const std::byte* far = far_src ? src : dst;
  for (; i < size && reinterpret_cast<uintptr_t>(far + i) % 8 != 0; ++i) copy_byte(i);
  for (; i + 8 <= size; i += 8) {
    uint64_t w;
    if (far_src) {
      w = std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(const_cast<std::byte*>(src + i)))
              .load(std::memory_order_relaxed);
      std::memcpy(dst + i, &w, 8);
    } else {
      std::memcpy(&w, src + i, 8);
      std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(dst + i))
          .store(w, std::memory_order_relaxed);
    }
  }
  for (; i < size; ++i) copy_byte(i);
}

}  // namespace

void FarRead(void* dst, const std::byte* src, uint64_t size) {
  std::atomic_thread_fence(std::memory_order_acquire);
  if constexpr (kWordAtomicCopies) {
    CopyWords(static_cast<std::byte*>(dst), src, size, /*far_src=*/true);
  } else {
    std::memcpy(dst, src, size);
  }
}
void FarWrite(std::byte* dst, const void* src, uint64_t size) {
  if constexpr (kWordAtomicCopies) {
    CopyWords(dst, static_cast<const std::byte*>(src), size, /*far_src=*/false);
  } else {
    std::memcpy(dst, src, size);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

}  // namespace farpool
