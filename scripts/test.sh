#!/usr/bin/env bash
# Sets laga up (scripts/setup.sh) and runs everything CI runs, stage by stage:
#   release  the whole suite (GoogleTests and script checks) on the release build (build/)
#   avx2     on a CPU with AVX-512, the isa-labelled part again under LAGA_MAX_ISA=avx2
#   asan     the sanitizer build (CMake preset `asan`: clang, ASan + UBSan, build-asan/, the fuzz
#            targets included) and on it the GoogleTests and three script checks (MPI against threads,
#            failing ranks, bad input)
#   fuzz     every fuzz target for LAGA_FUZZ_SECONDS each (scripts/fuzz.sh, default 45) on that build
# LAGA_TEST_STAGES picks stages (default "release avx2 asan fuzz"), e.g. "release". Prints each stage's
# time and the total against CI's budget: 40 minutes on 2 cores for a fresh clone, setup included.
set -euo pipefail
cd "$(dirname "$0")/.."
stages=${LAGA_TEST_STAGES:-release avx2 asan fuzz}
jobs=$(nproc)
timings=()

# stage NAME COMMAND...: runs the command, records its wall time.
stage() {
  local name=$1 start=$SECONDS
  shift
  echo "== test.sh: $name"
  "$@"
  timings+=("$(printf '%-22s %5d s' "$name" $((SECONDS - start)))")
}
wants() { [[ " $stages " == *" $1 "* ]]; }
budget_s=2400
report() {
  printf 'test.sh: %s\n' "${timings[@]}"
  printf 'test.sh: %-22s %5d s (CI budget %d s)\n' total "$SECONDS" "$budget_s"
}
trap report EXIT

stage "setup + release build" ./scripts/setup.sh
if wants release; then
  stage "release tests" ctest --test-dir build --output-on-failure -j 2 --timeout 900
fi
if wants avx2; then
  # The AVX2 path on a CPU that has AVX-512: the isa-labelled tests again under the cap (core/isa.hpp).
  if grep -qw avx512f /proc/cpuinfo; then
    stage "release tests, avx2 cap" env LAGA_MAX_ISA=avx2 \
      ctest --test-dir build --output-on-failure -j 2 --timeout 900 -L isa
  else
    echo "== test.sh: no AVX-512 on this CPU: the release tests ran the AVX2 path"
  fi
fi
if wants asan; then
  stage "asan build" bash -c "cmake --preset asan >/dev/null && cmake --build --preset asan -j $jobs"
  # Instrumented: the GoogleTests and the script checks labelled sanitize (tests/CMakeLists.txt).
  stage "asan tests" ctest --test-dir build-asan --output-on-failure -j 2 --timeout 1800 -L 'unit|sanitize'
fi
if wants fuzz; then
  stage "fuzz" ./scripts/fuzz.sh
fi
