#!/usr/bin/env bash
# Bad input to the CLI: each case must exit with status 2 and a one-line message naming the value
# (and, where one exists, a valid alternative). Usage: cli_bad_input.sh <laga binary> <source dir>
set -u
laga=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect STATUS PATTERN -- command...
expect() {
  local want=$1 pattern=$2
  shift 3
  local out status
  out=$("$@" 2>&1 >/dev/null)
  status=$?
  if [ "$status" -ne "$want" ] || ! grep -q -- "$pattern" <<<"$out"; then
    echo "FAIL: $* -> status $status (want $want), stderr: $out (want /$pattern/)"
    failures=$((failures + 1))
  else
    echo "ok: $* -> $status: $out"
  fi
  if [ "$(wc -l <<<"$out")" -gt 1 ]; then
    echo "FAIL: $* printed more than one line of error"
    failures=$((failures + 1))
  fi
}

expect 2 "unknown model preset 'gpt-2'; valid: deepseek-v3" -- "$laga" run --model gpt-2 --seq 16
# the allocator's switches take on or off: a misspelt value was once taken for "on"
expect 2 "LAGA_HUGE_PAGES='of' is not a valid value; valid: on or off (unset means on)" -- env LAGA_HUGE_PAGES=of "$laga" run --model tiny --seq 16
expect 2 "LAGA_ALLOC_CACHE='0' is not a valid value; valid: on or off" -- env LAGA_ALLOC_CACHE=0 "$laga" plan --model tiny --seq 16
# a seed is a whole number in [0, 2^64): CLI11 alone read -1 as 2^64 − 1 and clamped 2^64 to it
expect 2 "\-\-seed: '-1' is not a seed; give a whole number from 0 to 18446744073709551615" -- "$laga" plan --model tiny --seq 16 --seed -1
expect 2 "'18446744073709551616' is not a seed" -- "$laga" verify --model tiny --seq 16 --seed 18446744073709551616
expect 2 "\-\-seq = 64.5: not a whole number; give one, e.g. \-\-seq 1024" -- "$laga" plan --model tiny --seq 64.5
expect 2 "\-\-sp = 1,2,x: not a list of whole numbers; give e.g. \-\-sp 1,2,4" -- "$laga" verify --model tiny --seq 16 --sp 1,2,x
expect 2 "\-\-lr = fast: not a number; give one, e.g. \-\-lr 1e-3" -- "$laga" train --model tiny --seq 16 --lr fast
expect 2 "seq_len (--seq) = 0 must be positive" -- "$laga" run --model tiny --seq 0
expect 2 "\-\-sp 3 does not divide num_attention_heads 8; try 1, 2, 4, 8" -- "$laga" run --model tiny --seq 24 --sp 3
expect 2 "\-\-sp 4 does not divide --seq 18; try 1, 2, 3, 6, 9, 18" -- "$laga" run --model tiny --seq 18 --sp 4
expect 2 "unknown form 'fancy'; valid: explicit, absorbed-expanded, absorbed-shared, laga" -- "$laga" run --model tiny --seq 16 --form fancy
expect 2 "\-\-seq 36 is not a multiple of 2 × \-\-sp 4 = 8 (ring-kv's zigzag layout .*; try \-\-seq 32 or 40" -- "$laga" run --model tiny --seq 36 --sp 4 --form ring-kv
# --ulysses (laga-ulysses: laga's head scatter in groups × a ring over them; laga spelled with a Pu other
# than P names it): Pu divides P and H, 2·Pr divides T; a form that takes no --ulysses refuses one; a
# laga P that does not divide H names the --ulysses values that run laga-ulysses; plan, model and verify
# refuse a --ulysses that laga-ulysses runs at none of their P, naming why
expect 2 "\-\-ulysses 3 does not divide \-\-sp 8; try \-\-ulysses 1, 2, 4" -- "$laga" run --model tiny --seq 32 --sp 8 --form laga --ulysses 3
# the lightning indexer (DeepSeek Sparse Attention)
expect 2 "index_topk (\-\-index-topk) = 0 must be in \[1, .*\] (keys each query selects); try 8" -- "$laga" run --model tiny --seq 32 --form dsa-gather --index-topk 0
expect 2 "index_head_dim (\-\-index-dim) = 4 must be at least qk_rope_head_dim 8" -- "$laga" run --model tiny --seq 32 --form dsa-gather --index-dim 4
expect 2 "\-\-indexer-stage applies to the sparse forms (dsa-gather, dsa-regather), not to form 'laga', which ignores the indexer and has its own layout; try \-\-form dsa-gather, or drop \-\-indexer-stage" -- "$laga" run --model tiny --seq 32 --form laga --indexer-stage warmup
expect 2 "\-\-seq 36 is not a multiple of 2 × \-\-sp 4 = 8 (dsa-gather's zigzag layout .*; try \-\-seq 32 or 40, or \-\-cp-layout contiguous" -- "$laga" run --model tiny --seq 36 --sp 4 --form dsa-gather
expect 2 "unknown layout 'spiral' (\-\-cp-layout, JSON cp_layout); valid: zigzag, contiguous" -- "$laga" run --model tiny --seq 32 --form dsa-gather --cp-layout spiral
expect 2 "\-\-cp-layout applies to the sparse forms (dsa-gather, dsa-regather), not to form 'laga'" -- "$laga" run --model tiny --seq 32 --form laga --cp-layout zigzag
expect 2 "unknown indexer stage 'cold' (\-\-indexer-stage, JSON indexer_stage); valid: warmup, sparse" -- "$laga" run --model tiny --seq 32 --form dsa-gather --indexer-stage cold
expect 2 "form dsa-gather runs DeepSeek Sparse Attention's lightning indexer, and model 'deepseek-v3' has none; try \-\-model deepseek-v3.2" -- "$laga" run --model deepseek-v3 --seq 16 --form dsa-gather
expect 2 "\-\-ulysses 3 does not divide \-\-sp 8; try \-\-ulysses 1, 2, 4" -- "$laga" run --model tiny --seq 32 --sp 8 --form laga-ulysses --ulysses 3
expect 2 "\-\-ulysses 8 does not divide \-\-sp 4; try \-\-ulysses 1, 2" -- "$laga" run --model tiny --seq 32 --sp 4 --form laga --ulysses 8
expect 2 "\-\-ulysses 6 does not divide num_attention_heads 8; try \-\-ulysses 1, 2, 4" -- "$laga" run --model tiny --seq 48 --sp 12 --form laga --ulysses 6
expect 2 "\-\-ulysses 2 (head-scatter groups of that many ranks, a ring over them) applies to laga-ulysses only, not to form 'explicit'; try \-\-form laga-ulysses, or drop \-\-ulysses" -- "$laga" run --model tiny --seq 32 --sp 8 --form explicit --ulysses 2
expect 2 "\-\-seq 12 is not a multiple of 2 × (\-\-sp 4 / \-\-ulysses 1) = 8 .*; try \-\-seq 8 or 16" -- "$laga" run --model tiny --seq 12 --sp 4 --form laga --ulysses 1
expect 2 "\-\-sp 16 does not divide num_attention_heads 8; try 1, 2, 4, 8, or \-\-ulysses 2, 4, 8 (laga-ulysses" -- "$laga" run --model tiny --seq 16 --sp 16 --form laga
expect 2 "\-\-ulysses \-1 must be positive (or 0: none)" -- "$laga" run --model tiny --seq 32 --sp 4 --form laga-ulysses --ulysses -1
expect 2 "\-\-ulysses 3 sets the head-scatter groups of laga-ulysses, which cannot run it: \-\-ulysses 3 does not divide \-\-sp 32" -- "$laga" plan --model deepseek-v2-lite --seq 4096 --sp 32 --ulysses 3
expect 2 "\-\-ulysses 3 sets the head-scatter groups of laga-ulysses, which cannot run it at any \-\-sp given: at \-\-sp 2: \-\-ulysses 3 does not divide \-\-sp 2; try \-\-ulysses 1; at \-\-sp 4: " -- "$laga" verify --model tiny --seq 32 --sp 2,4 --ulysses 3
expect 2 "at \-\-sp 6: \-\-ulysses 3 does not divide num_attention_heads 8" -- "$laga" verify --model tiny --seq 48 --sp 2,6 --ulysses 3
expect 2 "unknown kernel 'flash'; valid: eager, fused" -- "$laga" run --model tiny --seq 16 --kernel flash
expect 2 "unknown dlatent sum 'half' (--dlatent-sum, JSON dlatent_sum); valid: fp32, storage" -- "$laga" run --model tiny --seq 16 --sp 2 --form laga --dlatent-sum half
expect 2 "unknown dtype 'fp16'; valid: fp32, bf16" -- "$laga" run --model tiny --seq 16 --dtype fp16
expect 2 "unknown absorbed-kv regime" -- "$laga" run --model tiny --seq 16 --absorbed-kv copied
expect 2 "unknown --overlap 'maybe'; valid: on, off" -- "$laga" run --model tiny --seq 16 --overlap maybe
expect 2 "unknown --overlap 'maybe'; valid: on, off" -- "$laga" bench --model tiny --seq 16 --forms laga --overlap maybe
expect 2 "\-\-mpi-progress -1 must be a number of microseconds ≥ 0, e.g. 500" -- "$laga" run --model tiny --seq 16 --mpi-progress -1
expect 2 "\-\-mpi-progress = often: not a number; give one, e.g. \-\-mpi-progress 500" -- "$laga" bench-comm --mpi-progress often

