#!/usr/bin/env bash
# One rank's share of a P = 8 group at full DeepSeek-V3 dimensions (H 128, D 7168, latent 576), bf16,
# measured with the other seven ranks stood in for (`laga run --stand-in 0`). The tracking allocator's
# figures and the ledger must equal the planner's to the byte at the sizes where byte counts are
# largest. Every form is checked against the planner at small dimensions by the GoogleTests
# (Planner.*); here each code path that allocates differently runs once at full scale: the fused
# kernel at T 16384 under explicit, laga, absorbed-shared and laga-fused (its own latent kernel), and
# eager at T 8192 (the largest power of two whose eager peak fits in 24 GiB) under absorbed-expanded,
# whose n_heads x kv_lora_rank intermediates are the largest. And DeepSeek-V3.2's sparse forms at
# T 16384 over P 64, standing in for the last rank (zigzag chunks 63 and 64); at T 262144 the same
# holds (measured by hand: both forms' peaks, saved bytes and traffic equal the plan's).
# Usage: deepseek_v3_scale.sh <laga binary> <source dir>
set -u
laga=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

check() {  # kernel T form regime [model P rank]
  local kernel=$1 T=$2 form=$3 kv=$4 model=${5:-deepseek-v3} P=${6:-8} rank=${7:-0}
  local f="$work/$1.$2.$3.$4.json"
  if ! "$laga" run --model "$model" --seq "$T" --sp "$P" --stand-in "$rank" --form "$form" --absorbed-kv "$kv" \
      --kernel "$kernel" --dtype bf16 --json "$f" >"$work/out" 2>&1; then
    echo "FAIL: $kernel T=$T $form $kv: $(tail -3 "$work/out")"
    failures=$((failures + 1))
    return
  fi
  "$laga" plan --model "$model" --seq "$T" --sp "$P" --kernel "$kernel" --absorbed-kv "$kv" --dtype bf16 \
    --json "$work/plan.json" >/dev/null
  if /usr/bin/python3 - "$f" "$work/plan.json" "$form" <<'PY'
import json, sys
run, plan, form = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
r = run["ranks"][0]
p = plan["forms"][form]
pairs = [("activation_peak_bytes", r["activation_peak_bytes"], p["activation_peak_bytes"]),
         ("saved_bytes", r["saved_bytes"], p["saved_bytes"]),
         ("forward_peak_bytes", r["forward_peak_bytes"], p["forward_peak_bytes"]),
         ("backward_peak_bytes", r["backward_peak_bytes"], p["backward_peak_bytes"]),
         ("comm.tensor_bytes", r["comm"]["tensor_bytes"], p["comm"]["tensor_bytes"]),
         ("comm.wire_bytes", r["comm"]["wire_bytes"], p["comm"]["wire_bytes"])]
bad = [f"{k}: measured {m} planned {q}" for k, m, q in pairs if m != q]
print("  " + ", ".join(f"{k} {m}" for k, m, _ in pairs[:2]) + f", fwd {r['fwd_s']:.1f} s, bwd {r['bwd_s']:.1f} s")
if bad:
    print("  " + "; ".join(bad))
sys.exit(1 if bad else 0)
PY
  then
    echo "ok: $model P $P rank $rank $kernel T=$T $form $kv: measured == planned"
  else
    echo "FAIL: $kernel T=$T $form $kv: measured != planned"
    failures=$((failures + 1))
  fi
}

check fused 16384 explicit expanded
check fused 16384 laga expanded
check fused 16384 absorbed shared
check eager 8192 absorbed expanded
# laga-fused runs its own latent kernel whatever --kernel says.
check fused 16384 laga-fused expanded
check fused 16384 dsa-gather expanded deepseek-v3.2 64 63
check fused 16384 dsa-regather expanded deepseek-v3.2 64 63
[ "$failures" -eq 0 ] && echo "deepseek_v3_scale: all cases pass" || echo "deepseek_v3_scale: $failures failures"
[ "$failures" -eq 0 ]
