#!/usr/bin/env bash
# laga --ulysses Pu from the command line: at DeepSeek-V2-Lite (H 16) P 32 with --ulysses 16 and 8,
# `laga plan` equals `laga run --stand-in 0` (activation peak, attention traffic in both conventions)
# to the byte; and `laga verify --ulysses 2` adds a passing "laga (ulysses 2)" row at every P that 2
# divides with 2 < P; `laga model --ulysses 8` predicts it. Usage: ulysses.sh <laga binary> <source dir>
set -u
laga=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

for pu in 16 8; do
  lite=(--model deepseek-v2-lite --seq 4096 --sp 32 --ulysses "$pu")
  "$laga" plan "${lite[@]}" --json "$work/plan.json" >/dev/null || { fail "plan --ulysses $pu"; continue; }
  "$laga" run "${lite[@]}" --form laga --stand-in 0 --json "$work/run.json" >/dev/null || { fail "run --ulysses $pu"; continue; }
  if python3 - "$work/plan.json" "$work/run.json" "$pu" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))["forms"][f"laga (ulysses {sys.argv[3]})"]
r = json.load(open(sys.argv[2]))["ranks"][0]
got = (r["activation_peak_bytes"], r["comm"]["tensor_bytes"], r["comm"]["wire_bytes"])
want = (plan["activation_peak_bytes"], plan["comm"]["tensor_bytes"], plan["comm"]["wire_bytes"])
print(f"plan {want} run {got}")
sys.exit(0 if got == want else 1)
PY
  then echo "ok: lite P 32 --ulysses $pu: plan = stand-in run"
  else fail "lite P 32 --ulysses $pu: plan differs from the stand-in run"
  fi
done

if "$laga" verify --model tiny --seq 32 --sp 1,2,4,8 --ulysses 2 --dtype bf16 >"$work/out" 2>&1 &&
   [ "$(grep -c "laga (ulysses 2) .* ok$" "$work/out")" -eq 2 ] && grep -q "verify: pass" "$work/out"; then
  echo "ok: verify --ulysses 2 passes at P 4 and 8"
else
  fail "verify --ulysses 2: $(cat "$work/out")"
fi

# model --ulysses: laga (ulysses 8) predicted beside the forms that run P 32 (the ring forms), the
# head-scatter forms listed as not run; a named form other than laga refuses a --ulysses below P.
if "$laga" model --model deepseek-v2-lite --seq 4096 --sp 32 --ulysses 8 --hw "$src/docs/hw/h100-class.json" \
     --json "$work/model.json" >"$work/out" 2>&1 &&
   /usr/bin/env python3 - "$work/model.json" <<'PY'
import json, sys
f = json.load(open(sys.argv[1]))["forms"]
assert f["laga (ulysses 8)"]["total_s"] > 0 and f["ring-latent"]["total_s"] > 0, f.keys()
assert "not_run" in f["explicit"], f["explicit"]
PY
then
  echo "ok: model --ulysses 8 predicts laga (ulysses 8) beside the ring forms"
else
  fail "model --ulysses 8: $(cat "$work/out")"
fi
"$laga" model --model deepseek-v2-lite --seq 4096 --sp 32 --ulysses 8 --forms ring-kv \
  --hw "$src/docs/hw/h100-class.json" >"$work/out" 2>&1
status=$?
if [ "$status" -eq 2 ] && grep -q "applies to laga only" "$work/out"; then
  echo "ok: model --forms ring-kv --ulysses 8 refused with exit 2"
else
  fail "model --forms ring-kv --ulysses 8: status $status: $(cat "$work/out")"
fi

[ "$failures" -eq 0 ] && echo "ulysses: all cases pass" || echo "ulysses: $failures failures"
[ "$failures" -eq 0 ]
