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
#include "cuarena/trace/reader.hpp"
#include "cuarena/trace/writer.hpp"
#include "input/process.hpp"
#include "input/sha256.hpp"

namespace cuarena::replay {

namespace {

// The reader's and writer's limit is the replayer's: no device holds more.
static_assert(cuat::kMaxEventSize == kMaxDeviceBytes);

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw TraceError(path + ": " + problem);
}

// `read()`, with the format library's ReadError as a TraceError of the same message.
template <class Read>
auto as_trace_error(Read&& read) {
  try {
    return read();
  } catch (const cuat::ReadError& e) {
    throw TraceError(e.what());
  }
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
  return as_trace_error([&] { return cuat::read(file, path); });
}

void write_cuat(const std::string& path, const std::vector<Event>& events) {
  try {
    cuat::write(path, events);
  } catch (const cuat::WriteError& e) {
    throw TraceError(e.what());
  }
}

std::vector<Event> load_trace(const std::string& path) {
  if (as_trace_error([&] { return cuat::is_cuat(path); })) return read_cuat(path);
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
