#include "cuarena/replay/trace.hpp"

#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "cuarena/config.hpp"
#include "input/process.hpp"
#include "input/sha256.hpp"

namespace cuarena::replay {

namespace {

using cuat::kMagic;
using cuat::kRecordSize;
using cuat::kVersion;
using cuat::load_le;

constexpr std::uint64_t kMaxGzipExpansion = 1032;  // deflate's largest output per input byte

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw TraceError(path + ": " + problem);
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

bool is_cuat(const std::string& path) {
  GzPtr f = open_gz(path);
  char magic[8];
  const std::size_t got = read_some(f.get(), path, magic, sizeof magic);
  return got == sizeof magic && std::memcmp(magic, kMagic, sizeof magic) == 0;
}

std::string converter_script() {
  return script_path("CUARENA_TRACE_SCRIPT", "cuarena_trace.py", CUARENA_TRACE_SCRIPT);
}

// Runs the converter, returning its exit status and stderr text.
int run_converter(const std::string& in, const std::string& out, std::string& err_text) {
  try {
    return run_process({python_executable(), converter_script(), "convert", in, out}, {}, err_text);
  } catch (const std::runtime_error& e) {
    fail(in, std::string("cannot run the trace converter: ") + e.what());
  }
}

// The converted-trace cache: $CUARENA_CACHE_DIR (set but empty: no cache), else
// $XDG_CACHE_HOME/cuarena (an absolute path, as the XDG spec requires), else ~/.cache/cuarena.
std::string cache_dir() {
  if (const char* d = std::getenv("CUARENA_CACHE_DIR")) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && x[0] == '/')
    return std::string(x) + "/cuarena";
  if (const char* h = std::getenv("HOME"); h && h[0] != '\0')
    return std::string(h) + "/.cache/cuarena";
  return "";
}

// Where `path`'s converted events are cached: keyed by the SHA-256 of its content (its name and
// time do not matter) and of the converter script (a changed converter converts again); "" when
// the cache is off or either cannot be read.
std::string cache_entry(const std::string& path) {
  const std::string dir = cache_dir();
  if (dir.empty()) return "";
  const std::string input = sha256_file(path), script = sha256_file(converter_script());
  if (input.empty() || script.empty()) return "";
  return dir + "/" + input + "-" + script.substr(0, 16) + ".cuat.gz";
}

// Stores the converted `cuat` file as the cache entry `entry`, gzip-compressed (whose CRC lets a
// damaged entry be noticed): written beside it under a unique name and renamed into place, so a
// reader sees a whole entry or none. Best effort: a cache that cannot be written is skipped.
void store_in_cache(const std::string& cuat, const std::string& entry) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(entry).parent_path(), ec);
  std::string tmp = entry + ".XXXXXX";
  const int fd = mkstemp(tmp.data());
  if (fd < 0) return;
  gzFile out = gzdopen(fd, "wb1");
  if (out == nullptr) {
    close(fd);
    std::remove(tmp.c_str());
    return;
  }
  std::ifstream in(cuat, std::ios::binary);
  std::vector<char> buf(1 << 20);
  bool ok = bool(in);
  while (ok && in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    const auto n = unsigned(in.gcount());
    ok = n == 0 || gzwrite(out, buf.data(), n) == int(n);
  }
  ok = gzclose(out) == Z_OK && ok && !in.bad();
  if (!ok || std::rename(tmp.c_str(), entry.c_str()) != 0) std::remove(tmp.c_str());
}

}  // namespace

std::string python_executable() {
  if (const char* p = std::getenv("CUARENA_PYTHON")) return p;
  return CUARENA_PYTHON_EXECUTABLE;
}

std::vector<Event> read_cuat(const std::string& path) { return read_cuat(path, path); }

std::vector<Event> read_cuat(const std::string& file, const std::string& path) {
  GzPtr f = open_gz(file);
  unsigned char header[32];
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
      // No device holds more (config.hpp): sums of such sizes cannot overflow 64 bits.
      if (e.size > kMaxDeviceBytes && e.action != Action::kOom) {
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

void write_cuat(const std::string& path, const std::vector<Event>& events) {
  try {
    cuat::write(path, events);
  } catch (const cuat::WriteError& e) {
    throw TraceError(e.what());
  }
}

std::vector<Event> load_trace(const std::string& path) {
  if (is_cuat(path)) return read_cuat(path);
  // Converted before (same content, same converter): read the cached form, no Python. An entry
  // that does not read back whole (truncated, corrupt, not a trace) is dropped and rewritten.
  const std::string entry = cache_entry(path);
  std::error_code ec;
  if (!entry.empty() && std::filesystem::exists(entry, ec)) {
    try {
      return read_cuat(entry, path);
    } catch (const TraceError&) {
      std::remove(entry.c_str());
    }
  }
  char tmpl[] = "/tmp/cuarena-trace-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) fail(path, "cannot create a temporary file for conversion");
  close(fd);
  const std::string tmp = tmpl;
  std::string err;
  int rc = 0;
  try {
    rc = run_converter(path, tmp, err);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (rc != 0) {
    std::remove(tmp.c_str());
    // The converter prints one line "cuarena-trace: PATH: PROBLEM"; pass on the last line.
    while (!err.empty() && (err.back() == '\n' || err.back() == '\r')) err.pop_back();
    const std::size_t nl = err.rfind('\n');
    // Clipped: a converter that fails otherwise (a crash, another script) may quote anything.
    std::string line = clip(nl == std::string::npos ? err : err.substr(nl + 1), path.size() + 300);
    const std::string prefix = "cuarena-trace: ";
    if (line.rfind(prefix, 0) == 0) throw TraceError(line.substr(prefix.size()));
    fail(path, "trace converter failed (exit " + std::to_string(rc) + ")" +
                   (line.empty() ? "" : ": " + line));
  }
  std::vector<Event> events;
  try {
    events = read_cuat(tmp, path);  // a problem left in the converted events is the input's
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (!entry.empty()) store_in_cache(tmp, entry);
  std::remove(tmp.c_str());
  return events;
}

std::string clip(const std::string& text, std::size_t max) {
  if (text.size() <= max) return text;
  std::size_t cut = max;  // not inside a UTF-8 sequence
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut) + "… (" + std::to_string(text.size()) + " characters)";
}

std::string trace_name(const std::string& path) {
  std::string name = std::filesystem::path(path).filename().string();
  for (const char* ext : {".gz", ".pickle", ".pkl", ".cuat", ".csv"}) {
    const std::string e = ext;
    if (name.size() > e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0)
      name.erase(name.size() - e.size());
  }
  return name;
}

}  // namespace cuarena::replay
