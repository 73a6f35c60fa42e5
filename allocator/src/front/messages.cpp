#include "front/messages.hpp"

#include <cstdio>
#include <sstream>

namespace cuarena::detail {

std::string hex(DevicePtr p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(p));
  return buf;
}

std::string out_of_memory_message(std::size_t bytes, StreamId stream, std::size_t capacity,
                                  std::size_t limit, const Config& config, const Stats& stats) {
  const int all = int(Pool::kAll);
  const auto reserved = std::size_t(stats.reserved_bytes[all].current);
  const auto allocated = std::size_t(stats.allocated_bytes[all].current);
  std::ostringstream msg;
  const std::size_t free_reserved = reserved > allocated ? reserved - allocated : 0;
  const std::size_t headroom = limit > reserved ? limit - reserved : 0;
  msg << "cuarena: out of memory: tried to allocate " << format_bytes(bytes) << " (" << bytes
      << " bytes) on stream " << hex(stream) << ". Device capacity " << format_bytes(capacity)
      << ", limit " << format_bytes(limit) << " (per_process_memory_fraction "
      << config.per_process_memory_fraction << "); cuarena holds " << format_bytes(reserved)
      << " reserved, of which " << format_bytes(allocated) << " is allocated and "
      << format_bytes(free_reserved)
      << " is reserved but unallocated (after defragmentation); the largest block it could build"
         " is at most "
      << format_bytes(free_reserved + headroom)
      << " (that free memory stitched together, plus what the limit leaves if the device has it"
         " free). Free tensors, lower the batch size, or raise per_process_memory_fraction; to"
         " see which setting fits, record the job (CUARENA_TRACE=oom.cuat) and replay it:"
         " cuarena replay oom.cuat --min-capacity.";
  return msg.str();
}

}  // namespace cuarena::detail