# A dimension that does not fit: an odd RoPE dim in a config file.
cat >"$tmp/odd.json" <<'JSON'
{"hidden_size": 64, "num_attention_heads": 8, "q_lora_rank": 48, "kv_lora_rank": 32,
 "qk_nope_head_dim": 16, "qk_rope_head_dim": 7, "v_head_dim": 12, "rope_scaling": null}
JSON
expect 2 "qk_rope_head_dim = 7 must be even" -- "$laga" run --config "$tmp/odd.json" --seq 16
echo '{"hidden_size": 64, "num_attention_heads": 8, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
 "qk_rope_head_dim": 8, "v_head_dim": 12, "overlap": "yes"}' >"$tmp/overlap.json"
expect 2 "overlap is \"yes\", not true or false" -- "$laga" run --config "$tmp/overlap.json" --seq 16
echo '{"hidden_size": 64,' >"$tmp/broken.json"
expect 2 "not valid JSON" -- "$laga" run --config "$tmp/broken.json" --seq 16

# Unreadable, malformed and wrongly shaped weight files.
expect 2 "$tmp/missing.safetensors" -- "$laga" run --model tiny --seq 16 --weights "$tmp/missing.safetensors"
printf 'not a safetensors file at all' >"$tmp/garbage.safetensors"
expect 2 "garbage.safetensors" -- "$laga" run --model tiny --seq 16 --weights "$tmp/garbage.safetensors"
"$laga" run --model tiny --seq 16 --dtype fp32 --dump "$tmp/dump" >/dev/null || { echo "FAIL: dump run"; failures=$((failures + 1)); }
# The tiny dump loaded as deepseek-v2-lite: every shape differs; the message names a tensor and both shapes.
expect 2 "expected" -- "$laga" run --model deepseek-v2-lite --seq 16 --weights "$tmp/dump/tensors.safetensors"

