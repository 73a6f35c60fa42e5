// SHA-256 (FIPS 180-4), for content keys of the converted-trace cache: no library needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cuarena::replay {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, std::size_t bytes);
  /// The digest as 64 lower-case hex digits; the object is spent afterwards.
  std::string hex();

 private:
  void block(const unsigned char* p);
  std::uint32_t h_[8];
  unsigned char buf_[64];
  std::size_t used_ = 0;
  std::uint64_t length_ = 0;  // bytes
};

/// SHA-256 of a whole file, as hex; empty when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace cuarena::replay
