// An offset allocator over one contiguous region [0, size): best fit, with free
// neighbours merged on release. Not thread safe; the master's Space guards it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace ferry::store {

class OffsetAllocator {
 public:
  // Offsets and lengths are multiples of kAlign, so every extent starts aligned.
  static constexpr uint64_t kAlign = 64;
  static uint64_t RoundUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

  explicit OffsetAllocator(uint64_t size);

  // The offset of RoundUp(length) free bytes, or nullopt when no free block is
  // that large. length > 0.
  std::optional<uint64_t> Allocate(uint64_t length);
  // Returns [offset, offset+RoundUp(length)), which Allocate gave out.
  void Free(uint64_t offset, uint64_t length);
  // Takes exactly [offset, offset+RoundUp(length)), as Allocate would have
  // given it: a master rebuilt from its nodes' catalogs claims their objects.
  // False, and nothing taken, unless offset is aligned and all of it is free.
  bool Claim(uint64_t offset, uint64_t length);

  uint64_t size() const { return size_; }
  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t largest_free() const;

 private:
  void Insert(uint64_t offset, uint64_t length);
  void Erase(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t size_;
  uint64_t free_bytes_ = 0;
  std::map<uint64_t, uint64_t> by_offset_;       // offset -> length of each free block
  std::multimap<uint64_t, uint64_t> by_length_;  // length -> offset
};

}  // namespace ferry::store
