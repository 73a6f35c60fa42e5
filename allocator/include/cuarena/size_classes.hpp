// Size classes for small requests.
//
// Classes are multiples of kMinBlockSize (512 B), so every block keeps PyTorch's alignment. Within
// each power-of-two range (2^k, 2^(k+1)] there are `per_doubling` classes spaced 2^k/per_doubling
// apart (jemalloc/mimalloc spacing), but never closer than 512 B. With 4 per doubling the
// rounding waste is at most 1/(2*4) of the request on average and < 25% in the worst case.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cuarena {

class SizeClasses {
 public:
  /// Builds the classes covering requests up to `small_limit` bytes. Throws ConfigError when
  /// per_doubling is 0 or small_limit is below 512.
  SizeClasses(std::size_t small_limit, unsigned per_doubling);

  std::size_t count() const { return sizes_.size(); }
  std::size_t max_size() const { return sizes_.back(); }

  /// Index of the smallest class >= bytes; requires 0 < bytes <= max_size(). O(1).
  std::size_t index(std::size_t bytes) const { return lookup_[(bytes - 1) / kStep]; }

  /// Bytes of class `idx`.
  std::size_t size(std::size_t idx) const { return sizes_[idx]; }

 private:
  static constexpr std::size_t kStep = 512;
  std::vector<std::size_t> sizes_;
  std::vector<std::uint16_t> lookup_;  // (bytes-1)/512 -> class index
};

}  // namespace cuarena
