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
expect 2 "seq_len (--seq) = 0 must be positive" -- "$laga" run --model tiny --seq 0
expect 2 "\-\-sp 3 does not divide num_attention_heads 8; try 1, 2, 4, 8" -- "$laga" run --model tiny --seq 24 --sp 3
expect 2 "\-\-sp 4 does not divide --seq 18; try 1, 2, 3, 6, 9, 18" -- "$laga" run --model tiny --seq 18 --sp 4
expect 2 "unknown form 'fancy'; valid: explicit, absorbed-expanded, absorbed-shared, laga" -- "$laga" run --model tiny --seq 16 --form fancy
expect 2 "unknown kernel 'flash'; valid: eager, fused" -- "$laga" run --model tiny --seq 16 --kernel flash
expect 2 "unknown dtype 'fp16'; valid: fp32, bf16" -- "$laga" run --model tiny --seq 16 --dtype fp16
expect 2 "unknown absorbed-kv regime" -- "$laga" run --model tiny --seq 16 --absorbed-kv copied
expect 2 "unknown --overlap 'maybe'; valid: on, off" -- "$laga" run --model tiny --seq 16 --overlap maybe
expect 2 "unknown --overlap 'maybe'; valid: on, off" -- "$laga" bench --model tiny --seq 16 --forms laga --overlap maybe

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
expect 2 "not implemented" -- "$laga" report --out "$tmp/report"
expect 2 "laga plan needs --seq T" -- "$laga" plan --model tiny
expect 2 "size '12 parsecs' is not a byte count" -- "$laga" run --model tiny --seq 16 --mem-limit "12 parsecs"
# A run or plan over the memory limit is refused before anything is allocated, naming the planned peak.
expect 2 "refused: the planned peak is .* over --mem-limit 1MiB" -- "$laga" run --model small --seq 2048 --mem-limit 1MiB
expect 2 "refused: the planned peak is .* over --mem-limit 80GB" -- "$laga" plan --model deepseek-v3 --seq 65536 --sp 8 --kernel eager --mem-limit 80GB

[ "$failures" -eq 0 ] && echo "cli_bad_input: all cases pass" || echo "cli_bad_input: $failures failures"
[ "$failures" -eq 0 ]
