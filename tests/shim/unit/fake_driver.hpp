// The fake driver's controls for the shim's CPU tests (fake_driver.cpp).
//
// Besides answering the calls, it keeps CUDA's ordering rules as vector clocks, so a test can
// ask whether a command is ordered after others: every command on a stream follows the stream's
// earlier ones; a command on the legacy stream follows the earlier commands of every blocking
// stream, and a command on a blocking stream the earlier legacy ones (CUDA's implicit
// synchronisation); a non-blocking stream (an odd handle here, the legacy one excepted) only what
// it waits for. Events carry the clock of their record; cuStreamWaitEvent merges it.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace cuarena::shim::fake {

/// While true, every stream reports that it is capturing a graph.
extern bool g_capturing;

/// Streams whose cuStreamQuery answers "all work done" whatever the model says.
extern std::vector<CUstream> g_idle;
/// Every cuStreamWaitEvent made, in order.
extern std::vector<std::pair<CUstream, CUevent>> g_waits;
/// Handles the driver refuses as destroyed (cuStreamQuery, cuEventRecord, cuStreamWaitEvent).
extern std::vector<CUstream> g_dead;

/// Commands per stream: for a stream X, how many of X's commands (from the first) are meant.
using Clock = std::map<CUstream, std::uint64_t>;

/// The program issues a command on `s` (a kernel); returns what it is ordered after (itself
/// included). nullptr is the legacy stream.
Clock launch(CUstream s);
/// How many commands each stream has been issued so far.
Clock issued();
/// Every command `later` is ordered after, or that had completed when it was issued, covers
/// `earlier`'s.
bool covers(const Clock& later, const Clock& earlier);
/// The device finishes every command issued on `s` so far (and what they waited for).
void finish(CUstream s);
/// Forgets every stream, event and count (between tests).
void reset();

/// The device reaches the point where `e` was recorded.
void complete(CUevent e);
bool completed(CUevent e);

}  // namespace cuarena::shim::fake
