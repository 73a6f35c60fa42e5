// One gzip member of some bytes, for the reader tests' inputs (zlib's deflate).
#pragma once

#include <zlib.h>

#include <string>

namespace cuarena::test {

inline std::string gzip(const std::string& data, int level = 6) {
  std::string out(compressBound(uLong(data.size())) + 32, '\0');
  z_stream z{};
  deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // +16: a gzip wrapper
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = uInt(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

}  // namespace cuarena::test
