#!/usr/bin/env bash
# laga model on the hardware files of docs/hw at the paper's configurations: every registered form is
# predicted, a winner named, the JSON written with every form; and --bench-json compares a bench file
# row by row. Usage: model.sh <laga binary> <source dir>
set -u
laga=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

for hw in "$src"/docs/hw/*.json; do
  for sp in 8 16; do
    out=$("$laga" model --model deepseek-v3 --seq 4096 --sp "$sp" --hw "$hw" --json "$tmp/m.json") || { fail "$hw P $sp exit $?"; continue; }
    grep -q "^winner: " <<<"$out" || fail "$hw P $sp: no winner line"
    python3 - "$tmp/m.json" <<'PY' || fail "$hw P $sp: JSON"
import json, sys
j = json.load(open(sys.argv[1]))
forms = j["forms"]
assert j["winner"] in forms, j["winner"]
# the sparse forms cannot run DeepSeek-V3 (no indexer): listed as not run, with the reason
for name in ("dsa-gather", "dsa-regather"):
    assert "indexer" in forms.pop(name)["not_run"], name
for name, f in forms.items():
    assert abs(f["fwd_s"] + f["bwd_s"] - f["total_s"]) < 1e-12 * f["total_s"], name
    assert f["comm_s"] > 0 and f["collectives"], name
assert min(forms, key=lambda n: forms[n]["total_s"]) == j["winner"]
for need in ("explicit", "laga", "absorbed-shared", "absorbed-expanded"):
    assert need in forms, need
PY
    echo "ok: $(basename "$hw") P $sp: $(grep '^winner' <<<"$out")"
  done
done

# --calibrate on this machine at a short T: every rate of both dtypes measured (laga-fused's kernel
# included), finite and positive, and the file predicts every form.
"$laga" model --calibrate "$tmp/cal.json" --sp 2 --calibrate-seq 64 >/dev/null || fail "--calibrate exit $?"
python3 - "$tmp/cal.json" <<'PY' || fail "--calibrate JSON"
import json, math, sys
j = json.load(open(sys.argv[1]))
c = j["compute"]
# Every rate read in two rounds; the ones read a third time (rounds apart) are listed with all readings.
assert "rounds" in j["notes"], j["notes"].keys()
for r in j["notes"]["remeasured"]:
    assert len(r["rates"]) == 3 and all(math.isfinite(x) and x > 0 for x in r["rates"]), r
for dt in ("bf16", "fp32"):
    s = c[dt]
    for k in ["matmul_tflops", "elementwise_GBps", "accumulate_GBps"] + [f"{p}attention_{d}_tflops" for d in ("fwd", "bwd")
              for p in ("", "eager_", "latent_", "eager_latent_", "mqa_", "eager_mqa_", "laga_fused_")]:
        v = s[k]["64"] if isinstance(s[k], dict) else s[k]
        assert math.isfinite(v) and v > 0, (dt, k, v)
PY
out=$("$laga" model --model small --seq 64 --sp 2 --hw "$tmp/cal.json") || fail "predicting with the calibrated file: exit $?"
grep -q "laga-fused" <<<"$out" || fail "the calibrated file did not predict laga-fused"

# --bench-json: a bench file of two rows, compared row by row with a max and mean error.
cat >"$tmp/bench.json" <<'JSON'
{"command": "bench", "config": {"model": "tiny", "hidden_size": 64, "num_attention_heads": 8, "q_lora_rank": 48,
 "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12, "num_layers": 1, "seq_len": 64,
 "batch": 1, "sp": 2, "form": "explicit", "kernel": "fused", "dtype": "bf16", "rms_norm_eps": 1e-6, "rope_theta": 10000,
 "rope_interleaved": true, "rope_scaling": null},
 "rows": [{"form": "explicit", "variant": "explicit", "seq": 64, "sp": 2, "fwd_s": 0.001, "bwd_s": 0.002, "comm_s": 0.0005, "total_s": 0.003},
          {"form": "laga", "variant": "laga", "seq": 64, "sp": 2, "fwd_s": 0.001, "bwd_s": 0.002, "comm_s": 0.0004, "total_s": 0.003}]}
JSON
out=$("$laga" model --hw "$src/docs/hw/h100-class.json" --bench-json "$tmp/bench.json" --json "$tmp/c.json") || fail "--bench-json exit $?"
grep -q "error of the total: max" <<<"$out" || fail "--bench-json: no error summary"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert len(j['comparison']['rows']) == 2" "$tmp/c.json" || fail "--bench-json JSON"
! grep -q "by op class" <<<"$out" || fail "--bench-json: a by-class table for rows without profiles"
# With bench --profile's per-row profile: the time by class against the model's classes.
python3 - "$tmp/bench.json" "$tmp/bp.json" <<'PY' || fail "writing a profiled bench file"
import json, sys
j = json.load(open(sys.argv[1]))
for r in j["rows"]:
    r["profile"] = {k: {"seconds": 0.001, "flops": 1e6, "calls": 1} for k in ("matmul", "attention_fwd", "attention_bwd")}
    r["profile"]["other_s"] = 0.0002
json.dump(j, open(sys.argv[2], "w"))
del j["rows"][1]["profile"]["other_s"]
json.dump(j, open(sys.argv[2] + ".bad", "w"))
PY
out=$("$laga" model --hw "$src/docs/hw/h100-class.json" --bench-json "$tmp/bp.json" --json "$tmp/cp.json") || fail "--bench-json with profiles exit $?"
grep -q "^# by op class" <<<"$out" && [ "$(grep -c "^ *64   2 \(explicit\|laga\) .* / " <<<"$out")" -eq 2 ] || fail "--bench-json: no by-class rows"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); r=j['comparison']['rows'][0]['by_class']; \
assert set(r)=={'matmul','attention_fwd','attention_bwd','other'} and r['other']['measured_s']==0.0002 \
and all(v['predicted_s']>0 for v in r.values())" "$tmp/cp.json" || fail "--bench-json by_class JSON"
"$laga" model --hw "$src/docs/hw/h100-class.json" --bench-json "$tmp/bp.json.bad" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "rows\[1\].profile.other_s" "$tmp/err" || fail "--bench-json: a profile without other_s: exit $rc, $(cat "$tmp/err")"

# --grid: every cell's winner is the fastest of the forms that can run it; a form that cannot is listed
# with its reason; a faster link never makes a cell's winner slower.
out=$("$laga" model --grid --hw "$src/docs/hw/h100-class.json" --json "$tmp/g.json") || fail "--grid exit $?"
python3 - "$tmp/g.json" <<'PY' || fail "--grid JSON"
import json, sys
rows = json.load(open(sys.argv[1]))["grid"]
assert len(rows) == 3 * 3 * 3 * 4, len(rows)
for x in rows:
    t = x["times_s"]
    assert x["winner"] == min(t, key=t.get) and x["winner_s"] == t[x["winner"]], x
    if x["model"] == "deepseek-v3.2":  # the sparse forms race each other alone, their peaks beside
        m = x["activation_peak_bytes"]
        assert set(t) == {"dsa-gather", "dsa-regather"} == set(m), x
        assert m["dsa-regather"] <= m["dsa-gather"], x
        continue
    if x["sp"] > x["heads"]:
        assert "explicit" in x["not_run"] and "explicit" not in t, x
        assert "ring-latent" in t, x
    else:
        assert "explicit" in t, x
cell = lambda x: (x["model"], x["seq"], x["sp"])
by = {(x["link_scale"], cell(x)): x["winner_s"] for x in rows}
for (s, c), w in by.items():
    if s < 4:
        assert by[(4, c)] <= w, (s, c)
print(f"ok: --grid: {len(rows)} cells")
PY
out=$("$laga" model --grid --hw "$src/docs/hw/h100-class.json" --link-scale 0 2>&1); status=$?
[ "$status" -eq 2 ] && grep -q "link-scale 0 must be a positive factor" <<<"$out" || fail "--link-scale 0: status $status: $out"
python3 - "$src/docs/hw/h100-class.json" "$tmp/one-node.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["link"].pop("inter_node", None)
json.dump(j, open(sys.argv[2], "w"))
PY
out=$("$laga" model --grid --hw "$tmp/one-node.json" 2>&1); status=$?
[ "$status" -eq 2 ] && grep -q "grid reaches P 64.*no link.inter_node" <<<"$out" || fail "--grid one node: status $status: $out"
out=$("$laga" model --grid --hw "$src/docs/hw/h100-class.json" --seq 4096 2>&1); status=$?
[ "$status" -eq 2 ] && grep -q "grid chooses its own" <<<"$out" || fail "--grid --seq: status $status: $out"

[ "$failures" -eq 0 ] && echo "model: all cases pass" || echo "model: $failures failures"
[ "$failures" -eq 0 ]