# Outputs that cannot be written fail before any work.
expect 2 "\-\-json /nonexistent-dir/out.json" -- "$laga" run --model tiny --seq 16 --json /nonexistent-dir/out.json
expect 2 "/proc/laga-dump" -- "$laga" run --model tiny --seq 16 --dump /proc/laga-dump
expect 2 "\-\-comm mpi needs the ranks started by mpirun" -- "$laga" run --model tiny --seq 16 --comm mpi
expect 2 "inject-fault 'x' is not RANK:PLACE" -- "$laga" run --model tiny --seq 16 --inject-fault x
expect 2 "\-\-out is required" -- "$laga" report
expect 2 "The following argument was not expected: \-\-fast" -- "$laga" report --out "$tmp/report" --fast
expect 2 "laga plan needs --seq T" -- "$laga" plan --model tiny
expect 2 "unknown attention backward 'three-pass'.*valid: two-pass, one-pass" -- "$laga" run --model tiny --seq 16 --attn-backward three-pass
expect 2 "one-pass is an order of the fused kernel's backward; use --kernel fused" -- "$laga" run --model tiny --seq 16 --kernel eager --attn-backward one-pass
# plan and verify run every form: a P that no form can take, or that is wrong apart from any form, is
# refused as a whole; a form refusing P is "not run" and the others go on (below, after the refusals).
expect 2 "\-\-sp 8 does not divide \-\-seq 36; try 1, 2, 3, 4, 6, 9, 12, 18, 36" -- "$laga" plan --model tiny --seq 36 --sp 8
expect 2 "\-\-sp 3 does not divide \-\-seq 64" -- "$laga" verify --model tiny --seq 64 --sp 1,3
expect 2 "no form can run it: explicit: \-\-sp 3 does not divide num_attention_heads 8.*ring-kv: \-\-seq 9 is not a multiple of 2 × \-\-sp 3.*laga-ulysses: \-\-seq 9 is not a multiple of 2 × (\-\-sp 3 / \-\-ulysses 1) = 6" \
  -- "$laga" plan --model tiny --seq 9 --sp 3 --index-heads 0 --index-dim 0 --index-topk 0
