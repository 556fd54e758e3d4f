#!/usr/bin/env bash
# Sets laga up (scripts/setup.sh) and runs the whole test suite: GoogleTest claims and the script checks
# (the CLI, MPI, PyTorch autograd on dumped tensors) on the release build (build/); then the same whole
# suite on the AddressSanitizer + UndefinedBehaviorSanitizer build (CMake preset `asan`, build-asan/),
# whose laga is the one the script checks run; then every fuzz target for a bounded time
# (scripts/fuzz.sh, LAGA_FUZZ_SECONDS each, default 60). Prints the time of each stage.
# LAGA_TEST_STAGES picks stages (default "release asan fuzz"), e.g. LAGA_TEST_STAGES=release.
set -euo pipefail
cd "$(dirname "$0")/.."
stages=${LAGA_TEST_STAGES:-release asan fuzz}
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
report() { printf 'test.sh: %s\n' "${timings[@]}"; }
trap report EXIT

stage "setup + release build" ./scripts/setup.sh
if wants release; then
  stage "release tests" ctest --test-dir build --output-on-failure -j 2 --timeout 900
fi
if wants asan; then
  stage "asan build" bash -c "cmake --preset asan >/dev/null && cmake --build --preset asan -j $jobs"
  # The DeepSeek-V3-scale runs (minutes of full-size compute each, ~10 GB) stay in the release stage:
  # instrumented, they would take most of CI's budget and add no code path the small configs miss.
  stage "asan tests" ctest --test-dir build-asan --output-on-failure -j 2 --timeout 1800 -E 'script\.deepseek_v3_scale'
fi
if wants fuzz; then
  stage "fuzz build + run" ./scripts/fuzz.sh
fi
