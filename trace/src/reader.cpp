#include "cuarena/trace/reader.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <unordered_set>

namespace cuarena::cuat {

namespace {

constexpr std::uint64_t kMaxGzipExpansion = 1032;  // deflate's largest output per input byte

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw ReadError(path + ": " + problem);
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// A regular file, read as it is or, when it starts with gzip's magic, decompressed as Python's
// gzip module (the reference reader's) reads it: members may follow one another and NUL bytes
// may pad the end; anything else after a member, or a file that ends inside one (its CRC-32 and
// length trailer included), is refused. zlib's inflate checks each member's trailer.
class Input {
 public:
  Input(const std::string& file, const std::string& path) : path_(path) {
    std::error_code ec;
    if (!std::filesystem::exists(file, ec)) fail(path, "no such file");
    if (std::filesystem::is_directory(file, ec)) fail(path, "is a directory, not a trace");
    // A pipe or device has no end to check a header against (and a FIFO with no writer blocks
    // forever): only regular files are read.
    if (!std::filesystem::is_regular_file(file, ec))
      fail(path, "not a regular file (a pipe or device): save the trace to a file first");
    file_bytes_ = std::filesystem::file_size(file, ec);
    if (ec) fail(path, "cannot read its size: " + ec.message());
    f_.reset(std::fopen(file.c_str(), "rb"));
    if (!f_) fail(path, std::string("cannot open: ") + std::strerror(errno));
    gzip_ = need(2) && in_[pos_] == 0x1f && in_[pos_ + 1] == 0x8b;
    if (gzip_) {
      if (inflateInit2(&z_, 15 + 16) != Z_OK) throw std::bad_alloc();  // +16: gzip only
      z_ready_ = true;
      in_member_ = true;
    }
  }
  Input(const Input&) = delete;
  Input& operator=(const Input&) = delete;
  ~Input() {
    if (z_ready_) inflateEnd(&z_);
  }

  bool gzip() const { return gzip_; }
  std::uint64_t file_bytes() const { return file_bytes_; }

  // Reads n bytes of content; fewer only at its end.
  std::size_t read(void* buf, std::size_t n) {
    auto* out = static_cast<unsigned char*>(buf);
    std::size_t got = 0;
    while (got < n) {
      if (!gzip_) {
        if (pos_ == in_.size() && !refill()) break;
        const std::size_t k = std::min(n - got, in_.size() - pos_);
        std::memcpy(out + got, in_.data() + pos_, k);
        pos_ += k;
        got += k;
        continue;
      }
      if (!in_member_ && !next_member()) break;
      if (pos_ == in_.size() && !refill()) {
        fail(path_,
             "truncated gzip data (the file ends inside a gzip member, before its CRC-32 and "
             "length trailer)");
      }
      z_.next_in = in_.data() + pos_;
      z_.avail_in = uInt(in_.size() - pos_);
      z_.next_out = out + got;
      z_.avail_out = uInt(std::min<std::size_t>(n - got, UINT_MAX));
      const int rc = inflate(&z_, Z_NO_FLUSH);
      pos_ = in_.size() - z_.avail_in;
      got = std::size_t(z_.next_out - out);
      if (rc == Z_STREAM_END) {
        in_member_ = false;
      } else if (rc == Z_MEM_ERROR) {
        throw std::bad_alloc();
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        fail(path_,
             std::string("corrupt gzip data (") + (z_.msg ? z_.msg : "inflate failed") + ")");
      }
    }
    return got;
  }

 private:
  // Compressed bytes left in in_ after pos_ (more read from the file if needed): whether at
  // least n are there.
  bool need(std::size_t n) {
    while (in_.size() - pos_ < n)
      if (!refill()) return false;
    return true;
  }

  // Appends the file's next bytes to in_ (dropping those before pos_); false at its end.
  bool refill() {
    in_.erase(in_.begin(), in_.begin() + std::ptrdiff_t(pos_));
    pos_ = 0;
    const std::size_t had = in_.size();
    in_.resize(had + kChunk);
    const std::size_t r = std::fread(in_.data() + had, 1, kChunk, f_.get());
    in_.resize(had + r);
    if (r == 0 && std::ferror(f_.get()))
      fail(path_, std::string("read failed: ") + std::strerror(errno));
    return r > 0;
  }

  // After a member: NUL padding, then the end of the file or another member.
  bool next_member() {
    while (need(1) && in_[pos_] == 0) ++pos_;
    if (!need(1)) return false;
    if (!need(2) || in_[pos_] != 0x1f || in_[pos_ + 1] != 0x8b) {
      const std::uint64_t at = consumed_before_pos();
      fail(path_, "trailing bytes after the gzip data (at byte " + std::to_string(at) + " of " +
                      std::to_string(file_bytes_) + ": not another gzip member)");
    }
    inflateReset(&z_);
    in_member_ = true;
    return true;
  }

  std::uint64_t consumed_before_pos() const {
    return std::uint64_t(std::ftell(f_.get())) - (in_.size() - pos_);
  }

