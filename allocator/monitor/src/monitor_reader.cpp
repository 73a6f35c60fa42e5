#include "cuarena/monitor_reader.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>

namespace cuarena::monitor {

static_assert(sizeof(MonitorPage) % sizeof(std::uint64_t) == 0);

bool copy_page(const MonitorPage& mapped, MonitorPage& out, int attempts) {
  // Word by word with acquire loads, matching the writer's release stores (seqlock.hpp): a
  // word of a rewrite under way makes the second load of `seq` see it under way.
  auto* src = const_cast<std::uint64_t*>(reinterpret_cast<const std::uint64_t*>(&mapped));
  std::uint64_t words[sizeof(MonitorPage) / sizeof(std::uint64_t)];
  auto seq = std::atomic_ref<std::uint64_t>(src[offsetof(MonitorPage, seq) / 8]);
  for (int i = 0; i < attempts; ++i) {
    const std::uint64_t before = seq.load(std::memory_order_acquire);
    if (before % 2 == 0) {
      for (std::size_t w = 0; w < std::size(words); ++w)
        words[w] = std::atomic_ref<std::uint64_t>(src[w]).load(std::memory_order_acquire);
      if (seq.load(std::memory_order_relaxed) == before) {
        std::memcpy(&out, words, sizeof out);
        return true;
      }
    }
    std::this_thread::yield();
  }
  return false;
}

std::optional<MonitorPage> read_page(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  void* map = MAP_FAILED;
  if (fstat(fd, &st) == 0 && std::size_t(st.st_size) >= sizeof(MonitorPage))
    map = mmap(nullptr, sizeof(MonitorPage), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return std::nullopt;
  MonitorPage page;
  const bool ok = copy_page(*static_cast<const MonitorPage*>(map), page);
  munmap(map, sizeof(MonitorPage));
  if (!ok) return std::nullopt;
  return page;
}

}  // namespace cuarena::monitor
