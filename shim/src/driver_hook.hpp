// What every driver hook does around its body: no exception crosses into C, and a call the shim
// does not serve goes to the driver, counted and logged.
#pragma once

#include <cuda.h>

#include <exception>
#include <optional>

#include "shim.hpp"

namespace cuarena::shim {

/// Runs a hook's body; an exception (out of host memory) must not cross into C.
template <class Body>
CUresult guarded(const char* call, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    Shim::get().log("%s: %s", call, e.what());
    return CUDA_ERROR_UNKNOWN;
  }
}

/// `served`, or the real call when the shim does not serve it.
template <class Pass>
CUresult or_pass(const char* call, std::optional<CUresult> served, Pass&& pass) {
  if (served) return *served;
  Shim& shim = Shim::get();
  shim.passed();
  if (shim.logging()) shim.log("%s passed through", call);
  return pass();
}

}  // namespace cuarena::shim