  static constexpr std::size_t kChunk = 1 << 18;
  std::string path_;
  std::unique_ptr<std::FILE, FileCloser> f_;
  std::uint64_t file_bytes_ = 0;
  std::vector<unsigned char> in_;  // file bytes read and not yet used from pos_ on
  std::size_t pos_ = 0;
  bool gzip_ = false, z_ready_ = false, in_member_ = false;
  z_stream z_{};
};

// One record's fields, checked by FORMAT.md's rules as the Python reader (read_cuat) applies
// them; `streams` holds the distinct streams of the current device.
Event decode(const unsigned char* r, std::uint64_t index, const Event* previous,
             std::unordered_set<std::uint64_t>& streams, const std::string& path) {
  const std::string where = "record " + std::to_string(index);
  if (r[0] > std::uint8_t(Action::kSnapshot) && r[0] != std::uint8_t(Action::kOther))
    fail(path, where + ": unknown action code " + std::to_string(r[0]));
  if (r[1] != 0 || load_le<std::uint32_t>(r + 4) != 0)
    fail(path, where + ": non-zero padding (corrupt record)");
  Event e;
  e.action = static_cast<Action>(r[0]);
  e.device = load_le<std::uint16_t>(r + 2);
  e.stream = load_le<std::uint64_t>(r + 8);
  e.addr = load_le<std::uint64_t>(r + 16);
  e.size = load_le<std::uint64_t>(r + 24);
  e.time_us = load_le<std::int64_t>(r + 32);
  if (previous && e.device < previous->device) {
    fail(path, where + ": device " + std::to_string(e.device) + " after device " +
                   std::to_string(previous->device) + " (devices are written in order)");
  }
  if (e.device >= kMaxDevices) {
    fail(path, where + ": device " + std::to_string(e.device) + " (devices are 0 to " +
                   std::to_string(kMaxDevices - 1) + ")");
  }
  if (!previous || e.device != previous->device) streams.clear();
  // Most records repeat the stream before them: only a change is looked up.
  if (!previous || e.device != previous->device || e.stream != previous->stream) {
    streams.insert(e.stream);
    if (streams.size() > kMaxStreamsPerDevice) {
      fail(path, where + ": more than " + std::to_string(kMaxStreamsPerDevice) +
                     " streams on device " + std::to_string(e.device));
    }
  }
  // No device holds more: sums of such sizes cannot overflow 64 bits.
  if (e.size > kMaxEventSize && e.action != Action::kOom) {
    fail(path, where + " has an implausible size " + std::to_string(e.size) +
                   " (more than any device holds)");
  }
  return e;
}

std::string gib(std::uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", double(bytes) / double(1 << 30));
  return text;
}

std::vector<Event> read_events(const std::string& file, const std::string& path) {
  Input in(file, path);
  unsigned char header[kHeaderSize];
  if (in.read(header, sizeof header) != sizeof header ||
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
  // What the file can hold first (an uncompressed one its size; a gzipped one 1032 bytes per
  // compressed byte), then the limit: both before any room for the events is taken.
  const std::uint64_t bytes = in.file_bytes();
  const std::uint64_t most = !in.gzip()                               ? bytes - kHeaderSize
                             : bytes > UINT64_MAX / kMaxGzipExpansion ? UINT64_MAX
                                                                      : bytes * kMaxGzipExpansion;
  if (count > most / kRecordSize) {
    fail(path, "truncated: header promises " + std::to_string(count) + " events, a " +
                   std::to_string(bytes) + "-byte " + (in.gzip() ? "gzip file" : "file") +
                   " holds at most " + std::to_string(most / kRecordSize));
  }
  if (count > kMaxEvents) {
    fail(path, "header promises " + std::to_string(count) +
                   " events, more than a trace may hold (" + std::to_string(kMaxEvents) + ", " +
                   gib(kMaxImageBytes) + " decompressed; trace/FORMAT.md)");
  }
  // An uncompressed file's size proves its records: room for all of them at once. A gzipped
  // file proves nothing until it is decompressed: room grows with the records read, in blocks
  // joined at the end (the peak: the records and one block).
  const std::size_t block_events =
      in.gzip() ? std::size_t{1} << 20 : std::size_t(std::max<std::uint64_t>(count, 1));
  std::vector<std::vector<Event>> blocks;
  std::vector<unsigned char> buf(kRecordSize * 4096);
  std::unordered_set<std::uint64_t> streams;
  std::uint64_t done = 0;
  Event last{};
  while (done < count) {
    const std::size_t batch = std::size_t(std::min<std::uint64_t>(count - done, 4096));
    const std::size_t want = batch * kRecordSize;
    if (in.read(buf.data(), want) != want) {
      fail(path, "truncated: header promises " + std::to_string(count) + " events, file has " +
                     std::to_string(done) + "+");
    }
    for (std::size_t i = 0; i < batch; ++i, ++done) {
      if (blocks.empty() || blocks.back().size() == block_events) {
        blocks.emplace_back();
        blocks.back().reserve(std::size_t(std::min<std::uint64_t>(count - done, block_events)));
      }
      last = decode(buf.data() + i * kRecordSize, done, done ? &last : nullptr, streams, path);
      blocks.back().push_back(last);
    }
  }
  // Past the last record: the end of the content (for gzip, every member's trailer checked).
  unsigned char extra;
  if (in.read(&extra, 1) != 0) fail(path, "trailing bytes after the last event");
  if (blocks.size() == 1) return std::move(blocks.front());
  std::vector<Event> events;
  events.reserve(std::size_t(count));
  for (auto& block : blocks) {
    events.insert(events.end(), block.begin(), block.end());
    std::vector<Event>().swap(block);  // freed as it is copied
  }
  return events;
}

}  // namespace

bool is_cuat(const std::string& path) {
  Input in(path, path);
  char magic[8];
  return in.read(magic, sizeof magic) == sizeof magic &&
         std::memcmp(magic, kMagic, sizeof magic) == 0;
}

std::vector<Event> read(const std::string& file, const std::string& path) {
  try {
    return read_events(file, path);
  } catch (const std::bad_alloc&) {
    fail(path, "not enough memory to read its events (a trace holds at most " +
                   std::to_string(kMaxEvents) + " of them, " + gib(kMaxImageBytes) + ")");
  }
}

}  // namespace cuarena::cuat
