// Kernels for `--verify`: write a tag into a block when it is handed out, check it just before
// the block is freed. A block reused before the previous owner's work finished shows up as a
// wrong tag.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cuarena::replay {

/// Writes `tag` into the first and last words of [ptr, ptr+bytes) on `stream`.
void launch_tag(void* ptr, std::size_t bytes, std::uint64_t tag, void* stream);
/// Checks the tag on `stream`; on a mismatch sets *error (device memory) to the tag.
void launch_check(void* ptr, std::size_t bytes, std::uint64_t tag, std::uint64_t* error,
                  void* stream);

}  // namespace cuarena::replay
