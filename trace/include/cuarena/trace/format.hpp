// The `.cuat` trace format (trace/FORMAT.md): its records, constants and byte order, shared by the
// writer (writer.hpp) and the reader (reader.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cuarena::cuat {

inline constexpr char kMagic[8] = {'C', 'U', 'A', 'T', 'R', 'A', 'C', 'E'};
inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::size_t kHeaderSize = 32;
inline constexpr std::uint32_t kRecordSize = 40;
/// The largest size of an event other than `oom`, in bytes (16 TiB: no device holds more).
inline constexpr std::uint64_t kMaxEventSize = std::uint64_t{16} << 40;

// The readers' limits (FORMAT.md, "Limits"), checked before the events they allow are held, so
// a small file cannot make a reader hold or replay more than a real trace would.
/// Records in one file: 2.5 GiB of them (40 bytes each, in memory too).
inline constexpr std::uint64_t kMaxEvents = std::uint64_t{1} << 26;
/// Device indices are below this: PyTorch's device index is an int8 (at most 120 GPUs).
inline constexpr std::uint32_t kMaxDevices = 128;
/// Distinct streams of one device: each costs every replay state of its own.
inline constexpr std::uint64_t kMaxStreamsPerDevice = std::uint64_t{1} << 17;
/// The most bytes a file may hold once decompressed: a header and kMaxEvents records.
inline constexpr std::uint64_t kMaxImageBytes = kHeaderSize + kMaxEvents * kRecordSize;

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

/// One record; `size` and `addr` in bytes, `time_us` in microseconds.
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

}  // namespace cuarena::cuat