expect 2 "size '12 parsecs' is not a byte count" -- "$laga" run --model tiny --seq 16 --mem-limit "12 parsecs"
# A run or plan over the memory limit is refused before anything is allocated, naming the planned peak.
expect 2 "refused: the planned peak is .* over --mem-limit 1MiB" -- "$laga" run --model small --seq 2048 --mem-limit 1MiB
expect 2 "refused: the planned peak is .* over --mem-limit 80GB" -- "$laga" plan --model deepseek-v3 --seq 65536 --sp 8 --kernel eager --mem-limit 80GB
# verify's sweep, estimated before anything is allocated (fp64 references + the largest run's ranks)
expect 2 "refused: this sweep is estimated to hold .* over --mem-limit 64MiB .* drop the largest --sp" -- "$laga" verify --model small --seq 64 --sp 1,8 --mem-limit 64MiB
expect 2 "size 'lots' is not a byte count" -- "$laga" verify --model tiny --seq 16 --mem-limit lots
# bench likewise: its validation, its timed rounds and the caching allocator estimated first
expect 2 "refused: this bench is estimated to hold .* over --mem-limit 64MiB .* lower the largest --seq" -- "$laga" bench --model small --seq 1024 --sp 2 --mem-limit 64MiB
expect 2 "size 'plenty' is not a byte count" -- "$laga" bench --model tiny --seq 16 --mem-limit plenty

# bench-comm: the sweep, the collectives, the dtypes and the counts, each named with a valid alternative.
expect 2 "\-b 2097152 is larger than -e 1048576; give -b ≤ -e" -- "$laga" bench-comm -b 2M -e 1M
expect 2 "\-f 1 must be an integer ≥ 2" -- "$laga" bench-comm -f 1
expect 2 "\-b 0 must be at least one byte, e.g. -b 8" -- "$laga" bench-comm -b 0
expect 2 "\-e '12parsecs' is not a size in bytes; write e.g. 8, 64K" -- "$laga" bench-comm -e 12parsecs
expect 2 "unknown collective 'broadcast' for --ops; valid: all_gather" -- "$laga" bench-comm --ops all_gather,broadcast
expect 2 "unknown dtype 'fp16'; valid: fp32, bf16" -- "$laga" bench-comm --dtype bf16,fp16
expect 2 "\-\-iters 0 must be at least 1" -- "$laga" bench-comm --iters 0
expect 2 "\-\-sp -1 must be a number of ranks ≥ 1" -- "$laga" bench-comm --sp -1
expect 2 "\-e 1000G: 2 rank(s) in this process need .* of buffers, more than the .* available" -- "$laga" bench-comm -e 1000G
# bench: a T that P does not divide (any of the list), unknown, empty or repeated forms, bad counts
# and test hooks, each before any work.
expect 2 "\-\-sp 4 does not divide --seq 18; try 1, 2, 3, 6, 9, 18" -- "$laga" bench --model tiny --seq 16,18 --sp 4
expect 2 "unknown form 'fancy'; valid: explicit, absorbed-expanded" -- "$laga" bench --model tiny --seq 16 --forms explicit,fancy
expect 2 "\-\-forms has an empty name; valid: explicit, absorbed-expanded" -- "$laga" bench --model tiny --seq 16 --forms ""
expect 2 "\-\-forms: 1 required TEXT missing" -- "$laga" bench --model tiny --seq 16 --forms
expect 2 "\-\-forms names laga twice" -- "$laga" bench --model tiny --seq 16 --forms laga,explicit,laga
expect 2 "\-\-iters 0 must be at least 1" -- "$laga" bench --model tiny --seq 16 --iters 0
expect 2 "\-\-warmup -1 must be a number of iterations ≥ 0" -- "$laga" bench --model tiny --seq 16 --warmup -1
expect 2 "\-\-inject-wrong 'laga' is not FORM:ULPS" -- "$laga" bench --model tiny --seq 16 --inject-wrong laga
expect 2 "\-\-inject-wrong names form 'laga', which --forms does not time; valid: explicit" -- "$laga" bench --model tiny --seq 16 --forms explicit --inject-wrong laga:4
expect 2 "ULPS '-1' must be a positive number" -- "$laga" bench --model tiny --seq 16 --inject-wrong laga:-1
expect 2 "inject-fault '1:x' is not RANK:PLACE" -- "$laga" bench --model tiny --seq 16 --inject-fault 1:x
# bench and train --ulysses (laga-ulysses's, which laga in --forms names; the other forms over the whole
# group): Pu divides P and H, a named form that cannot run the configuration is refused naming it, its
# reason and the forms that can, a --ulysses without a form that takes it in --forms would change
# nothing, and laga beside laga-ulysses with one names the same form twice.
expect 2 "\-\-forms names laga-ulysses, which cannot run this configuration: \-\-ulysses 3 does not divide \-\-sp 4; try \-\-ulysses 1, 2" -- "$laga" bench --model tiny --seq 32 --sp 4 --forms laga --ulysses 3
expect 2 "\-\-ulysses 3 does not divide \-\-sp 4; try \-\-ulysses 1, 2" -- "$laga" train --model tiny --seq 32 --sp 4 --forms laga --ulysses 3
expect 2 "\-\-forms names laga-ulysses, which cannot run this configuration: \-\-ulysses 6 does not divide num_attention_heads 8; try \-\-ulysses 1, 2, 4" \
  -- "$laga" bench --model tiny --seq 48 --sp 12 --forms laga,ring-kv --ulysses 6
