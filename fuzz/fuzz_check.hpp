// What the fuzz targets share: a check that aborts (so libFuzzer, or the replay driver, reports the
// input), and the one kind of failure an input may cause — a laga usage error.
//
// Not here: the targets themselves (fuzz_*.cpp) or how they are run (fuzz/CMakeLists.txt,
// scripts/fuzz.sh).
#pragma once

#include <cstdio>
#include <cstdlib>

#include "laga/core/error.hpp"

// An invariant of the target's oracle; failing it reports the input as a finding.
#define FUZZ_CHECK(cond, what)                                                            \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "fuzz check failed at %s:%d: %s\n", __FILE__, __LINE__, what); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

namespace laga::fuzz {

// Runs f. True when it threw a laga usage error (the clear error bad input deserves), false when it
// returned. Any other exception — a laga failure or internal error, a std::exception — aborts: bad
// input must never look like a broken laga (exit 3) or a failed check (exit 1).
template <class F>
bool expect_usage_error(F&& f) {
  try {
    f();
    return false;
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::usage) return true;
    std::fprintf(stderr, "fuzz: a laga error that is not a usage error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: an exception that is not a laga error: %s\n", e.what());
  }
  std::abort();
}

}  // namespace laga::fuzz
