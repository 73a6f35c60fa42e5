#include "page_fields.hpp"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>

#include "seqlock.hpp"

namespace cuarena::monitor::detail {

namespace {

// Copies `text` into a NUL-padded field, cut to leave a NUL and never inside a UTF-8 character.
template <std::size_t N>
void put_text(char (&field)[N], const std::string& text) {
  std::size_t n = std::min(text.size(), N - 1);
  while (n > 0 && n < text.size() && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  std::memset(field, 0, N);
  std::memcpy(field, text.data(), n);
}

}  // namespace

void write_identity(MonitorPage& page, const Identity& id) {
  begin_write(page);
  page.version = kMonitorVersion;
  page.page_bytes = sizeof(MonitorPage);
  page.pid = id.pid;
  page.device = id.device;
  page.kind = static_cast<std::uint32_t>(id.kind);
  page.start_ns = id.start_ns;
  put_text(page.device_uuid, id.device_uuid);
  put_text(page.command, id.command);
  std::memcpy(page.magic, kMonitorMagic, sizeof page.magic);
}

void write_reading(MonitorPage& page, const Reading& r) {
  const auto all = std::size_t(Pool::kAll);
  const Stats& s = r.stats;
  const Allocator::MemoryBreakdown& b = r.breakdown;
  begin_write(page);
  put(page.update_ns, r.now_ns);
  put(page.reserved_bytes, s.reserved_bytes[all].current);
  put(page.reserved_peak_bytes, s.reserved_bytes[all].peak);
  put(page.allocated_bytes, s.allocated_bytes[all].current);
  put(page.allocated_peak_bytes, s.allocated_bytes[all].peak);
  put(page.requested_bytes, s.requested_bytes[all].current);
  put(page.requested_peak_bytes, s.requested_bytes[all].peak);
  put(page.active_bytes, s.active_bytes[all].current);
  put(page.reclaimable_bytes, reusable_bytes(b) + std::int64_t(b.slab_free + b.stream_cached));
  put(page.largest_free_bytes, r.largest_free);
  put(page.limit_bytes, r.limit);
  put(page.available_bytes,
      available_bytes(r.device.free_bytes, b, s.reserved_bytes[all].current, r.limit));
  put(page.device_total_bytes, r.device.total_bytes);
  put(page.driver_calls,
      s.map_calls + s.unmap_calls + s.access_calls + s.num_device_alloc + s.num_device_free);
  put(page.num_ooms, s.num_ooms);
  put(page.num_alloc_retries, s.num_alloc_retries);
  put(page.allocations, s.allocation[all].allocated);
  put(page.memory_first, s.memory_first);
  end_write(page);
}

std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && text.back() == '\0') text.pop_back();
  std::replace(text.begin(), text.end(), '\0', ' ');
  return text;
}

std::uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return std::uint64_t(ts.tv_sec) * 1'000'000'000u + std::uint64_t(ts.tv_nsec);
}

}  // namespace cuarena::monitor::detail