expect 2 "\-\-forms names laga-ulysses, which cannot run this configuration: \-\-ulysses 6 does not divide num_attention_heads 8; try \-\-ulysses 1, 2, 4" \
  -- "$laga" train --model tiny --seq 48 --sp 12 --forms laga-ulysses --ulysses 6
expect 2 "\-\-forms names explicit, which cannot run this configuration: \-\-sp 16 does not divide num_attention_heads 8; try 1, 2, 4, 8; drop it from \-\-forms (forms that run it: ring-kv, ring-latent, laga-ulysses (ulysses 4), dsa-gather, dsa-regather)" \
  -- "$laga" bench --model tiny --seq 64 --sp 16 --forms explicit,laga --ulysses 4
expect 2 "\-\-forms names explicit, which cannot run this configuration: \-\-sp 16 does not divide" \
  -- "$laga" train --model tiny --seq 64 --sp 16 --forms laga,explicit --ulysses 4
expect 2 "\-\-ulysses 2 is laga-ulysses's .* but \-\-forms names none of them; add laga-ulysses (or laga) to \-\-forms, or drop \-\-ulysses" \
  -- "$laga" bench --model tiny --seq 32 --sp 4 --forms explicit,ring-kv --ulysses 2
expect 2 "\-\-ulysses 8 is laga-ulysses's .* but \-\-forms names none of them" -- "$laga" train --model tiny --seq 32 --sp 4 --forms explicit --ulysses 8
expect 2 "\-\-forms names laga-ulysses twice ('laga' names it here); give each form once" \
  -- "$laga" bench --model tiny --seq 32 --sp 4 --forms laga-ulysses,laga --ulysses 2
expect 2 "\-\-forms names laga-ulysses, which cannot run this configuration: \-\-seq 36 is not a multiple of 2 × (\-\-sp 4 / \-\-ulysses 1) = 8 .*; try \-\-seq 32 or 40" \
  -- "$laga" bench --model tiny --seq 32,36 --sp 4 --forms explicit,laga --ulysses 1

