#include "cuarena/trace/writer.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace cuarena::cuat {

namespace {

// A regular file is written as a new file of its own name beside it (`.NAME.XXXXXX`, made by
// mkstemp: no file of the user's is taken) and renamed over it once whole; anything else (a
// device such as /dev/stdout) is written directly.
FILE* open_target(const std::string& path, bool regular, std::string& target) {
  if (!regular) {
    target = path;
    return std::fopen(path.c_str(), "wb");
  }
  const std::filesystem::path p(path);
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : ".";
  target = (dir / ("." + p.filename().string() + ".XXXXXX")).string();
  const int fd = mkstemp(target.data());
  if (fd < 0) return nullptr;
  FILE* f = fdopen(fd, "wb");
  if (f == nullptr) {
    close(fd);
    std::remove(target.c_str());
  }
  return f;
}

}  // namespace

void write(const std::string& path, const std::vector<Event>& events) {
  std::error_code ec;
  const bool regular =
      !std::filesystem::exists(path, ec) || std::filesystem::is_regular_file(path, ec);
  std::string target;
  FILE* out = open_target(path, regular, target);
  if (out == nullptr) throw WriteError(path + ": cannot open for writing: " + std::strerror(errno));
  auto failed = [&](const char* what) {
    const std::string why = std::strerror(errno);
    if (out != nullptr) std::fclose(out);
    if (regular) std::remove(target.c_str());
    throw WriteError(path + ": " + what + " failed: " + why + " (nothing written)");
  };
  unsigned char header[kHeaderSize] = {};
  std::memcpy(header, kMagic, sizeof kMagic);
  store_le<std::uint32_t>(header + 8, kVersion);
  store_le<std::uint32_t>(header + 12, kRecordSize);
  store_le<std::uint64_t>(header + 16, events.size());
  if (std::fwrite(header, sizeof header, 1, out) != 1) failed("write");
  for (const Event& e : events) {
    unsigned char r[kRecordSize] = {};
    r[0] = static_cast<unsigned char>(e.action);
    store_le<std::uint16_t>(r + 2, e.device);
    store_le<std::uint64_t>(r + 8, e.stream);
    store_le<std::uint64_t>(r + 16, e.addr);
    store_le<std::uint64_t>(r + 24, e.size);
    store_le<std::int64_t>(r + 32, e.time_us);
    if (std::fwrite(r, sizeof r, 1, out) != 1) failed("write");
  }
  errno = 0;
  if (std::fflush(out) != 0) failed("write");
  const int closed = std::fclose(out);
  out = nullptr;
  if (closed != 0) failed("close");
  if (regular && std::rename(target.c_str(), path.c_str()) != 0) failed("rename");
}

}  // namespace cuarena::cuat
