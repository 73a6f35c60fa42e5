// What a table built from driver_symbols.def needs: cuda.h (the signatures), a macro that keeps
// a row only where a column says 1, and a compile-time check that every row's ABI symbol is the
// one cuda.h maps its name to, so that dlsym (by ABI symbol) and cuGetProcAddress (by name and
// version) find the same function.
#pragma once

#include <cuda.h>

/// `...` where `flag` is 1, nothing where it is 0 (a column of driver_symbols.def).
#define CUARENA_DRIVER_IF(flag, ...) CUARENA_DRIVER_IF_##flag(__VA_ARGS__)
#define CUARENA_DRIVER_IF_0(...)
#define CUARENA_DRIVER_IF_1(...) __VA_ARGS__
/// The name `x` expands to under cuda.h's macros, as a string ("cuMemAlloc_v2" for cuMemAlloc).
#define CUARENA_DRIVER_EXPANDED(x) CUARENA_DRIVER_STRING(x)
#define CUARENA_DRIVER_STRING(x) #x

namespace cuarena::cuda::driver_symbols {

/// Whether `abi` is `expanded`, followed by "_ptsz" for a per-thread variant.
constexpr bool is_abi_of(const char* abi, const char* expanded, bool per_thread) {
  while (*expanded != '\0' && *abi == *expanded) ++abi, ++expanded;
  if (*expanded != '\0') return false;
  const char* rest = per_thread ? "_ptsz" : "";
  while (*rest != '\0' && *abi == *rest) ++abi, ++rest;
  return *rest == '\0' && *abi == '\0';
}

#define CUARENA_DRIVER_SYMBOL(member, api, abi, version, per_thread, backend, shim, tests) \
  static_assert(is_abi_of(#abi, CUARENA_DRIVER_EXPANDED(api), per_thread),                 \
                "driver_symbols.def: " #abi " is not cuda.h's symbol for " #member);
#include "cuarena/driver_symbols.def"
#undef CUARENA_DRIVER_SYMBOL

}  // namespace cuarena::cuda::driver_symbols
