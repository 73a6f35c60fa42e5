// fence_costs: what the driver calls behind the shim's fences cost the host, per call, on this
// GPU: the calls a synchronous free's fence makes (shim/src/stream_registry.cpp), with
// PyTorch's shape of a context (the legacy stream busy, 32 idle non-blocking streams as one cuDNN
// handle creates). The figures decide how often a fence may be recorded and which streams it may
// touch (docs/results.md). Run on a GPU machine: build-gpu/bin/cuarena_fence_costs
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  cuGetErrorString(r, &s);
  std::fprintf(stderr, "fence_costs: %s failed: %s\n", what, s ? s : "?");
  std::exit(1);
}

/// Median over 5 rounds of the mean host time of `n` calls of `fn`, in microseconds.
double per_call_us(int n, const std::function<void(int)>& fn) {
  std::vector<double> rounds;
  for (int r = 0; r < 5; ++r) {
    const auto t = Clock::now();
    for (int i = 0; i < n; ++i) fn(i);
    rounds.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count() / n);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[2];
}

}  // namespace

int main() {
  if (cuInit(0) != CUDA_SUCCESS) {
    std::puts("cuarena_fence_costs: no CUDA driver or device; run on a GPU machine");
    return 0;
  }
  CUdevice dev;
  check(cuDeviceGet(&dev, 0), "cuDeviceGet");
  CUcontext ctx;
  check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");

  constexpr int kStreams = 32;
  std::vector<CUstream> idle(kStreams);
  for (CUstream& s : idle) check(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  std::vector<CUevent> events(4096);
  for (CUevent& e : events) check(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  // Device work that keeps the legacy stream busy while the calls are timed (about 1 ms each).
  const std::size_t bytes = std::size_t{1} << 30;
  CUdeviceptr buf;
  check(cuMemAlloc(&buf, bytes), "cuMemAlloc");
  auto keep_busy = [&] {
    for (int i = 0; i < 64; ++i)
      check(cuMemsetD8Async(buf, std::uint8_t(i), bytes, CU_STREAM_LEGACY), "cuMemsetD8Async");
  };
  constexpr int kCalls = 2000;
  struct Row {
    const char* what;
    double us;
  };
  std::vector<Row> rows;
  auto time = [&](const char* what, const std::function<void(int)>& fn) {
    keep_busy();
    rows.push_back({what, per_call_us(kCalls, fn)});
    check(cuCtxSynchronize(), "cuCtxSynchronize");
  };

  time("cuCtxGetCurrent", [&](int) {
    CUcontext c;
    cuCtxGetCurrent(&c);
  });
  time("cuStreamIsCapturing(legacy)", [&](int) {
    CUstreamCaptureStatus st;
    cuStreamIsCapturing(CU_STREAM_LEGACY, &st);
  });
  time("cuStreamQuery(idle non-blocking)", [&](int i) { cuStreamQuery(idle[i % kStreams]); });
  time("cuStreamQuery(busy legacy)", [&](int) { cuStreamQuery(CU_STREAM_LEGACY); });
  time("cuEventRecord(legacy, busy)",
       [&](int i) { check(cuEventRecord(events[i], CU_STREAM_LEGACY), "cuEventRecord"); });
  time("cuEventQuery(incomplete)", [&](int i) { cuEventQuery(events[i]); });
  time("cuEventRecord(idle non-blocking)",
       [&](int i) { check(cuEventRecord(events[i], idle[i % kStreams]), "cuEventRecord"); });
  time("cuEventQuery(complete)", [&](int i) { cuEventQuery(events[i]); });
  check(cuEventRecord(events[0], CU_STREAM_LEGACY), "cuEventRecord");
  time("cuStreamWaitEvent(idle non-blocking, busy event)", [&](int i) {
    check(cuStreamWaitEvent(idle[i % kStreams], events[0], 0), "cuStreamWaitEvent");
  });
  check(cuCtxSynchronize(), "cuCtxSynchronize");
  // The whole fence as the shim records it today and as an ordering fence would: per fence, for
  // 32 idle non-blocking streams.
  time("fence: record legacy + query 32 idle streams", [&](int i) {
    check(cuEventRecord(events[i], CU_STREAM_LEGACY), "cuEventRecord");
    for (CUstream s : idle) cuStreamQuery(s);
  });
  time("fence: record legacy + 32 idle streams wait on it", [&](int i) {
    check(cuEventRecord(events[i], CU_STREAM_LEGACY), "cuEventRecord");
    for (CUstream s : idle) check(cuStreamWaitEvent(s, events[i], 0), "cuStreamWaitEvent");
  });

  int driver = 0;
  cuDriverGetVersion(&driver);
  char name[128] = {};
  cuDeviceGetName(name, sizeof name, dev);
  std::printf("# %s, driver API %d, %d non-blocking streams, the legacy stream busy\n", name,
              driver, kStreams);
  std::printf("| call | host us per call |\n|---|---|\n");
  for (const Row& r : rows) std::printf("| %s | %.2f |\n", r.what, r.us);
  cuMemFree(buf);
  return 0;
}
