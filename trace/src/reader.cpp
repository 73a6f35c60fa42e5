#include "cuarena/trace/reader.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

namespace cuarena::cuat {

namespace {

constexpr std::uint64_t kMaxGzipExpansion = 1032;  // deflate's largest output per input byte

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw ReadError(path + ": " + problem);
}

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzPtr = std::unique_ptr<gzFile_s, GzCloser>;

// Reads exactly n bytes; returns bytes read (short on EOF); throws on a zlib error.
std::size_t read_some(gzFile f, const std::string& path, void* buf, std::size_t n) {
  std::size_t got = 0;
  while (got < n) {
    const int r = gzread(f, static_cast<char*>(buf) + got,
                         unsigned(std::min<std::size_t>(n - got, 1u << 30)));
    if (r < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      fail(path, std::string("corrupt or truncated gzip data (") + msg + ")");
    }
    if (r == 0) break;
    got += std::size_t(r);
  }
  return got;
}

GzPtr open_gz(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(path, "no such file");
  if (std::filesystem::is_directory(path, ec)) fail(path, "is a directory, not a trace");
  // A pipe or device has no end to check a header against (and a FIFO with no writer blocks
  // forever): only regular files are read.
  if (!std::filesystem::is_regular_file(path, ec))
    fail(path, "not a regular file (a pipe or device): save the trace to a file first");
  GzPtr f(gzopen(path.c_str(), "rb"));
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  return f;
}

}  // namespace

bool is_cuat(const std::string& path) {
  GzPtr f = open_gz(path);
  char magic[8];
  const std::size_t got = read_some(f.get(), path, magic, sizeof magic);
  return got == sizeof magic && std::memcmp(magic, kMagic, sizeof magic) == 0;
}

std::vector<Event> read(const std::string& file, const std::string& path) {
  GzPtr f = open_gz(file);
  unsigned char header[kHeaderSize];
  if (read_some(f.get(), path, header, sizeof header) != sizeof header ||
      std::memcmp(header, kMagic, sizeof kMagic) != 0) {
    fail(path, "not a cuarena trace (bad magic)");
  }
  const auto version = load_le<std::uint32_t>(header + 8);
  const auto record_size = load_le<std::uint32_t>(header + 12);
  const auto count = load_le<std::uint64_t>(header + 16);
  if (version != kVersion)
    fail(path, "unsupported cuarena trace version " + std::to_string(version));
  if (record_size != kRecordSize)
    fail(path, "unexpected record size " + std::to_string(record_size));
  if (count > (std::uint64_t{1} << 34))
    fail(path, "implausible event count " + std::to_string(count));
  // A header may claim no more records than the file can hold: an uncompressed file, its size;
  // a gzipped one, 1032 bytes per compressed byte (deflate's largest expansion). Then room for
  // all of them at once (growing a vector of 10^8 events would peak at 1.5x).
  std::uint64_t room = std::min<std::uint64_t>(count, 1u << 20);  // size unknown: grow
  std::error_code size_ec;
  const std::uint64_t file_bytes = std::filesystem::file_size(file, size_ec);
  if (!size_ec) {
    room = count;
    const std::uint64_t most = gzdirect(f.get()) ? (file_bytes > 32 ? file_bytes - 32 : 0)
                                                 : file_bytes * kMaxGzipExpansion;
    if (count > most / kRecordSize) {
      fail(path, "truncated: header promises " + std::to_string(count) + " events, a " +
                     std::to_string(file_bytes) + "-byte " +
                     (gzdirect(f.get()) ? "file" : "gzip file") + " holds at most " +
                     std::to_string(most / kRecordSize));
    }
  }
  std::vector<Event> events;
  events.reserve(std::size_t(room));
  std::vector<unsigned char> buf(kRecordSize * 4096);
  std::uint64_t left = count;
  while (left > 0) {
    const std::size_t batch = std::size_t(std::min<std::uint64_t>(left, 4096));
    const std::size_t want = batch * kRecordSize;
    if (read_some(f.get(), path, buf.data(), want) != want) {
      fail(path, "truncated: header promises " + std::to_string(count) + " events, file has " +
                     std::to_string(count - left + 0) + "+");
    }
    for (std::size_t i = 0; i < batch; ++i) {
      const unsigned char* r = buf.data() + i * kRecordSize;
      Event e;
      // The rules of FORMAT.md, as the Python reader (cuarena_trace.read_cuat) applies them.
      const std::string where = "record " + std::to_string(events.size());
      if (r[0] > std::uint8_t(Action::kSnapshot) && r[0] != std::uint8_t(Action::kOther))
        fail(path, where + ": unknown action code " + std::to_string(r[0]));
      if (r[1] != 0 || load_le<std::uint32_t>(r + 4) != 0)
        fail(path, where + ": non-zero padding (corrupt record)");
      e.action = static_cast<Action>(r[0]);
      e.device = load_le<std::uint16_t>(r + 2);
      if (!events.empty() && e.device < events.back().device) {
        fail(path, where + ": device " + std::to_string(e.device) + " after device " +
                       std::to_string(events.back().device) + " (devices are written in order)");
      }
      e.stream = load_le<std::uint64_t>(r + 8);
      e.addr = load_le<std::uint64_t>(r + 16);
      e.size = load_le<std::uint64_t>(r + 24);
      e.time_us = load_le<std::int64_t>(r + 32);
      // No device holds more: sums of such sizes cannot overflow 64 bits.
      if (e.size > kMaxEventSize && e.action != Action::kOom) {
        fail(path, where + " has an implausible size " + std::to_string(e.size) +
                       " (more than any device holds)");
      }
      events.push_back(e);
    }
    left -= batch;
  }
  char extra;
  if (read_some(f.get(), path, &extra, 1) != 0) fail(path, "trailing bytes after the last event");
  return events;
}

}  // namespace cuarena::cuat
