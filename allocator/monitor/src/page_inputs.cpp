// What the integrations hand a publisher, and the one rule behind available_bytes: the switch,
// the device UUID's text, the memory a new allocation could get.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuarena/monitor_publisher.hpp"

namespace cuarena::monitor {

bool monitor_enabled() {
  const char* v = std::getenv("CUARENA_MONITOR");
  if (v == nullptr) return true;
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s != "0" && s != "false" && s != "off";
}

std::int64_t reusable_bytes(const Allocator::MemoryBreakdown& b) {
  return std::int64_t(b.owned_cached + b.shared_cached + b.retired + b.idle);
}

std::int64_t available_bytes(std::int64_t device_free_bytes, const Allocator::MemoryBreakdown& b,
                             std::int64_t reserved_bytes, std::int64_t limit_bytes) {
  if (device_free_bytes < 0) return -1;
  const std::int64_t cached = reusable_bytes(b);
  const std::int64_t under_limit = std::max<std::int64_t>(limit_bytes - reserved_bytes, 0) + cached;
  return std::min(device_free_bytes + cached, under_limit);
}

std::string format_gpu_uuid(const char (&bytes)[16]) {
  char text[41];  // "GPU-" + 32 hex digits + 4 dashes + NUL
  std::size_t n = 0;
  n += std::size_t(std::snprintf(text, sizeof text, "GPU-"));
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text[n++] = '-';
    n += std::size_t(std::snprintf(text + n, sizeof text - n, "%02x",
                                   static_cast<unsigned>(static_cast<unsigned char>(bytes[i]))));
  }
  return std::string(text, n);
}

}  // namespace cuarena::monitor
