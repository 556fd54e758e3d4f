#!/usr/bin/env bash
# laga bench's claims (docs/benchmarks.md §7): the header names machine, CPU, threads per rank, link
# (LAGA_LINK when set), dtype, kernel and commit; the JSON carries every row key of the contract and the
# spread, validation and per-collective keys; validation catches a wrong result — one form's output
# shifted beyond the bound (P 2), by a fraction of an ulp at P 1 for a form exact at one rank (bitwise),
# a NaN input (every row non-finite) — with #wrong > 0, a "# FAIL" message and exit 1 after every row,
# while a shift well inside the bound passes (the bound is not tighter than the rule); --no-validate
# says so; the progress line appears on a terminal's stderr and never when stderr is not one.
# Usage: bench.sh <laga binary> <source dir>
set -u
laga=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/check.bash"  # fail, ok, json_has; failures counts
common=(--model tiny --seq 16,32 --forms explicit,absorbed,laga --iters 3 --warmup 1)

# 1. A clean run: exit 0, header, JSON keys.
f="$work/bench.json"
if LAGA_LINK="emulated test link" "$laga" bench "${common[@]}" --sp 2 --dtype fp32 --profile --json "$f" >"$work/out" 2>"$work/err"; then
  ok "bench tiny P 2 fp32"
else
  fail "bench tiny P 2: $(tail -5 "$work/out" "$work/err")"
fi
for pattern in "^# machine: " "threads per rank: [0-9]" "link: emulated test link" "dtype fp32" "kernel fused" \
    "commit " "^# validation: verify's rule at T 16" "#wrong" "^bench: pass" "^# time by op class" \
    "^#    seq form  *matmul  GFLOP/s  attn fwd"; do
  grep -q -- "$pattern" "$work/out" || fail "bench output lacks /$pattern/"
done
json_has "$f" "len(j['rows'])==6 and j['wrong']==0 and j['pass'] and j['link']=='emulated test link' \
  and j['threads_per_rank']>=1 and j['dtype']=='fp32' and j['kernel']=='fused' and j['commit'] and j['cpu_model'] \
  and j['iters']==3 and j['warmup']==1 and j['validation']['enabled'] and j['validation']['reduced_seq']==16 \
  and j['validation']['reduced_pass'] \
  and all(k in r for r in j['rows'] for k in ('form','variant','seq','sp','tokens_per_s','fwd_s','bwd_s','comm_s', \
    'tflops','total_s','total_s_min','total_s_max','speedup_vs_explicit','fwd_s_min','fwd_s_max','bwd_s_min', \
    'bwd_s_max','comm_s_min','comm_s_max','comm_all_s','comm_hidden_s','comm_skew_s','wrong','validation','collectives', \
    'flops_fwd','flops_bwd','kernel','dtype','batch','layers','iters')) \
  and all(r['fwd_s_min']<=r['fwd_s']<=r['fwd_s_max'] and r['total_s_min']<=r['total_s']<=r['total_s_max'] \
    and r['wrong']==0 and r['validation']['validated'] for r in j['rows']) \
  and all(r['validation']['vs_explicit']==('reference' if r['variant']=='explicit' else 'bound') for r in j['rows']) \
  and all(0 <= r['validation']['worst_ratio'] <= 1 for r in j['rows'] if r['variant']!='explicit') \
  and all(set(c) >= {'op','count','tensor_bytes','wire_bytes','seconds','exposed_s','hidden_s'} \
    for r in j['rows'] for c in r['collectives'].values()) \
  and {'q','k','v','o','do','dq','dk','dv'} <= set(next(r for r in j['rows'] if r['variant']=='explicit')['collectives']) \
  and {'q','latent','o','do','dlatent','dq'} <= set(next(r for r in j['rows'] if r['variant']=='laga')['collectives']) \
  and next(r for r in j['rows'] if r['variant']=='laga')['collectives']['latent']['op']=='all_gather'" \
  && ok "bench JSON keys" || fail "bench JSON lacks keys or values"
