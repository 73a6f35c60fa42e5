// The fake driver's controls for the shim's CPU tests (fake_driver.cpp).
#pragma once

#include <cuda.h>

#include <utility>
#include <vector>

namespace cuarena::shim::fake {

/// While true, every stream reports that it is capturing a graph.
extern bool g_capturing;
/// While true, cuEventSynchronize fails (as during a global-mode capture elsewhere).
extern bool g_sync_refused;

/// Streams whose cuStreamQuery answers "all work done" (others: "not ready").
extern std::vector<CUstream> g_idle;
/// Every cuStreamWaitEvent made, in order.
extern std::vector<std::pair<CUstream, CUevent>> g_waits;

/// The device reaches the point where `e` was recorded.
void complete(CUevent e);
bool completed(CUevent e);

}  // namespace cuarena::shim::fake
