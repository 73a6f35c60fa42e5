// The fake driver's controls for the shim's CPU tests (fake_driver.cpp).
#pragma once

#include <cuda.h>


namespace cuarena::shim::fake {

/// While true, every stream reports that it is capturing a graph.
extern bool g_capturing;
/// While true, cuEventSynchronize fails (as during a global-mode capture elsewhere).
extern bool g_sync_refused;

/// The device reaches the point where `e` was recorded.
void complete(CUevent e);
bool completed(CUevent e);

}  // namespace cuarena::shim::fake