# --profile: each row's FLOPs by op class are the block's, counted here from the config: every
# projection once forward and twice backward (explicit and laga execute the same up-projection work),
# attention FlashAttention-3 style (backward 2.5×); the eager kernel's products count as attention.
json_has "$f" "all(p['matmul']['flops'] == 3*2*(c['hidden_size']*c['q_lora_rank'] \
    + c['q_lora_rank']*c['num_attention_heads']*(c['qk_nope_head_dim']+c['qk_rope_head_dim']) \
    + c['hidden_size']*(c['kv_lora_rank']+c['qk_rope_head_dim']) \
    + c['kv_lora_rank']*c['num_attention_heads']*(c['qk_nope_head_dim']+c['v_head_dim']) \
    + c['num_attention_heads']*c['v_head_dim']*c['hidden_size']) * r['seq']*r['batch']//r['sp']*r['layers'] \
  and p['attention_fwd']['flops'] == 2*r['batch']*c['num_attention_heads']//r['sp']*r['seq']*(r['seq']+1)/2 \
    *(c['qk_nope_head_dim']+c['qk_rope_head_dim']+c['v_head_dim'])*r['layers'] \
  and p['attention_bwd']['flops'] == 2.5*p['attention_fwd']['flops'] \
  and p['attention_fwd']['calls'] == r['layers'] and p['matmul']['calls'] > 0 and p['other_s'] == p['other_s'] \
  and sum(v['calls'] for v in p['rank0_last_iteration']['matmul_shapes'].values()) == p['matmul']['calls'] \
  for c in [j['config']] for r in j['rows'] if r['variant'] in ('explicit','laga') for p in [r['profile']])" \
  && ok "bench --profile FLOPs by class" || fail "bench --profile: FLOPs by class differ from the config's"
unset LAGA_LINK
LAGA_LINK= "$laga" bench --model tiny --seq 16 --forms explicit --iters 1 >"$work/out" 2>&1 || fail "bench explicit alone"
grep -q "link: in-process threads" "$work/out" || fail "bench without LAGA_LINK does not say in-process threads"

# 1b. The skew column: of the exposed comm, the time ranks waited for each other. A rank slowed by 50 ms
# per layer (--inject-fault 1:slow, L 2) makes the other wait about 100 ms per step, less whatever the
# host took from the waiting rank meanwhile: under ctest -j 2 ring-kv's row once read 0.084 s. So every
# row is at least half the injected 0.1 s (without the fault the skew is a few ms) and the largest at
# least 0.09 s; at P 1 no rank waits for another, so the skew is exactly 0.
if "$laga" bench --model tiny --seq 32 --sp 2 --layers 2 --forms explicit,laga,ring-kv --iters 2 --warmup 1 \
    --no-validate --inject-fault 1:slow --json "$work/slow.json" >"$work/out" 2>&1; then
  json_has "$work/slow.json" "all(0.05 <= r['comm_skew_s'] <= 0.2 and r['comm_skew_s'] <= r['comm_s'] \
      and r['total_s'] >= 0.1 for r in j['rows']) and max(r['comm_skew_s'] for r in j['rows']) >= 0.09" \
    && ok "bench skew with rank 1 slowed 2 × 50 ms: $(/usr/bin/python3 -c "import json; print([round(r['comm_skew_s'],3) for r in json.load(open('$work/slow.json'))['rows']])") s" \
    || fail "bench skew with a slowed rank: $(grep -A5 '# *seq' "$work/out")"
else
  fail "bench --inject-fault 1:slow: $(tail -3 "$work/out")"
fi
"$laga" bench --model tiny --seq 32 --sp 1 --forms explicit,laga --iters 2 --no-validate --json "$work/one.json" >/dev/null 2>&1 \
  && json_has "$work/one.json" "all(r['comm_skew_s'] == 0 for r in j['rows'])" \
  && ok "bench skew 0 at P 1" || fail "bench at P 1: skew not 0"

