// A stand-in for the shim's RealDriver (shim/src/real_driver.cpp) in CPU tests: events and
// streams are plain structs the test completes by hand, so the shim's fence logic runs without
// a GPU. Linked instead of real_driver.cpp.
#include "fake_driver.hpp"

#include <cuda.h>

#include <deque>

#include "real_driver.hpp"

struct CUevent_st {
  bool done = false;
};

namespace cuarena::shim::fake {

std::deque<CUevent_st> g_events;  // every event made, kept to the end (stable addresses)
bool g_capturing = false;
bool g_sync_refused = false;
std::vector<std::pair<CUstream, CUevent>> g_waits;
std::vector<CUstream> g_idle;

CUevent new_event() {
  g_events.emplace_back();
  return &g_events.back();
}
void complete(CUevent e) { e->done = true; }
bool completed(CUevent e) { return e->done; }

}  // namespace cuarena::shim::fake

namespace cuarena::shim {

const RealDriver& RealDriver::get() {
  static const RealDriver table = [] {
    RealDriver t;
    t.event_create = [](CUevent* e, unsigned) {
      *e = fake::new_event();
      return CUDA_SUCCESS;
    };
    t.event_record = [](CUevent e, CUstream) {
      e->done = false;  // a record is a new point in the stream: not reached yet
      return CUDA_SUCCESS;
    };
    t.event_query = [](CUevent e) { return e->done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY; };
    t.event_synchronize = [](CUevent e) {
      if (fake::g_sync_refused) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
      e->done = true;  // the host waited until the device got there
      return CUDA_SUCCESS;
    };
    t.event_destroy = [](CUevent) { return CUDA_SUCCESS; };
    t.stream_query = [](CUstream s) {
      for (CUstream i : fake::g_idle)
        if (i == s) return CUDA_SUCCESS;
      return CUDA_ERROR_NOT_READY;
    };
    t.stream_wait_event = [](CUstream s, CUevent e, unsigned) {
      fake::g_waits.emplace_back(s, e);
      return CUDA_SUCCESS;
    };
    t.stream_get_flags = [](CUstream s, unsigned* flags) {
      *flags = (reinterpret_cast<std::uintptr_t>(s) & 1) ? CU_STREAM_NON_BLOCKING : 0;
      return CUDA_SUCCESS;
    };
    t.stream_get_priority = [](CUstream, int* p) {
      *p = 0;
      return CUDA_SUCCESS;
    };
    t.stream_is_capturing = [](CUstream, CUstreamCaptureStatus* st) {
      *st = fake::g_capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
      return CUDA_SUCCESS;
    };
    return t;
  }();
  return table;
}

}  // namespace cuarena::shim