# laga model: hardware files that are unreadable, malformed, incomplete or mistyped name the file and field.
expect 2 "laga model needs --hw FILE" -- "$laga" model --model tiny --seq 16
expect 2 "hardware file $tmp/nohw.json: cannot open" -- "$laga" model --model tiny --seq 16 --hw "$tmp/nohw.json"
echo '{"name": "x",' >"$tmp/hw-broken.json"
expect 2 "hardware file $tmp/hw-broken.json: not valid JSON" -- "$laga" model --model tiny --seq 16 --hw "$tmp/hw-broken.json"
hw_good='{"name": "t", "source": "test", "compute": {"bf16": {"matmul_tflops": 1, "attention_fwd_tflops": 1,
 "attention_bwd_tflops": 1, "elementwise_GBps": 10}}, "link": {"intra_node": {"busbw_GBps": 5, "latency_us": 2}}, "ranks_per_node": 8}'
echo "$hw_good" >"$tmp/hw.json"
"$laga" model --model tiny --seq 16 --sp 2 --hw "$tmp/hw.json" >/dev/null || { echo "FAIL: the good hardware file"; failures=$((failures + 1)); }
echo "${hw_good/\"matmul_tflops\": 1, /}" >"$tmp/hw-no-matmul.json"
expect 2 "hw-no-matmul.json: field 'compute.bf16.matmul_tflops' is missing" -- "$laga" model --model tiny --seq 16 --hw "$tmp/hw-no-matmul.json"
echo "${hw_good/\"latency_us\": 2/\"latency_us\": \"2us\"}" >"$tmp/hw-latency.json"
expect 2 "field 'link.intra_node.latency_us' is string" -- "$laga" model --model tiny --seq 16 --hw "$tmp/hw-latency.json"
echo "${hw_good/, \"ranks_per_node\": 8/}" >"$tmp/hw-no-rpn.json"
expect 2 "field 'ranks_per_node' is missing" -- "$laga" model --model tiny --seq 16 --hw "$tmp/hw-no-rpn.json"
sed 's/"busbw_GBps": 5/"busbw_GBps": {"all_gather": 5}/' "$tmp/hw.json" >"$tmp/hw-busbw.json"
expect 2 "field 'link.intra_node.busbw_GBps.reduce_scatter' is missing" -- "$laga" model --model tiny --seq 16 --hw "$tmp/hw-busbw.json"
echo "${hw_good/\"ranks_per_node\": 8/\"ranks_per_node\": 2}" >"$tmp/hw-one-node.json"
expect 2 "field 'link.inter_node' is missing; it is needed for --sp 4" -- "$laga" model --model tiny --seq 16 --sp 4 --hw "$tmp/hw-one-node.json"
expect 2 "field 'compute.fp32' is missing" -- "$laga" model --model tiny --seq 16 --dtype fp32 --hw "$tmp/hw.json"
expect 2 "bench file $tmp/hw.json: no 'rows' array" -- "$laga" model --hw "$tmp/hw.json" --bench-json "$tmp/hw.json"
expect 2 "\-\-calibrate measures this machine" -- "$laga" model --calibrate "$tmp/out.json" --hw "$tmp/hw.json"
expect 2 "\-\-comm-json $tmp/nocomm.json: cannot open" -- "$laga" model --calibrate "$tmp/out.json" --comm-json "$tmp/nocomm.json"
echo '{"command": "bench-comm", "sp": 4, "rows": [{"op": "all_gather", "bytes": 1024, "time_s": 1e-5}]}' >"$tmp/comm-few.json"
expect 2 "bench-comm file $tmp/comm-few.json: fewer than 2 valid sizes of all_gather" -- "$laga" model --calibrate "$tmp/out.json" --comm-json "$tmp/comm-few.json"
expect 2 "bench-comm file $tmp/comm-few.json: fewer than 2 valid sizes of all_gather" -- "$laga" model --model tiny --seq 16 --hw "$tmp/hw.json" --comm-json "$tmp/comm-few.json"
expect 2 "\-\-calibrate-seq goes with --calibrate" -- "$laga" model --model tiny --seq 16 --hw "$tmp/hw.json" --calibrate-seq 2048
expect 2 "\-\-calibrate-reps goes with --calibrate" -- "$laga" model --model tiny --seq 16 --hw "$tmp/hw.json" --calibrate-reps 3
expect 2 "\-\-calibrate-reps -1 must be 1 .. 100" -- "$laga" model --calibrate "$tmp/out.json" --sp 2 --calibrate-reps -1
expect 2 "\-\-calibrate-seq 1001: each T must be a multiple of --sp 2" -- "$laga" model --calibrate "$tmp/out.json" --sp 2 --calibrate-seq 2048,1001

