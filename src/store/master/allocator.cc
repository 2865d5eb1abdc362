#include "store/master/allocator.h"

namespace ferry::store {

OffsetAllocator::OffsetAllocator(uint64_t size) : size_(size / kAlign * kAlign) {
  if (size_ > 0) Insert(0, size_);
}

uint64_t OffsetAllocator::largest_free() const {
  return by_length_.empty() ? 0 : by_length_.rbegin()->first;
}

void OffsetAllocator::Insert(uint64_t offset, uint64_t length) {
  by_offset_.emplace(offset, length);
  by_length_.emplace(length, offset);
  free_bytes_ += length;
}

void OffsetAllocator::Erase(std::map<uint64_t, uint64_t>::iterator it) {
  auto [lo, hi] = by_length_.equal_range(it->second);
  for (auto l = lo; l != hi; ++l) {
    if (l->second == it->first) {
      by_length_.erase(l);
      break;
    }
  }
  free_bytes_ -= it->second;
  by_offset_.erase(it);
}

std::optional<uint64_t> OffsetAllocator::Allocate(uint64_t length) {
  if (length == 0) return std::nullopt;
  const uint64_t need = RoundUp(length);
  auto fit = by_length_.lower_bound(need);  // best fit: the smallest block that holds it
  if (fit == by_length_.end()) return std::nullopt;
  const uint64_t offset = fit->second;
  const uint64_t block = fit->first;
  Erase(by_offset_.find(offset));
  if (block > need) Insert(offset + need, block - need);
  return offset;
}

bool OffsetAllocator::Claim(uint64_t offset, uint64_t length) {
  if (length == 0 || offset % kAlign != 0 || offset > size_) return false;
  const uint64_t need = RoundUp(length);
  auto it = by_offset_.upper_bound(offset);
  if (it == by_offset_.begin()) return false;
  --it;  // the free block starting at or before offset
  const uint64_t start = it->first, block = it->second;
  if (offset - start > block || need > block - (offset - start)) return false;
  Erase(it);
  if (offset > start) Insert(start, offset - start);
  if (start + block > offset + need) Insert(offset + need, start + block - offset - need);
  return true;
}

void OffsetAllocator::Free(uint64_t offset, uint64_t length) {
  uint64_t start = offset;
  uint64_t len = RoundUp(length);
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      len += prev->second;
      Erase(prev);
    }
  }
  next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && next->first == offset + RoundUp(length)) {
    len += next->second;
    Erase(next);
  }
  Insert(start, len);
}

}  // namespace ferry::store
