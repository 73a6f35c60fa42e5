#include "cuarena/trace/writer.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace cuarena::cuat {

void write(const std::string& path, const std::vector<Event>& events) {
  // Anything but a regular file (a device such as /dev/stdout) is written directly.
  std::error_code ec;
  const bool regular =
      !std::filesystem::exists(path, ec) || std::filesystem::is_regular_file(path, ec);
  const std::string target = regular ? path + ".partial" : path;
  std::ofstream out(target, std::ios::binary);
  if (!out) throw WriteError(path + ": cannot open for writing: " + std::strerror(errno));
  auto failed = [&](const char* what) {
    const std::string why = std::strerror(errno);
    out.close();
    if (regular) std::remove(target.c_str());
    throw WriteError(path + ": " + what + " failed: " + why + " (nothing written)");
  };
  unsigned char header[kHeaderSize] = {};
  std::memcpy(header, kMagic, sizeof kMagic);
  store_le<std::uint32_t>(header + 8, kVersion);
  store_le<std::uint32_t>(header + 12, kRecordSize);
  store_le<std::uint64_t>(header + 16, events.size());
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  for (const Event& e : events) {
    unsigned char r[kRecordSize] = {};
    r[0] = static_cast<unsigned char>(e.action);
    store_le<std::uint16_t>(r + 2, e.device);
    store_le<std::uint64_t>(r + 8, e.stream);
    store_le<std::uint64_t>(r + 16, e.addr);
    store_le<std::uint64_t>(r + 24, e.size);
    store_le<std::int64_t>(r + 32, e.time_us);
    out.write(reinterpret_cast<const char*>(r), sizeof r);
    if (!out) failed("write");
  }
  errno = 0;
  out.flush();
  if (!out) failed("write");
  out.close();
  if (!out) failed("close");
  if (regular && std::rename(target.c_str(), path.c_str()) != 0) failed("rename");
}

}  // namespace cuarena::cuat
