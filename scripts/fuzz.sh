#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ in the sanitizer build (CMake preset `asan`: clang, ASan +
# UBSan, build-asan/, the same build the sanitized tests run from) and runs each for a bounded time —
# LAGA_FUZZ_SECONDS (default 45) per target, at most 2 GB of memory and 10 s per input — from its
# committed seeds (fuzz/corpus/<target>/) and past crashes (fuzz/regressions/<target>/). New inputs the
# fuzzer finds go to build-asan/corpus/<target>/, never into the source tree; a crash, a leak, a hang
# or a failed oracle stops the script with the input saved in build-asan/artifacts/.
# Prints the executions and the findings of each target.
# Usage: scripts/fuzz.sh [--seconds N] [target...]   (--seconds overrides LAGA_FUZZ_SECONDS, for a long
# campaign, e.g. --seconds 3600; CI keeps the short default)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
seconds=${LAGA_FUZZ_SECONDS:-45}
all_targets=(safetensors config cli train_manifest)
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) [ $# -ge 2 ] || { echo "fuzz: --seconds needs a number" >&2; exit 2; }; seconds=$2; shift 2 ;;
    --seconds=*) seconds=${1#--seconds=}; shift ;;
    *) targets+=("$1"); shift ;;
  esac
done
[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: --seconds / LAGA_FUZZ_SECONDS '$seconds' is not a positive integer" >&2; exit 2; }
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")

command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (Debian: clang libclang-rt-14-dev)" >&2; exit 1; }
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$(nproc)" --target laga_fuzzers

build=$root/build-asan
# fuzz_safetensors writes each input to a scratch file: in memory when possible (3-4x the executions).
if [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
summary=()
for target in "${targets[@]}"; do
  exe=$build/fuzz/fuzz_$target
  [ -x "$exe" ] || { echo "fuzz: no target '$target' (have: ${all_targets[*]})" >&2; exit 2; }
  corpus=$build/corpus/$target
  artifacts=$build/artifacts/$target
  mkdir -p "$corpus" "$artifacts"
  seeds=("$root/fuzz/corpus/$target")
  [ -d "$root/fuzz/regressions/$target" ] && seeds+=("$root/fuzz/regressions/$target")
  log=$build/fuzz_$target.log
  echo "fuzz: $target for $seconds s (log $log)"
  rc=0
  # fuzz_cli resolves --config against its working directory: fuzz/cli_cwd holds the files it may name.
  (cd "$root/fuzz/cli_cwd" &&
    "$exe" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
      -dict="$root/fuzz/$target.dict" -artifact_prefix="$artifacts/" "$corpus" "${seeds[@]}") >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: $target FAILED (exit $rc) after ${runs:-?} executions; input saved in $artifacts:" >&2
    grep -E "ERROR|fuzz check failed|fuzz:|runtime error|Test unit written" "$log" | head -20 >&2
    exit 1
  fi
  summary+=("$target: ${runs:-?} executions in $seconds s, ${cov:-cov: ?}, corpus $(ls "$corpus" | wc -l) inputs, no findings")
done
printf 'fuzz: %s\n' "${summary[@]}"
