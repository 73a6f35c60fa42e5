#include "shm_page.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace cuarena::monitor::detail {

namespace {
std::string failed(const char* call, const std::string& name, int err) {
  return std::string(call) + " " + name + ": " + std::strerror(err);
}
}  // namespace

MonitorPage* create_page(const std::string& name, std::string& error) {
  shm_unlink(name.c_str());  // stale: a process of this pid before us (pid reuse, exec)
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    error = failed("shm_open", name, errno);
    return nullptr;
  }
  // The umask may have removed bits of 0600; the user's own reader needs them.
  int err = fchmod(fd, 0600) == 0 ? 0 : errno;
  if (err == 0 && ftruncate(fd, off_t(kMonitorPageBytes)) != 0) err = errno;
  if (err == 0) err = posix_fallocate(fd, 0, off_t(kMonitorPageBytes));
  void* map = MAP_FAILED;
  if (err == 0) {
    map = mmap(nullptr, kMonitorPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) err = errno;
  }
  close(fd);
  if (err != 0) {
    error = failed("creating", name, err);
    shm_unlink(name.c_str());
    return nullptr;
  }
  return static_cast<MonitorPage*>(map);
}

void unmap_page(MonitorPage* page) {
  if (page != nullptr) munmap(page, kMonitorPageBytes);
}

void remove_page(const std::string& name) { shm_unlink(name.c_str()); }

}  // namespace cuarena::monitor::detail
