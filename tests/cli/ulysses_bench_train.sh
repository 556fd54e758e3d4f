#!/usr/bin/env bash
# laga bench with --ulysses Pu (laga's head scatter in groups of Pu × a ring over the
# P/Pu groups; every other form over the whole group, as_form):
#   bench  laga's rows run, are named and validated as "laga (ulysses Pu)" (the reduced-T rule's case of
#          that name, the full-size bound against explicit); a shifted y fails the row; at P > H the
#          reference is explicit at P 1 (judged by the rule there too); under threads and mpirun -np 4;
#   model  --bench-json predicts the row as laga (ulysses Pu), the same figures as `laga model --ulysses
#          Pu`; a --ulysses other than the rows' is refused naming both.
# Usage: ulysses_bench_train.sh <laga binary> <source dir>
set -u
laga=$1
src=$2
source "$src/tests/cli/lib/mpi.bash"  # mpirun settings: the array mpi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }
json_has() {  # file, python expression over j that must be true
  /usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1"
}
# A model with H 2, so that P 4 > H: explicit cannot run P 4, laga --ulysses 2 and the ring forms can.
cat >"$work/h2.json" <<'JSON'
{"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": 48, "kv_lora_rank": 32,
 "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12, "rope_scaling": null}
JSON
bench=(bench --model tiny --seq 32 --sp 4 --ulysses 2 --dtype fp32 --iters 1 --warmup 0)
# The laga row ran the hybrid (its ring collectives, Pr − 1 = 1 hop per layer: latent_g in forward and
# again in backward, dlatent_g once), validated within the bound.
laga_row="(lambda r: r['variant']=='laga' and r['label']=='laga (ulysses 2)' and r['ulysses']==2 and r['wrong']==0 \
  and r['validation']['validated'] and r['validation']['vs_explicit']=='bound' \
  and 0 < r['validation']['worst_ratio'] <= 1 and r['collectives']['latent_g']['count']==2 \
  and r['collectives']['dlatent_g']['count']==1 and r['collectives']['dlatent_g']['op']=='send_recv') \
  (next(r for r in j['rows'] if r['variant']=='laga'))"
reduced_has="any(c['sp']==4 and c['form']=='laga (ulysses 2)' and c['vs']=='fp64' and c['pass'] \
  for c in j['validation']['reduced_cases'])"

# 1. bench under threads, P 4 ≤ H 8: explicit over the whole group beside laga (ulysses 2).
if "$laga" "${bench[@]}" --forms explicit,laga --json "$work/b.json" >"$work/out" 2>&1 &&
   grep -q "^bench: pass" "$work/out" && grep -Eq "^ +32 laga \(ulysses 2\) +[0-9.]+ " "$work/out" &&
   json_has "$work/b.json" "[r['label'] for r in j['rows']]==['explicit','laga (ulysses 2)'] and j['pass'] \
     and $laga_row and $reduced_has and j['rows'][0]['ulysses']==0 and 'latent_g' not in j['rows'][0]['collectives']"; then
  ok "bench --ulysses 2 (threads): a validated 'laga (ulysses 2)' row beside explicit"
else
  fail "bench --ulysses 2 (threads): $(tail -5 "$work/out")"
fi
# Validation is not skipped for the hybrid row: a shifted y fails that row alone, exit 1.
"$laga" "${bench[@]}" --forms explicit,laga --inject-wrong laga:1e4 --json "$work/w.json" >"$work/out" 2>&1
status=$?
if [ "$status" -eq 1 ] && grep -q "^# FAIL T 32 laga (ulysses 2): laga (ulysses 2) vs explicit: max|Δ y|" "$work/out" &&
   json_has "$work/w.json" "not j['pass'] and [r['wrong']>0 for r in j['rows']]==[False, True]"; then
  ok "bench --ulysses 2: laga (ulysses 2)'s y shifted by 1e4 ulps fails its row (exit 1)"
else
  fail "bench --ulysses 2 --inject-wrong laga: status $status: $(tail -3 "$work/out")"
fi

# 2. P 4 > H 2: explicit cannot run P 4, so the reference is explicit at P 1, itself judged by the rule.
hx=(bench --config "$work/h2.json" --seq 32 --sp 4 --ulysses 2 --dtype fp32 --iters 1 --warmup 0 --forms laga,ring-kv)
ref_ok="any(c['sp']==1 and c['form']=='explicit' and c['vs']=='fp64' and c['pass'] for c in j['validation']['reduced_cases'])"
if "$laga" "${hx[@]}" --json "$work/h.json" >"$work/out" 2>&1 && grep -q "explicit at P 1 the reference" "$work/out" &&
   json_has "$work/h.json" "$laga_row and $reduced_has and $ref_ok and j['pass'] \
     and all(r['validation']['vs_explicit']=='bound' for r in j['rows'])"; then
  ok "bench --ulysses 2 at P 4 > H 2: validated against explicit at P 1"
else
  fail "bench --ulysses 2 at P > H: $(tail -5 "$work/out")"
fi
"$laga" "${hx[@]}" --inject-wrong laga:1e4 >"$work/out" 2>&1
status=$?
if [ "$status" -eq 1 ] && grep -q "^# FAIL T 32 laga (ulysses 2): laga (ulysses 2) vs explicit at P 1: max|Δ y|" "$work/out"; then
  ok "bench at P > H: a shifted y fails against explicit at P 1 (exit 1)"
else
  fail "bench at P > H --inject-wrong laga: status $status: $(tail -3 "$work/out")"
fi

# 3. model: the bench row predicted as laga (ulysses 2), exactly as `laga model --ulysses 2` predicts it.
hw="$src/docs/hw/h100-class.json"
if "$laga" model --ulysses 2 --bench-json "$work/b.json" --hw "$hw" --json "$work/m.json" >"$work/out" 2>&1 &&
   "$laga" model --model tiny --seq 32 --sp 4 --ulysses 2 --dtype fp32 --hw "$hw" --json "$work/p.json" >/dev/null 2>&1 &&
   /usr/bin/python3 - "$work/m.json" "$work/p.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["comparison"]["rows"]
pred = json.load(open(sys.argv[2]))["forms"]
r = next(r for r in rows if r["form"] == "laga (ulysses 2)")
assert r["variant"] == "laga" and r["ulysses"] == 2, r
assert "laga" not in pred and r["predicted"]["total_s"] == pred["laga (ulysses 2)"]["total_s"], (r, pred.keys())
e = next(r for r in rows if r["form"] == "explicit")
assert e["predicted"]["total_s"] == pred["explicit"]["total_s"], e
PY
then
  ok "model --ulysses 2 --bench-json: the row predicted as laga (ulysses 2)"
else
  fail "model --bench-json with a laga (ulysses 2) row: $(tail -3 "$work/out")"
fi
"$laga" model --ulysses 1 --bench-json "$work/b.json" --hw "$hw" >"$work/out" 2>&1
status=$?
if [ "$status" -eq 2 ] && grep -q -- "--ulysses 1, but bench file .* ran laga at T 32 P 4 with --ulysses 2; give --ulysses 2" "$work/out"; then
  ok "model --ulysses 1 against a bench of --ulysses 2: refused naming both"
else
  fail "model --ulysses 1 --bench-json: status $status: $(cat "$work/out")"
fi

# 4. Under mpirun -np 4: bench validated as under threads.
if timeout 300 "${mpi[@]}" -np 4 "$laga" "${bench[@]}" --forms explicit,laga --json "$work/bm.json" >"$work/out" 2>&1 &&
   json_has "$work/bm.json" "j['backend']=='mpi' and j['pass'] and $laga_row and $reduced_has"; then
  ok "bench --ulysses 2 under mpirun -np 4: a validated 'laga (ulysses 2)' row"
else
  fail "bench --ulysses 2 under mpirun -np 4: $(tail -5 "$work/out")"
fi
[ "$(grep -c "laga bench" "$work/out")" -eq 1 ] || fail "bench under mpirun printed its table more than once"

[ "$failures" -eq 0 ] && echo "ulysses_bench_train: all cases pass" || echo "ulysses_bench_train: $failures failures"
[ "$failures" -eq 0 ]
