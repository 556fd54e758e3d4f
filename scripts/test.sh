#!/usr/bin/env bash
# Sets laga up (scripts/setup.sh) and runs the whole test suite: GoogleTest claims and the script checks
# (the CLI, MPI, PyTorch autograd on dumped tensors) on the release build (build/); then the GoogleTests
# and three script checks (MPI, failing ranks, bad input) on the AddressSanitizer +
# UndefinedBehaviorSanitizer build (CMake preset `asan`, build-asan/); then every fuzz target for a bounded time
# (scripts/fuzz.sh, LAGA_FUZZ_SECONDS each, default 60). On a CPU with AVX-512 the isa-labelled tests
# also run under LAGA_MAX_ISA=avx2 (stage avx2), so the AVX2 path is tested there too. Prints the time
# of each stage. LAGA_TEST_STAGES picks stages (default "release avx2 asan fuzz"), e.g. "release avx2".
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
report() { printf 'test.sh: %s\n' "${timings[@]}"; }
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
  # Instrumented: the GoogleTests (every op, form and collective of the library) and three script
  # checks: the MPI backend against threads (comm_mpi), failing and killed ranks (faults) and the CLI's
  # bad input (cli_bad_input). The other script checks and the DeepSeek-V3-scale runs stay in the
  # release stage: 3-5x slower under the sanitizers (the MPI form sweeps 4-6 minutes each), they would
  # take most of CI's budget and reach no library code path these miss.
  stage "asan tests" bash -c "ctest --test-dir build-asan --output-on-failure -j 2 --timeout 1800 -L unit &&
    ctest --test-dir build-asan --output-on-failure -j 2 --timeout 1800 -R '^script\\.(comm_mpi|faults|cli_bad_input)\$'"
fi
if wants fuzz; then
  stage "fuzz build + run" ./scripts/fuzz.sh
fi