# 2. Validation catches a wrong result, reports it in its row, prints why, and exits 1 after every row.
expect_wrong() {  # name, pattern of the FAIL line, python expression over j, bench arguments...
  local name=$1 pattern=$2 cond=$3
  shift 3
  "$laga" bench "$@" --json "$work/w.json" >"$work/out" 2>"$work/err"
  local status=$?
  if [ "$status" -eq 1 ] && grep -q -- "$pattern" "$work/out" && grep -q "validation check(s) failed" "$work/err" \
      && [ "$(grep -c '^  *[0-9]' "$work/out")" -eq "$(/usr/bin/python3 -c "import json; print(len(json.load(open('$work/w.json'))['rows']))")" ] \
      && json_has "$work/w.json" "not j['pass'] and j['wrong']>0 and ($cond)"; then
    ok "$name -> status 1: $(grep -m1 -- "$pattern" "$work/out")"
  else
    fail "$name -> status $status: $(tail -4 "$work/out") $(tail -2 "$work/err")"
  fi
}
wrong_only() {  # the rows of form $1 have #wrong > 0, every other row 0
  echo "all((r['wrong']>0)==(r['variant']=='$1') for r in j['rows'])"
}
expect_wrong "laga's y shifted by 1e4 ulps at P 2" "# FAIL T 16 laga: laga vs explicit: max|Δ y|" "$(wrong_only laga)" \
  "${common[@]}" --sp 2 --dtype fp32 --inject-wrong laga:1e4
expect_wrong "absorbed's y shifted by 64 ulps at P 2, bf16" "# FAIL T 32 absorbed-expanded: absorbed-expanded vs explicit: max|Δ y|" \
  "$(wrong_only absorbed-expanded)" "${common[@]}" --sp 2 --dtype bf16 --inject-wrong absorbed:64
expect_wrong "laga's y shifted by 0.25 ulp at P 1 (bitwise)" "not bit-identical to explicit at P 1 (first difference: y\[" \
  "$(wrong_only laga)" "${common[@]}" --sp 1 --dtype bf16 --inject-wrong laga:0.25
expect_wrong "a NaN in x (every form)" "non-finite value(s) in y" \
  "all(r['wrong']>0 for r in j['rows']) and not j['validation']['reduced_pass']" \
  "${common[@]}" --sp 2 --inject-fault 1:nan-x
# A shift well inside the bound is not a failure: the check is no tighter than the rule.
if "$laga" bench "${common[@]}" --sp 2 --dtype fp32 --inject-wrong laga:0.25 >"$work/out" 2>&1; then
  ok "laga's y shifted by 0.25 ulp at P 2 passes (inside the bound)"
else
  fail "a 0.25-ulp shift at P 2 failed: $(grep FAIL "$work/out" | head -2)"
fi

# 3. --no-validate says so.
"$laga" bench --model tiny --seq 16 --sp 2 --iters 1 --no-validate --json "$work/n.json" >"$work/out" 2>"$work/err" \
  || fail "bench --no-validate: $(tail -3 "$work/out")"
grep -q "validation: off (--no-validate)" "$work/out" && json_has "$work/n.json" \
  "not j['validation']['enabled'] and all(not r['validation']['validated'] for r in j['rows'])" \
  && ok "bench --no-validate says it did not validate" || fail "bench --no-validate output"

# 4. Progress: on a terminal's stderr one line rewritten with \r; nothing when stderr is not a terminal.
grep -q "bench: T" "$work/err" "$work/out" && fail "progress written to a stderr that is not a terminal" \
  || ok "no progress when stderr is not a terminal"
if command -v script >/dev/null; then
  script -qec "$laga bench --model tiny --seq 16 --sp 2 --iters 2 --forms explicit,laga" "$work/tty" >/dev/null 2>&1 \
    || fail "bench under a terminal"
  if grep -q 'bench: T 16 laga iteration 2/2, [0-9.]* s elapsed' "$work/tty" && grep -q $'\r' "$work/tty" \
      && grep -q "bench: pass" "$work/tty"; then
    ok "progress line on a terminal"
  else
    fail "no progress line on a terminal: $(tr '\r' '|' <"$work/tty" | head -c 400)"
  fi
fi

[ "$failures" -eq 0 ] && echo "bench: all cases pass" || echo "bench: $failures failures"
[ "$failures" -eq 0 ]
