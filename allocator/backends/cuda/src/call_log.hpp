// CallLog: counts driver calls and their host wall time, per call name, in microseconds.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace cuarena::cuda {

/// Calls are made under the owning allocator's lock; us() may be read from any thread at any
/// time (the adapter's stats() does), so the map is guarded by its own lock (uncontended: one
/// atomic pair per driver call of 1-40 us).
class CallLog {
 public:
  /// Runs f() (one driver call) as `call` (a string literal) and returns its result.
  template <class F>
  auto operator()(const char* call, F&& f) {
    ++calls_;
    return time(call, std::forward<F>(f));
  }
  /// Times f() as `call` without counting it among calls() (event records and queries are not
  /// memory calls).
  template <class F>
  auto time(const char* call, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    auto result = f();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard lock(mu_);
    us_[call] += us;
    return result;
  }
  std::size_t calls() const { return calls_; }
  std::map<std::string, double> us() const {
    std::lock_guard lock(mu_);
    return {us_.begin(), us_.end()};
  }

 private:
  mutable std::mutex mu_;
  std::map<const char*, double> us_;  // keyed by the literal's address: no string per call
  std::size_t calls_ = 0;
};

}  // namespace cuarena::cuda
