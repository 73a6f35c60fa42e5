// Shim: the process-wide state of libcuarena_preload.so: settings, one DeviceState per CUDA
// context (created on first use), the memory this process imported through IPC tickets, the
// counters of the exit summary, the log and the trace.
//
// It is created when the library loads (before main) and never destroyed: at exit the driver may
// already be unloading, and the job's last frees can come after static destructors.
//
// Thread semantics: every member is safe to call concurrently. After fork() the child starts
// with no device state (CUDA does not survive fork; the parent's pointers mean nothing there).
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <map>
#include <memory>
#include <mutex>

#include "device_state.hpp"
#include "shim_config.hpp"
#include "trace_recorder.hpp"

namespace cuarena::shim {

class Shim {
 public:
  static Shim& get();

  const ShimConfig& config() const { return config_; }
  TraceRecorder* trace() { return trace_.get(); }

  /// The state of the current context, created on first use. nullptr when no context is current
  /// (`no_context` true) or cuarena cannot serve this context (calls pass through).
  DeviceState* current(bool* no_context = nullptr);
  /// The state of `context`, as current() does for the current one.
  DeviceState* of_context(CUcontext context);
  /// The state whose live allocation starts at `ptr` (filling `block`), or nullptr.
  DeviceState* owner(DevicePtr ptr, Allocator::BlockInfo& block);
  /// The state whose address space holds `ptr` (live or not), or nullptr.
  DeviceState* holder(DevicePtr ptr);

  /// Memory imported from another process with an IPC ticket, unmapped when closed.
  void add_import(CUdeviceptr ptr, std::shared_ptr<void> mapping);
  bool close_import(CUdeviceptr ptr);

  /// Host time the served calls spent, by part (nanoseconds, all threads), for the summary: what
  /// the shim costs the program beside the device's own work.
  enum class Part : int { kAlloc, kFree, kCore, kFence, kCount };
  /// Whether anything will read those times (the summary line prints with CUARENA_SUMMARY or
  /// CUARENA_LOG): otherwise the hot path reads no clock.
  bool timing() const { return config_.summary || log_ != nullptr; }
  void spent(Part part, std::uint64_t ns) {
    spent_[std::size_t(part)].fetch_add(ns, std::memory_order_relaxed);
  }

  void served() { served_.fetch_add(1, std::memory_order_relaxed); }
  void passed() { passed_.fetch_add(1, std::memory_order_relaxed); }
  bool logging() const { return log_ != nullptr; }
  /// One line "cuarena: ..." to the log (CUARENA_LOG), printf-style.
  void log(const char* format, ...) __attribute__((format(printf, 2, 3)));

  /// The exit summary line (without the prefix). CUARENA_SUMMARY prints it in every process that
  /// made a device-memory call.
  std::string summary();
  void at_exit();
  void after_fork_in_child();

 private:
  Shim();
  static constexpr int kMaxStates = 64;
  struct Slot {
    std::atomic<CUcontext> context{nullptr};
    std::atomic<DeviceState*> state{nullptr};  // null with a context set: served by the driver
  };

  ShimConfig config_;
  std::unique_ptr<TraceRecorder> trace_;
  std::FILE* log_ = nullptr;
  int stderr_fd_ = 2;  // a copy of the job's stderr: programs may close theirs at exit
  std::mutex log_mu_;
  std::mutex create_mu_;  // guards creating states and the slots' writes
  std::array<Slot, kMaxStates> slots_;
  std::atomic<int> count_{0};
  std::mutex import_mu_;
  std::map<CUdeviceptr, std::shared_ptr<void>> imports_;
  std::atomic<std::uint64_t> served_{0};
  std::atomic<std::uint64_t> passed_{0};
  std::array<std::atomic<std::uint64_t>, std::size_t(Part::kCount)> spent_{};
};

/// Adds the time from its construction to its destruction to one of Shim::spent's parts.
class SpentTimer {
 public:
  explicit SpentTimer(Shim::Part part) : part_(part), on_(Shim::get().timing()) {
    if (on_) start_ = std::chrono::steady_clock::now();
  }
  ~SpentTimer() {
    if (!on_) return;
    Shim::get().spent(part_, std::uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               std::chrono::steady_clock::now() - start_)
                                               .count()));
  }
  SpentTimer(const SpentTimer&) = delete;
  SpentTimer& operator=(const SpentTimer&) = delete;

 private:
  Shim::Part part_;
  bool on_;
  std::chrono::steady_clock::time_point start_{};
};

}  // namespace cuarena::shim
