#!/usr/bin/env bash
# `laga verify` and `laga train` end to end on the tiny preset: verify passes for both dtypes and
# kernels with P = 1, 2, 4, 8 and writes the JSON keys of docs/cli.md §7; train's losses decrease and the
# three forms' curves agree, and so do the ring forms' with explicit's; run --json carries the per-rank
# keys; bench prints validated rows.
# Usage: verify_train.sh <laga binary> <source dir>
set -u
laga=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/check.bash"  # fail, ok, json_has; failures counts

for dtype in fp32 bf16; do
  for kernel in fused eager; do
    f="$work/verify.$dtype.$kernel.json"
    if "$laga" verify --model tiny --seq 16 --batch 2 --layers 2 --dtype "$dtype" --kernel "$kernel" --sp 1,2,4,8 \
        --json "$f" >"$work/out" 2>&1; then
      echo "ok: verify $dtype $kernel"
    else
      fail "verify $dtype $kernel: $(tail -25 "$work/out")"
    fi
    json_has "$f" "j['pass'] and all(k in c for c in j['cases'] for k in ('sp','form','vs','bitwise','max_abs_diff')) \
      and any(c['sp']==1 and c['form']=='laga' and c['bitwise'] for c in j['cases']) \
      and all('dwkv_b' in c['max_abs_diff'] and 'y' in c['max_abs_diff'] for c in j['cases'])" \
      || fail "verify $dtype $kernel JSON lacks the contract's keys or a bit-identical P = 1 case"
  done
done

f="$work/train.json"
if "$laga" train --model tiny --seq 32 --sp 4 --layers 2 --steps 200 --lr 3e-3 --dtype fp32 \
    --forms explicit,absorbed,laga --json "$f" >"$work/out" 2>&1; then
  echo "ok: train"
else
  fail "train: $(tail -8 "$work/out")"
fi
json_has "$f" "len(j['runs'])==3 and all(len(r['losses'])==200 and r['losses'][-1] < r['losses'][0] for r in j['runs'])" \
  || fail "train JSON: runs[i].losses missing or not decreasing"

# The ring forms hold zigzag tokens: their teacher runs in that layout (train.hpp), so their curves
# agree with explicit's too (they were 7 % off when the teacher ran explicit on the zigzag rows).
f="$work/train.ring.json"
if "$laga" train --model tiny --seq 32 --sp 2 --steps 40 --lr 1e-2 --dtype fp32 --forms explicit,ring-kv,ring-latent \
    --json "$f" >"$work/out" 2>&1 && json_has "$f" "j['pass'] and all(r['max_rel_vs_first'] <= 1e-3 for r in j['runs'])"; then
  echo "ok: train of the ring forms agrees with explicit's"
else
  fail "train of the ring forms: $(tail -4 "$work/out")"
fi

f="$work/run.json"
"$laga" run --model tiny --seq 16 --sp 4 --form laga --json "$f" >/dev/null 2>&1 || fail "run --json"
json_has "$f" "j['form']=='laga' and j['sp']==4 and len(j['ranks'])==4 and all(k in r for r in j['ranks'] \
  for k in ('activation_peak_bytes','saved_bytes','time_s')) and all(r['comm']['tensor_bytes']>0 and \
  r['comm']['wire_bytes']>0 for r in j['ranks'])" || fail "run JSON lacks the contract's keys"

f="$work/bench.json"
"$laga" bench --model tiny --seq 16,32 --sp 2 --forms explicit,absorbed,laga --iters 2 --json "$f" >"$work/out" 2>&1 \
  || fail "bench: $(tail -5 "$work/out")"
json_has "$f" "len(j['rows'])==6 and j['pass'] and all(k in r for r in j['rows'] for k in \
  ('form','variant','seq','sp','tokens_per_s','fwd_s','bwd_s','comm_s','tflops','total_s','total_s_min', \
  'total_s_max','speedup_vs_explicit','wrong','collectives'))" || fail "bench JSON lacks the contract's keys"

[ "$failures" -eq 0 ] && echo "verify_train: all cases pass" || echo "verify_train: $failures failures"
[ "$failures" -eq 0 ]
