#include "cuarena/size_classes.hpp"

#include <bit>
#include <string>

#include "cuarena/errors.hpp"

namespace cuarena {

SizeClasses::SizeClasses(std::size_t small_limit, unsigned per_doubling) {
  if (per_doubling == 0)
    throw ConfigError("cuarena config: size_classes_per_doubling must be >= 1");
  if (small_limit < kStep) throw ConfigError("cuarena config: small_limit must be >= 512 bytes");
  sizes_.push_back(kStep);
  while (sizes_.back() < small_limit) {
    const std::size_t last = sizes_.back();
    // Spacing inside (2^k, 2^(k+1)] where 2^k <= last < 2^(k+1).
    const std::size_t base = std::bit_floor(last);
    std::size_t step = base / per_doubling;
    step = step < kStep ? kStep : step / kStep * kStep;
    sizes_.push_back(last + step);
  }
  if (sizes_.size() > 0xffff) throw ConfigError("cuarena config: too many size classes");
  lookup_.resize(sizes_.back() / kStep);
  std::size_t cls = 0;
  for (std::size_t i = 0; i < lookup_.size(); ++i) {
    const std::size_t bytes = (i + 1) * kStep;  // largest request in this 512-byte bucket
    while (sizes_[cls] < bytes) ++cls;
    lookup_[i] = std::uint16_t(cls);
  }
}

}  // namespace cuarena
