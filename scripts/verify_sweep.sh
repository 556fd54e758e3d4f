#!/usr/bin/env bash
# The verification sweep: `laga verify` (every registered form at P = 1, 2, 4, 8 against the fp64
# reference, by the rule of verify/compare.hpp) over presets tiny, small and deepseek-v2-lite ×
# T from 16 to 512 (powers of two and not) × both kernels × both dtypes × L 1–2 × B 1–2 × seeds
# (bf16 with the second seed: dlatent's partial sums in fp32).
# Every case must pass; a failing case is printed with the command that reproduces it. A passing one
# prints its worst ratio to what the rule allows and its wall seconds.
#
#   scripts/verify_sweep.sh                 every case (hours on two cores: deepseek-v2-lite's fp64
#                                           reference is the cost)
#   scripts/verify_sweep.sh --sample N      N cases drawn at random (seed printed; LAGA_SWEEP_SEED fixes it)
#   scripts/verify_sweep.sh --quick ...     the tiny preset only (seconds per case): what the test suite
#                                           samples every run (tests/cli/verify_sample.sh)
#   scripts/verify_sweep.sh --models small  these presets only (comma-separated)
#   scripts/verify_sweep.sh --resume LOG    skip the cases LOG (this script's earlier output) shows
#                                           passed: a sweep of hours continued where it stopped
#   scripts/verify_sweep.sh --from K        begin at the K-th case of the whole sweep's order (1-based; the
#                                           cases before it are not run, and the output says so): a sweep
#                                           continued when the earlier log is gone but its end is known
#   scripts/verify_sweep.sh --to K          end at the K-th case (with --from: one range of cases, e.g. the
#                                           gap an earlier log left)
#   LAGA=path/to/laga                       the binary (default build/laga)
# Exit status: 0 every case passed, 1 some failed, 2 bad usage.
set -u
cd "$(dirname "$0")/.."
laga=${LAGA:-build/laga}
[ -x "$laga" ] || { echo "verify_sweep: $laga is not built; run scripts/setup.sh or set LAGA" >&2; exit 2; }
sample=0
resume=
from=1
to=0
models="tiny small deepseek-v2-lite"
while [ $# -gt 0 ]; do
  case $1 in
    --quick) models=tiny; shift ;;
    --models)
      [ $# -ge 2 ] && [ -n "$2" ] || { echo "usage: $0 [--quick] [--models tiny,small,deepseek-v2-lite] [--sample N]" >&2; exit 2; }
      models=${2//,/ }; shift 2 ;;
    --sample)
      [ $# -ge 2 ] && [[ $2 =~ ^[0-9]+$ ]] || { echo "usage: $0 [--quick] [--sample N]" >&2; exit 2; }
      sample=$2; shift 2 ;;
    --resume)
      [ $# -ge 2 ] && [ -r "$2" ] || { echo "usage: $0 --resume LOG: LOG must be a readable file (this script's earlier output)" >&2; exit 2; }
      resume=$2; shift 2 ;;
    --from)
      [ $# -ge 2 ] && [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 --from K: K must be a case number ≥ 1, e.g. --from 529" >&2; exit 2; }
      from=$2; shift 2 ;;
    --to)
      [ $# -ge 2 ] && [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 --to K: K must be a case number ≥ 1, e.g. --to 960" >&2; exit 2; }
      to=$2; shift 2 ;;
    *) echo "usage: $0 [--quick] [--models LIST] [--sample N] [--resume LOG] [--from K] [--to K] (unknown argument '$1')" >&2; exit 2 ;;
  esac
done

cases=()
for model in $models; do
  for T in 16 24 40 64 104 128 200 256 392 512; do
    # Every P of 1, 2, 4, 8 that divides T and the model's heads (all three presets have H ≥ 8).
    sps=1; for P in 2 4 8; do [ $((T % P)) -eq 0 ] && sps="$sps,$P"; done
    for kernel in fused eager; do
      for dtype in bf16 fp32; do
        for L in 1 2; do
          for B in 1 2; do
            for seed in 1234 7; do
              # The second seed's bf16 cases send dlatent's partial sums in fp32 (docs/numerics.md).
              sum=storage; [ "$dtype" = bf16 ] && [ "$seed" = 7 ] && sum=fp32
              cases+=("--model $model --seq $T --sp $sps --kernel $kernel --dtype $dtype --layers $L --batch $B --seed $seed --dlatent-sum $sum")
            done
          done
        done
      done
    done
  done
done

if [ "$from" -gt 1 ] || [ "$to" -gt 0 ]; then
  n=${#cases[@]}
  [ "$to" -gt 0 ] || to=$n
  [ "$from" -le "$n" ] || { echo "verify_sweep: --from $from is past the last case ($n); valid: 1..$n" >&2; exit 2; }
  [ "$to" -le "$n" ] && [ "$to" -ge "$from" ] || { echo "verify_sweep: --to $to is not in $from..$n" >&2; exit 2; }
  echo "verify_sweep: cases $from..$to of $n: the others are not run here"
  cases=("${cases[@]:$((from - 1)):$((to - from + 1))}")
fi

if [ "$sample" -gt 0 ]; then
  seed=${LAGA_SWEEP_SEED:-$RANDOM}
  echo "verify_sweep: $sample of ${#cases[@]} cases, drawn with LAGA_SWEEP_SEED=$seed"
  mapfile -t cases < <(printf '%s\n' "${cases[@]}" | /usr/bin/python3 -c "
import random, sys
lines = sys.stdin.read().splitlines()
random.seed($seed)
print('\n'.join(random.sample(lines, min($sample, len(lines)))))")
else
  [ "${n:-0}" -gt 0 ] && echo "verify_sweep: ${#cases[@]} cases" || echo "verify_sweep: all ${#cases[@]} cases"
fi

if [ -n "$resume" ]; then
  # A case counts as passed only by its own "ok" line (the command after it, whole).
  declare -A passed=()
  while IFS= read -r line; do passed["${line#*laga verify }"]=1; done < <(grep -E '^ok +\(worst [0-9.]+ of allowed(; [0-9]+ s)?\) laga verify ' "$resume")
  todo=()
  for c in "${cases[@]}"; do [ -n "${passed[$c]:-}" ] || todo+=("$c"); done
  echo "verify_sweep: ${#passed[@]} cases passed in $resume; $((${#cases[@]} - ${#todo[@]})) of them skipped here, ${#todo[@]} to run"
  cases=("${todo[@]}")
fi

# A sample draws each case's ISA cap too (LAGA_MAX_ISA unset, avx2 or avx512; core/isa.hpp), from the
# same seed, unless LAGA_MAX_ISA is set for the whole run.
caps=()
if [ "$sample" -gt 0 ] && [ -z "${LAGA_MAX_ISA:-}" ]; then
  RANDOM=$seed
  for _ in "${cases[@]}"; do caps+=("$(printf '%s' "unset avx2 avx512" | cut -d' ' -f$((RANDOM % 3 + 1)))"); done
fi

failed=0
for i in "${!cases[@]}"; do
  c=${cases[$i]}
  cap=${caps[$i]:-}
  env_cap=(); shown=""
  if [ -n "$cap" ]; then
    shown="LAGA_MAX_ISA=$cap "
    [ "$cap" != unset ] && env_cap=("LAGA_MAX_ISA=$cap") || env_cap=(-u LAGA_MAX_ISA)
  fi
  start=$SECONDS
  # shellcheck disable=SC2086
  if out=$(env "${env_cap[@]}" "$laga" verify $c 2>&1); then
    worst=$(printf '%s\n' "$out" | awk '$1 ~ /^[0-9]+$/ && $7+0 > m { m = $7+0 } END { printf "%.3f", m }')
    echo "ok   (worst $worst of allowed; $((SECONDS - start)) s) ${shown}laga verify $c"
  else
    failed=$((failed + 1))
    echo "FAIL ${shown}laga verify $c"
    printf '%s\n' "$out" | grep -E "FAIL|laga:" | head -8
  fi
done
echo "verify_sweep: ${#cases[@]} cases, $failed failed"
[ "$failed" -eq 0 ]
