#!/usr/bin/env bash
# verify's and bench's memory estimates (planned before anything is allocated; a run above the limit
# is refused) against what the process held: each prints its estimate and its measured peak RSS
# (VmHWM) in its JSON, and the measured peak must stay at or under the estimate. The cases are chosen
# where the estimate is tight: tiny at a long T (the [T, B, D] arrays and the activations dominate),
# deepseek-v2-lite at a short T (the weights' fp64 copies dominate), and bench with and without its
# validation (the caching allocator's blocks kept between the forms of a timed round).
# Under the sanitizers the process holds their shadow memory and quarantine too: skipped (77).
# Usage: memory_estimate.sh <laga binary> <source dir>
set -u
laga=$1
if [ -n "${LAGA_SANITIZED:-}" ]; then
  echo "skipped: a sanitized build's RSS holds the sanitizers' shadow memory, outside laga's estimates"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# check NAME -- laga arguments...: runs them with --json, compares peak_rss_bytes with estimated_peak_bytes.
check() {
  local name=$1
  shift 2
  if ! "$laga" "$@" --json "$tmp/$name.json" >"$tmp/$name.out" 2>&1; then
    echo "FAIL: laga $* exited non-zero:"; tail -5 "$tmp/$name.out"
    failures=$((failures + 1))
    return
  fi
  if ! /usr/bin/python3 - "$tmp/$name.json" "$*" <<'PY'; then failures=$((failures + 1)); fi
import json, sys
m = json.load(open(sys.argv[1]))["memory"]
est, rss = m["estimated_peak_bytes"], m["peak_rss_bytes"]
ok = 0 < rss <= est
print(f"{'ok' if ok else 'FAIL'}: laga {sys.argv[2]}: measured peak RSS {rss / 2**20:.1f} MiB, "
      f"estimated {est / 2**20:.1f} MiB ({rss / est:.3f} of it)")
sys.exit(0 if ok else 1)
PY
}

check tiny_long -- verify --model tiny --seq 4096 --sp 1,4,8 --dtype fp32
check lite_short -- verify --model deepseek-v2-lite --seq 16 --sp 1,2 --dtype fp32
check bench_validated -- bench --model small --seq 1024 --sp 2 --forms explicit,absorbed,laga --iters 1
check bench_rounds -- bench --model small --seq 2048 --sp 2 --forms explicit,absorbed-expanded,absorbed-shared,laga --iters 1 --no-validate

[ "$failures" -eq 0 ] || { echo "$failures case(s) failed"; exit 1; }
echo "all cases under their estimates"
