#!/usr/bin/env bash
# laga-ulysses from the command line (laga's head scatter in groups of --ulysses Pu ranks × a ring over
# the P/Pu groups): `--form laga --ulysses 2` names it, bit for bit `--form laga-ulysses --ulysses 2`
# and, at P 4 with 8 heads, `--form laga-ulysses` alone (its default Pu); the dump's config.json says
# laga-ulysses with its Pu. At DeepSeek-V2-Lite (H 16) P 32 with --ulysses 16 and 8, `laga plan`
# equals `laga run --stand-in 0` (activation peak, attention traffic in both conventions) to the byte;
# `laga verify --ulysses 2` runs a passing laga-ulysses (ulysses 2) row at every P that 2 divides;
# `laga model --ulysses 8` predicts it. Usage: ulysses.sh <laga binary> <source dir>
set -u
laga=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

tiny=(run --model tiny --seq 32 --sp 4 --dtype bf16 --layers 2)
"$laga" "${tiny[@]}" --form laga --ulysses 2 --dump "$work/alias" >/dev/null &&
  "$laga" "${tiny[@]}" --form laga-ulysses --ulysses 2 --dump "$work/named" >/dev/null &&
  "$laga" "${tiny[@]}" --form laga-ulysses --dump "$work/default" >/dev/null || fail "the laga-ulysses runs"
if cmp -s "$work/alias/tensors.safetensors" "$work/named/tensors.safetensors" &&
   cmp -s "$work/alias/tensors.safetensors" "$work/default/tensors.safetensors" &&
   cmp -s "$work/alias/config.json" "$work/named/config.json" &&
   python3 -c "import json,sys; c=json.load(open(sys.argv[1])); \
     sys.exit(0 if c['form']=='laga-ulysses' and c['ulysses']==2 else 1)" "$work/alias/config.json"; then
  echo "ok: --form laga --ulysses 2 is laga-ulysses --ulysses 2 (and its default at P 4) bit for bit"
else
  fail "--form laga --ulysses 2 and --form laga-ulysses differ: $(cat "$work/alias/config.json")"
fi

for pu in 16 8; do
  lite=(--model deepseek-v2-lite --seq 4096 --sp 32 --ulysses "$pu")
  "$laga" plan "${lite[@]}" --json "$work/plan.json" >/dev/null || { fail "plan --ulysses $pu"; continue; }
  "$laga" run "${lite[@]}" --form laga --stand-in 0 --json "$work/run.json" >/dev/null || { fail "run --ulysses $pu"; continue; }
  if python3 - "$work/plan.json" "$work/run.json" "$pu" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))["forms"]["laga-ulysses"]
assert plan["ulysses"] == int(sys.argv[3]), plan["ulysses"]
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

# P 2 is a ring of one group; P 1 is not run (2 does not divide it)
if "$laga" verify --model tiny --seq 32 --sp 1,2,4,8 --ulysses 2 --dtype bf16 >"$work/out" 2>&1 &&
   [ "$(grep -c "laga-ulysses (ulysses 2) .* ok$" "$work/out")" -eq 3 ] &&
   grep -q "^    1 laga-ulysses (ulysses 2) *not run: .*--ulysses 2 does not divide --sp 1" "$work/out" &&
   grep -q "verify: pass" "$work/out"; then
  echo "ok: verify --ulysses 2 passes at P 2, 4 and 8"
else
  fail "verify --ulysses 2: $(cat "$work/out")"
fi

# model --ulysses: laga-ulysses (ulysses 8) predicted beside the forms that run P 32 (the ring forms),
# the head-scatter forms listed as not run; a named form that takes no --ulysses refuses one below P.
if "$laga" model --model deepseek-v2-lite --seq 4096 --sp 32 --ulysses 8 --hw "$src/docs/hw/h100-class.json" \
     --json "$work/model.json" >"$work/out" 2>&1 &&
   /usr/bin/env python3 - "$work/model.json" <<'PY'
import json, sys
f = json.load(open(sys.argv[1]))["forms"]
assert f["laga-ulysses (ulysses 8)"]["total_s"] > 0 and f["ring-latent"]["total_s"] > 0, f.keys()
assert "not_run" in f["explicit"], f["explicit"]
PY
then
  echo "ok: model --ulysses 8 predicts laga-ulysses (ulysses 8) beside the ring forms"
else
  fail "model --ulysses 8: $(cat "$work/out")"
fi
"$laga" model --model deepseek-v2-lite --seq 4096 --sp 32 --ulysses 8 --forms ring-kv \
  --hw "$src/docs/hw/h100-class.json" >"$work/out" 2>&1
status=$?
if [ "$status" -eq 2 ] && grep -q "applies to laga-ulysses only, not to form 'ring-kv'" "$work/out"; then
  echo "ok: model --forms ring-kv --ulysses 8 refused with exit 2"
else
  fail "model --forms ring-kv --ulysses 8: status $status: $(cat "$work/out")"
fi

[ "$failures" -eq 0 ] && echo "ulysses: all cases pass" || echo "ulysses: $failures failures"
[ "$failures" -eq 0 ]
