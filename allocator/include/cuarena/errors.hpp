// Typed errors thrown across the cuarena C++ API. Each message names what failed and where.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace cuarena {

/// Base class of every error cuarena throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A configuration string had an unknown key or a malformed value.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// The device could not supply the memory for a request, even after defragmentation.
/// Nothing was allocated; the allocator is unchanged apart from released caches.
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(const std::string& what, std::size_t requested_bytes)
      : Error(what), requested_bytes_(requested_bytes) {}
  std::size_t requested_bytes() const noexcept { return requested_bytes_; }

 private:
  std::size_t requested_bytes_;
};

/// A pointer passed to deallocate/record_stream was not returned by this allocator, or was
/// already freed.
class InvalidPointerError : public Error {
 public:
  using Error::Error;
};

/// A backend call failed for a reason other than out of memory (driver error, exhausted address
/// space). The allocator state is unchanged.
class BackendError : public Error {
 public:
  using Error::Error;
};

}  // namespace cuarena
