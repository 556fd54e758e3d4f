#!/usr/bin/env bash
# laga bench and laga train with --ulysses Pu (laga-ulysses: laga's head scatter in groups of Pu × a
# ring over the P/Pu groups; laga in --forms with --ulysses below P names it; every other form over the
# whole group, as_form):
#   bench  laga-ulysses's rows run, are named "laga-ulysses (ulysses Pu)" (variant laga-ulysses,
#          ulysses Pu) and validated (the reduced-T rule's laga-ulysses case at that Pu, the
#          full-size bound against explicit); a shifted y fails the row; at P > H the reference is
#          explicit at P 1 (judged by the rule there too); under threads and mpirun -np 4;
#   model  --bench-json predicts the row as laga-ulysses (ulysses Pu), the same figures as `laga model
#          --ulysses Pu`; a --ulysses other than the rows' is refused naming both;
#   train  laga-ulysses's losses agree with explicit's and plain laga's within train's fp32 tolerance
#          (1e-3 relative); mpirun -np 4 gives bitwise the threads' losses; a checkpoint records Pu:
#          resumed with the same Pu it is bitwise an uninterrupted run, with another it is refused
#          (exit 2) naming both values.
# Usage: ulysses_bench_train.sh <laga binary> <source dir>
set -u
laga=$1
src=$2
source "$src/tests/cli/lib/mpi.bash"  # mpirun settings: the array mpi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/check.bash"  # fail, ok, json_has; failures counts
# A model with H 2, so that P 4 > H: explicit cannot run P 4, laga-ulysses and the ring forms can.
cat >"$work/h2.json" <<'JSON'
{"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": 48, "kv_lora_rank": 32,
 "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12, "rope_scaling": null}
JSON
bench=(bench --model tiny --seq 32 --sp 4 --ulysses 2 --dtype fp32 --iters 1 --warmup 0)
# The laga-ulysses row ran the hybrid (its ring collectives, Pr − 1 = 1 hop per layer: latent_g in
# forward and again in backward, dlatent_g once), validated within the bound.
laga_row="(lambda r: r['variant']=='laga-ulysses' and r['label']=='laga-ulysses (ulysses 2)' and r['ulysses']==2 and r['wrong']==0 \
  and r['validation']['validated'] and r['validation']['vs_explicit']=='bound' \
  and 0 < r['validation']['worst_ratio'] <= 1 and r['collectives']['latent_g']['count']==2 \
  and r['collectives']['dlatent_g']['count']==1 and r['collectives']['dlatent_g']['op']=='send_recv') \
  (next(r for r in j['rows'] if r['variant']=='laga-ulysses'))"
reduced_has="any(c['sp']==4 and c['form']=='laga-ulysses' and c['ulysses']==2 and c['vs']=='fp64' and c['pass'] \
  for c in j['validation']['reduced_cases'])"

# 1. bench under threads, P 4 ≤ H 8: explicit over the whole group beside laga-ulysses (ulysses 2), named
# as laga with --ulysses 2.
if "$laga" "${bench[@]}" --forms explicit,laga --json "$work/b.json" >"$work/out" 2>&1 &&
   grep -q "^bench: pass" "$work/out" && grep -Eq "^ +32 laga-ulysses \(ulysses 2\) +[0-9.]+ " "$work/out" &&
   json_has "$work/b.json" "[r['label'] for r in j['rows']]==['explicit','laga-ulysses (ulysses 2)'] and j['pass'] \
     and $laga_row and $reduced_has and j['rows'][0]['ulysses']==0 and 'latent_g' not in j['rows'][0]['collectives']"; then
  ok "bench --ulysses 2 (threads): a validated 'laga-ulysses (ulysses 2)' row beside explicit"
else
  fail "bench --ulysses 2 (threads): $(tail -5 "$work/out")"
fi
# Validation is not skipped for the hybrid row: a shifted y fails that row alone, exit 1.
"$laga" "${bench[@]}" --forms explicit,laga --inject-wrong laga:1e4 --json "$work/w.json" >"$work/out" 2>&1
status=$?
if [ "$status" -eq 1 ] && grep -q "^# FAIL T 32 laga-ulysses (ulysses 2): laga-ulysses (ulysses 2) vs explicit: max|Δ y|" "$work/out" &&
   json_has "$work/w.json" "not j['pass'] and [r['wrong']>0 for r in j['rows']]==[False, True]"; then
  ok "bench --ulysses 2: laga-ulysses (ulysses 2)'s y shifted by 1e4 ulps fails its row (exit 1)"
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
if [ "$status" -eq 1 ] && grep -q "^# FAIL T 32 laga-ulysses (ulysses 2): laga-ulysses (ulysses 2) vs explicit at P 1: max|Δ y|" "$work/out"; then
  ok "bench at P > H: a shifted y fails against explicit at P 1 (exit 1)"
else
  fail "bench at P > H --inject-wrong laga: status $status: $(tail -3 "$work/out")"
fi

# 3. model: the bench row predicted as laga-ulysses (ulysses 2), exactly as `laga model --ulysses 2`
# predicts it (beside plain laga, which takes no --ulysses).
hw="$src/docs/hw/h100-class.json"
if "$laga" model --ulysses 2 --bench-json "$work/b.json" --hw "$hw" --json "$work/m.json" >"$work/out" 2>&1 &&
   "$laga" model --model tiny --seq 32 --sp 4 --ulysses 2 --dtype fp32 --hw "$hw" --json "$work/p.json" >/dev/null 2>&1 &&
   /usr/bin/python3 - "$work/m.json" "$work/p.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["comparison"]["rows"]
pred = json.load(open(sys.argv[2]))["forms"]
r = next(r for r in rows if r["form"] == "laga-ulysses (ulysses 2)")
assert r["variant"] == "laga-ulysses" and r["ulysses"] == 2, r
assert "laga" in pred and r["predicted"]["total_s"] == pred["laga-ulysses (ulysses 2)"]["total_s"], (r, pred.keys())
e = next(r for r in rows if r["form"] == "explicit")
assert e["predicted"]["total_s"] == pred["explicit"]["total_s"], e
PY
then
  ok "model --ulysses 2 --bench-json: the row predicted as laga-ulysses (ulysses 2)"
else
  fail "model --bench-json with a laga-ulysses (ulysses 2) row: $(tail -3 "$work/out")"
fi
"$laga" model --ulysses 1 --bench-json "$work/b.json" --hw "$hw" >"$work/out" 2>&1
status=$?
if [ "$status" -eq 2 ] && grep -q -- "--ulysses 1, but bench file .* ran laga-ulysses at T 32 P 4 with --ulysses 2; give --ulysses 2" "$work/out"; then
  ok "model --ulysses 1 against a bench of --ulysses 2: refused naming both"
else
  fail "model --ulysses 1 --bench-json: status $status: $(cat "$work/out")"
fi

# 4. train: laga-ulysses (ulysses 2) against explicit (in the run) and against plain laga (another run).
train=(train --model tiny --seq 32 --sp 4 --steps 40 --lr 1e-2 --dtype fp32)
if "$laga" "${train[@]}" --ulysses 2 --forms explicit,laga --json "$work/t.json" >"$work/out" 2>&1 &&
   "$laga" "${train[@]}" --forms laga --json "$work/plain.json" >/dev/null 2>&1 &&
   grep -Eq "^  laga-ulysses \(ulysses 2\) +[0-9.e+-]+ " "$work/out" &&
   /usr/bin/python3 - "$work/t.json" "$work/plain.json" <<'PY'
import json, sys
t, p = (json.load(open(f)) for f in sys.argv[1:3])
assert t["pass"] and [r["label"] for r in t["runs"]] == ["explicit", "laga-ulysses (ulysses 2)"], t["runs"]
h = t["runs"][1]
assert h["ulysses"] == 2 and h["variant"] == "laga-ulysses" and h["max_rel_vs_first"] <= 1e-3 and h["decreased"], h
plain = p["runs"][0]["losses"]
assert plain[-1] < 0.5 * plain[0] and len(plain) == len(h["losses"]) == 40
rel = max(abs(a - b) / abs(b) for a, b in zip(h["losses"], plain))
print(f"laga-ulysses (ulysses 2) vs plain laga: max rel {rel:.3e}")
assert rel <= 1e-3, rel
PY
then
  ok "train --ulysses 2: losses within 1e-3 of explicit's and plain laga's"
else
  fail "train --ulysses 2: $(tail -4 "$work/out")"
fi

# 5. Checkpoints record Pu: resumed with it, bitwise an uninterrupted run (as laga-ulysses alone too: its
# default at P 4 with 8 heads is 2); with another, refused.
ck=(train --model tiny --seq 32 --sp 4 --lr 1e-2 --dtype fp32 --forms laga --ulysses 2)
"$laga" "${ck[@]}" --steps 12 --json "$work/ref.json" >/dev/null 2>&1
"$laga" "${ck[@]}" --steps 6 --checkpoint "$work/ck" >/dev/null 2>&1
"$laga" "${ck[@]}" --steps 12 --resume "$work/ck" --json "$work/res.json" >"$work/out" 2>&1
status=$?
if [ "$status" -le 1 ] && json_has "$work/res.json" "j['runs'][0]['resumed_from']==6" &&
   /usr/bin/python3 -c "import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:3]); \
     sys.exit(0 if a['runs'][0]['losses']==b['runs'][0]['losses'] else 1)" "$work/ref.json" "$work/res.json"; then
  ok "train --ulysses 2 resumed at step 6: losses bitwise those of an uninterrupted run"
else
  fail "train --ulysses 2 resume: status $status: $(tail -3 "$work/out")"
fi
"$laga" train --model tiny --seq 32 --sp 4 --lr 1e-2 --dtype fp32 --forms laga-ulysses --steps 12 --resume "$work/ck" \
  --json "$work/res2.json" >"$work/out" 2>&1
if /usr/bin/python3 -c "import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:3]); \
     sys.exit(0 if a['runs'][0]['losses']==b['runs'][0]['losses'] else 1)" "$work/ref.json" "$work/res2.json"; then
  ok "train --forms laga-ulysses (its default Pu 2) resumes the --forms laga --ulysses 2 checkpoint bitwise"
else
  fail "train --forms laga-ulysses resume: $(tail -3 "$work/out")"
fi
# --ulysses 4 = P: a ring of one group
for other in 1 4; do
  args=(train --model tiny --seq 32 --sp 4 --lr 1e-2 --dtype fp32 --forms laga-ulysses --ulysses "$other" --steps 12 --resume "$work/ck")
  "$laga" "${args[@]}" >"$work/out" 2>&1
  status=$?
  if [ "$status" -eq 2 ] && grep -q "a checkpoint of another run: ulysses: expected $other, found 2" "$work/out"; then
    ok "resume with --ulysses $other of a --ulysses 2 checkpoint: refused naming both"
  else
    fail "resume with --ulysses $other: status $status: $(cat "$work/out")"
  fi
done

# 6. Under mpirun -np 4: bench validated as under threads; train bitwise the threads' losses.
if timeout 300 "${mpi[@]}" -np 4 "$laga" "${bench[@]}" --forms explicit,laga --json "$work/bm.json" >"$work/out" 2>&1 &&
   json_has "$work/bm.json" "j['backend']=='mpi' and j['pass'] and $laga_row and $reduced_has"; then
  ok "bench --ulysses 2 under mpirun -np 4: a validated 'laga-ulysses (ulysses 2)' row"
else
  fail "bench --ulysses 2 under mpirun -np 4: $(tail -5 "$work/out")"
fi
[ "$(grep -c "laga bench" "$work/out")" -eq 1 ] || fail "bench under mpirun printed its table more than once"
if timeout 300 "${mpi[@]}" -np 4 "$laga" "${train[@]}" --ulysses 2 --forms explicit,laga --json "$work/tm.json" \
     >"$work/out" 2>&1 &&
   /usr/bin/python3 -c "import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:3]); \
     sys.exit(0 if [r['losses'] for r in a['runs']]==[r['losses'] for r in b['runs']] else 1)" "$work/t.json" "$work/tm.json"; then
  ok "train --ulysses 2 under mpirun -np 4: losses bitwise the threads'"
else
  fail "train --ulysses 2 under mpirun -np 4: $(tail -3 "$work/out")"
fi

[ "$failures" -eq 0 ] && echo "ulysses_bench_train: all cases pass" || echo "ulysses_bench_train: $failures failures"
[ "$failures" -eq 0 ]
