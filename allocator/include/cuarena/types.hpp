// Basic vocabulary shared by the policy core and every backend.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cuarena {

/// A stream handle as the caller sees it (a `cudaStream_t` cast to an integer on a GPU, a trace's
/// recorded handle in the replayer). 0 is the legacy default stream.
using StreamId = std::uint64_t;

/// An opaque event handle issued by a DeviceBackend.
using EventId = std::uint64_t;

/// Device addresses are integers in the core: it never dereferences them.
using DevicePtr = std::uintptr_t;

inline constexpr std::size_t KiB = std::size_t{1} << 10;
inline constexpr std::size_t MiB = std::size_t{1} << 20;
inline constexpr std::size_t GiB = std::size_t{1} << 30;

/// Every allocation is a multiple of, and aligned to, this many bytes (PyTorch's rounding).
inline constexpr std::size_t kMinBlockSize = 512;

constexpr std::size_t round_up(std::size_t n, std::size_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

}  // namespace cuarena
