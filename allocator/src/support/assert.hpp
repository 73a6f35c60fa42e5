// Invariant checks with compile-time debug levels (mimalloc's mi_assert family is the model).
//
// CUARENA_DEBUG (set by CMake; see the top-level CMakeLists.txt) picks what is compiled in:
//   0  nothing but CUARENA_CHECK;
//   1  CUARENA_ASSERT: O(1) checks on state the next step relies on (release builds);
//   2  CUARENA_ASSERT_INTERNAL: also O(1) checks on the core's own bookkeeping (list links);
//   3  CUARENA_EXPENSIVE: also whole-structure checks (check_invariants) at the entry of every
//      mutating Allocator call (the sanitizer builds).
// CUARENA_CHECK is always on: the check_invariants() functions are made of it, since tests call
// them in every build.
//
// A failed check throws std::logic_error ("cuarena invariant violated: <message> [<expression>
// at <file>:<line>]"), as check_invariants() always has: tests catch it, and in a noexcept
// context it terminates with the message.
#pragma once

#include <stdexcept>
#include <string>

#ifndef CUARENA_DEBUG
#define CUARENA_DEBUG 1
#endif

namespace cuarena::detail {

[[noreturn]] inline void invariant_failed(const char* file, int line, const char* expr,
                                          const std::string& message) {
  throw std::logic_error("cuarena invariant violated: " + message + " [" + expr + " at " + file +
                         ":" + std::to_string(line) + "]");
}

}  // namespace cuarena::detail

// The message is built only when the check fails.
#define CUARENA_CHECK(cond, message)                                                      \
  do {                                                                                    \
    if (!(cond)) ::cuarena::detail::invariant_failed(__FILE__, __LINE__, #cond, message); \
  } while (0)

#if CUARENA_DEBUG >= 1
#define CUARENA_ASSERT(cond, message) CUARENA_CHECK(cond, message)
#else
#define CUARENA_ASSERT(cond, message) \
  do {                                \
  } while (0)
#endif

#if CUARENA_DEBUG >= 2
#define CUARENA_ASSERT_INTERNAL(cond, message) CUARENA_CHECK(cond, message)
#else
#define CUARENA_ASSERT_INTERNAL(cond, message) \
  do {                                         \
  } while (0)
#endif

// Runs `call`, a check that throws on a violation (check_invariants), at level 3 only.
#if CUARENA_DEBUG >= 3
#define CUARENA_EXPENSIVE(call) \
  do {                          \
    call;                       \
  } while (0)
#else
#define CUARENA_EXPENSIVE(call) \
  do {                          \
  } while (0)
#endif
