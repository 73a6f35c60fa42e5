// Every live publisher of the process, for the handlers that outlive their owners' control: at
// exit each stops and removes its page; around fork() none is inside its allocator, and the
// child's list starts empty (the parent's pages stay the parent's).
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "publisher_state.hpp"

namespace cuarena::monitor::detail {

namespace {

using State = MonitorPublisher::State;

struct Registry {
  std::mutex mu;
  std::vector<State*> live;  // under mu
};

// Never destroyed: a publisher may outlive the static destructors (an owner leaked on purpose).
Registry& registry() {
  static Registry* const r = new Registry();
  return *r;
}

void stop_all_at_exit() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  for (State* s : r.live) s->stop();
  r.live.clear();
}

// Publisher threads inside their allocator, and whether a fork() waits for them (Dekker's
// pattern: both sides store, then load the other's, sequentially consistent).
std::atomic<int> g_reading{0};
std::atomic<bool> g_forking{false};

// Holds no lock across fork(): a lock taken here and one the program holds while creating a
// publisher (the shim's, the drop-in's) could be taken in opposite orders.
void before_fork() {
  g_forking.store(true);
  while (g_reading.load() != 0) std::this_thread::yield();
}

void after_fork_in_parent() { g_forking.store(false); }

void after_fork_in_child() {
  // The parent's publishers: their threads are not here, their pages are not ours. A thread
  // that held the list's lock is not here either: a fresh lock and list (the old ones leak).
  Registry& r = registry();
  // The parent's list is not freed (a thread may have been changing it), but kept reachable, so
  // a leak checker in the child does not report it: the bytes of the vector itself are kept.
  static unsigned char abandoned[16][sizeof(std::vector<State*>)];
  static int forks = 0;
  if (forks < 16) std::memcpy(abandoned[forks++], static_cast<void*>(&r.live), sizeof r.live);
  new (&r.mu) std::mutex();
  new (&r.live) std::vector<State*>();
  g_reading.store(0);
  g_forking.store(false);
}

}  // namespace

bool register_publisher(State* s) {
  static const bool handlers = [] {
    std::atexit(stop_all_at_exit);
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
    return true;
  }();
  (void)handlers;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  if (std::any_of(r.live.begin(), r.live.end(),
                  [&](const State* other) { return other->name() == s->name(); }))
    return false;
  r.live.push_back(s);
  return true;
}

void unregister_publisher(State* s) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.live.erase(std::remove(r.live.begin(), r.live.end(), s), r.live.end());
}

bool begin_allocator_read() {
  g_reading.fetch_add(1);
  if (!g_forking.load()) return true;
  g_reading.fetch_sub(1);
  return false;
}

void end_allocator_read() { g_reading.fetch_sub(1); }

}  // namespace cuarena::monitor::detail
