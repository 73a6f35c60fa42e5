#include "held_frees.hpp"

namespace cuarena::shim {

bool HeldFrees::hold(DevicePtr ptr, std::size_t bytes) {
  if (!held_set_.insert(ptr).second) return false;
  held_.push_back({ptr, bytes});
  sizes_.insert(bytes);
  bytes_ += bytes;
  return true;
}

bool HeldFrees::holds_fit(std::size_t bytes, std::size_t max_bytes) const {
  const auto it = sizes_.lower_bound(bytes);
  return it != sizes_.end() && *it <= max_bytes;
}

void HeldFrees::take_all(std::vector<Freed>& out) {
  out.insert(out.end(), held_.begin(), held_.end());
  held_.clear();
  held_set_.clear();
  sizes_.clear();
  bytes_ = 0;
}

}  // namespace cuarena::shim
