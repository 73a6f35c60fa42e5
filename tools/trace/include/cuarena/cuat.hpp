// The `.cuat` trace format (FORMAT.md beside this folder): its records, and the writer that both
// the replayer and the LD_PRELOAD shim use. Reading lives in the replayer (tools/replay), which
// adds gzip and validation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace cuarena::cuat {

inline constexpr char kMagic[8] = {'C', 'U', 'A', 'T', 'R', 'A', 'C', 'E'};
inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::size_t kHeaderSize = 32;
inline constexpr std::uint32_t kRecordSize = 40;

enum class Action : std::uint8_t {
  kAlloc = 0,
  kFreeRequested = 1,
  kFreeCompleted = 2,
  kSegmentAlloc = 3,
  kSegmentFree = 4,
  kSegmentMap = 5,
  kSegmentUnmap = 6,
  kOom = 7,
  kSnapshot = 8,
  kOther = 255,
};

struct Event {
  Action action;
  std::uint16_t device;
  std::uint64_t stream;
  std::uint64_t addr;
  std::uint64_t size;
  std::int64_t time_us;
};

template <class T>
T load_le(const unsigned char* p) {
  T v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= T(p[i]) << (8 * i);
  return v;
}

template <class T>
void store_le(unsigned char* p, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i)
    p[i] = static_cast<unsigned char>(std::uint64_t(v) >> (8 * i));
}

/// A write that failed; what() names the file and the cause.
class WriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Writes `events` (devices one after another, as FORMAT.md requires) as an uncompressed `.cuat`
/// file. A regular file is written beside `path` and renamed into place, so a failed write
/// leaves nothing; every write, the flush and the close are checked. Throws WriteError.
void write(const std::string& path, const std::vector<Event>& events);

}  // namespace cuarena::cuat