# The benchmark executables (LAGA_BENCH_ATTENTION, set by tests/CMakeLists.txt where LAGA_BUILD_BENCH is
# on): a number that is not one is a usage error (std::stoll read "12abc" as 12 and aborted on "abc").
if [ -n "${LAGA_BENCH_ATTENTION:-}" ]; then
  expect 2 "\-\-seq 'abc' is not a whole number; give one, e.g. \-\-seq 4" -- "$LAGA_BENCH_ATTENTION" --seq abc
  expect 2 "\-\-repeats '3x' is not a whole number" -- "$LAGA_BENCH_ATTENTION" --repeats 3x
else
  echo "not checked: bench_attention's bad input (this build has LAGA_BUILD_BENCH off)"
fi

[ "$failures" -eq 0 ] && echo "cli_bad_input: all cases pass" || echo "cli_bad_input: $failures failures"
# The other side of the rule: exit 0, the refusing forms' rows say "not run" and why, the others have numbers.
out=$("$laga" plan --model tiny --seq 64 --sp 16 2>&1); status=$?
if [ "$status" -eq 0 ] && grep -q "^  laga *not run: --sp 16 does not divide num_attention_heads 8" <<<"$out" \
   && grep -Eq "^  ring-latent +[0-9]+ " <<<"$out"; then
  echo "ok: plan at P 16 > H 8: head-scatter forms not run, ring forms planned"
else
  echo "FAIL: plan --sp 16 at H 8: status $status: $out"; failures=$((failures + 1))
fi
out=$("$laga" plan --model tiny --seq 36 --sp 4 2>&1); status=$?
if [ "$status" -eq 0 ] && grep -q "^  ring-kv *not run: --seq 36 is not a multiple of 2 × --sp 4" <<<"$out" \
   && grep -Eq "^  laga +[0-9]+ " <<<"$out" && grep -q "communication explicit / laga" <<<"$out"; then
  echo "ok: plan at T 36 P 4: ring forms not run, the others planned"
else
  echo "FAIL: plan --seq 36 --sp 4: status $status: $out"; failures=$((failures + 1))
fi
out=$("$laga" verify --model tiny --seq 64 --sp 1,16 --dtype fp32 2>&1); status=$?
if [ "$status" -eq 0 ] && grep -q "^   16 explicit  *not run: .*held to explicit's error at P 1" <<<"$out" \
   && grep -Eq "^   16 ring-kv +fp64 .* ok$" <<<"$out" && grep -q "^verify: pass" <<<"$out"; then
  echo "ok: verify at P 16 > H 8: ring forms checked against explicit's P 1 error"
else
  echo "FAIL: verify --sp 1,16 at H 8: status $status: $out"; failures=$((failures + 1))
fi

# The one-pass attention backward through every form: the rule against fp64 and the bitwise claims hold.
out=$("$laga" verify --model tiny --seq 64 --sp 1,2,4,8 --attn-backward one-pass 2>&1); status=$?
if [ "$status" -eq 0 ] && grep -q "^    1 laga  *explicit@1 .* yes  *ok" <<<"$out" && grep -q "^verify: pass" <<<"$out"; then
  echo "ok: verify with --attn-backward one-pass"
else
  echo "FAIL: verify --attn-backward one-pass: status $status: $out"; failures=$((failures + 1))
fi

# A top-k above T is clamped to T with one note (a query has at most T keys), and the run goes on.
out=$("$laga" run --model tiny --seq 8 --form dsa-gather 2>&1 >/dev/null); status=$?
if [ "$status" -eq 0 ] && [ "$(wc -l <<<"$out")" -eq 1 ] \
   && grep -q "^note: \-\-index-topk 16 exceeds \-\-seq 8: the sparse forms select every earlier key (top-k runs as 8)$" <<<"$out"; then
  echo "ok: --index-topk 16 at --seq 8 runs as 8, said once"
else
  echo "FAIL: --index-topk above --seq: status $status: $out"; failures=$((failures + 1))
fi

[ "$failures" -eq 0 ]
