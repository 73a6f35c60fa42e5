// Defaults of DeviceBackend's segment calls: a mapping backend never receives them.
#include "cuarena/device_backend.hpp"

#include <stdexcept>

namespace cuarena {

DevicePtr DeviceBackend::allocate_segment(std::size_t, StreamId) {
  throw std::logic_error("cuarena: allocate_segment called on a mapping (VMM) backend");
}

void DeviceBackend::free_segment(DevicePtr, std::size_t) {
  throw std::logic_error("cuarena: free_segment called on a mapping (VMM) backend");
}

}  // namespace cuarena
