#!/usr/bin/env bash
# scripts/report.py, the writer of `laga report`'s report.md, on the JSON of real (tiny) runs of every
# command it reads: each section renders its table from those files (every registered form in the
# memory table, every verify case, every bench row with its #wrong, the model's error per row, the
# loss curves), the plots are written, and a step recorded as skipped is reported with its reason
# instead of a number. Also: `laga report` refuses a missing --out and an unknown flag with exit 2
# (tests/cli/cli_bad_input.sh). Every registered form is listed under the kernel it runs, and a grid won by
# a form the script has never heard of is drawn. The language model's section, on two short runs of
# examples/train_lm.py, where the Python package was built. Usage: report.sh <laga binary> <source dir>
set -u
laga=$1
src=$2
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }
run() {  # name, command...: a step of the report, run here at tiny size
  local name=$1; shift
  if "$@" >"$d/$name.log" 2>&1; then ok "$name"; else fail "$name: $(tail -3 "$d/$name.log")"; fi
}

run verify "$laga" verify --model tiny --seq 32 --sp 1,2 --json "$d/verify.json"
run plan.fused "$laga" plan --model tiny --seq 64 --sp 2 --json "$d/plan.fused.json"
run plan.sweep "$laga" plan --sweep --model tiny --json "$d/plan_sweep.json"
run bench "$laga" bench --model tiny --seq 32,64 --sp 2 --forms explicit,laga --iters 1 --json "$d/bench.threads.fused.json"
run bench-comm "$laga" bench-comm --sp 2 -b 4K -e 64K --json "$d/bench_comm.threads.json"
run model "$laga" model --hw "$src/docs/hw/ascend-910b.json" --bench-json "$d/bench.threads.fused.json" \
  --json "$d/model.vs_bench.fused.json"
run model.paper "$laga" model --model deepseek-v3 --seq 4096 --sp 8 --hw "$src/docs/hw/ascend-910b.json" \
  --json "$d/model.paper.ascend-910b.p8.t4096.json"
run calibrate "$laga" model --calibrate "$d/hw.here.json" --sp 2 --calibrate-seq 64
run plan.dsa "$laga" plan --model tiny --seq 64 --sp 4 --json "$d/plan.dsa.t64.p4.json"
run train "$laga" train --model tiny --seq 32 --sp 2 --steps 40 --lr 1e-2 --forms explicit,laga --dtype fp32 --json "$d/train.json"
# The language model (examples/train_lm.py) with laga's attention at P 2 under torchrun and with the plain
# PyTorch MLA, where the Python package was built beside the binary (laga report's steps train_lm.*).
pkg=$(dirname "$(dirname "$(realpath "$laga")")")/python
if [ -f "$pkg/laga/__init__.py" ]; then
  lm=(--steps 6 --seq 32 --batch 2 --eval-every 3 --eval-windows 2)
  run train_lm.laga env PYTHONPATH="$pkg" /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 \
    -r 1 -t 1 --log_dir "$d/logs/train_lm.ranks" "$src/examples/train_lm.py" "${lm[@]}" --json "$d/train_lm.laga.json"
  run train_lm.torch env PYTHONPATH="$pkg" /usr/bin/python3 "$src/examples/train_lm.py" --attention torch "${lm[@]}" \
    --json "$d/train_lm.torch.json"
else
  echo "not checked: the language model's section (no Python package in $pkg)"
fi
mkdir -p "$d/logs"
echo "link.sh: refused: not root (a test)" >"$d/logs/bench.link.matched.log"
cat >"$d/steps.json" <<'EOF'
{"quick": true, "steps": [
 {"name": "verify", "title": "t", "command": "c", "status": "ok", "exit": 0, "seconds": 1.5, "log": "logs/verify.log", "reason": ""},
 {"name": "bench.link.matched", "title": "t", "command": "c", "status": "skipped", "exit": 2, "seconds": 0.1,
  "log": "logs/bench.link.matched.log", "reason": "link.sh: refused: not root (a test)"}]}
EOF

if /usr/bin/python3 "$src/scripts/report.py" "$d" >"$d/report.py.log" 2>&1; then
  ok "report.py"
else
  fail "report.py: $(tail -5 "$d/report.py.log")"
fi
md="$d/report.md"
[ -s "$md" ] || { fail "no report.md"; echo "report: $failures failure(s)"; exit 1; }
expect() {  # pattern (grep -E), what
  if grep -qE -- "$1" "$md"; then ok "$2"; else fail "$2: no /$1/ in report.md"; fi
}
expect "^Overall: \*\*pass\*\*" "verify's verdict"
expect "^\| 64 \| 4 \| .* \| .* \| 0\.[0-9]+ \|" "the sparse forms' saved bytes, gather against regather"
expect "^\| 64 \| 4 \| contiguous \| " "the sparse forms' work per rank in the contiguous layout"
# Every verify case in its form's row (form, reference) and its P's column.
/usr/bin/python3 - "$d/verify.json" "$md" <<'PY' && ok "a verify cell per case" || fail "a verify case without its cell"
import json, sys
cases, md = json.load(open(sys.argv[1]))["cases"], open(sys.argv[2]).read().splitlines()
head = next(l for l in md if l.startswith("| form | vs | P "))
cols = [c.strip() for c in head.strip("|").split("|")]
rows = {tuple(c.strip() for c in l.strip("|").split("|")[:2]): [c.strip() for c in l.strip("|").split("|")]
        for l in md if l.startswith("| ")}
bad = [c for c in cases if rows.get((c["form"], c["vs"]), [""] * len(cols))[cols.index(f"P {c['sp']}")] in ("", "-")]
print(bad)
sys.exit(1 if bad or not cases else 0)
PY
# Each form under the kernel it runs (plan's attention_kernel: laga-fused's latent, the ring forms' fused).
for fk in $(/usr/bin/python3 -c "import json; print(' '.join(f'{k}:{v[\"attention_kernel\"]}' for k, v in json.load(open('$d/plan.fused.json'))['forms'].items() if k != 'absorbed'))"); do
  expect "^\| ${fk#*:} \| ${fk%%:*} \| " "memory row of ${fk%%:*} under ${fk#*:}"
done
expect "^\| (32|64) \| laga \| .* \| 0 \|$" "bench rows with #wrong"
expect "^Error of the total over 4 rows: max " "the model's error over every bench row"
expect "^\| ascend-910b \| 8 \| [0-9.]+ \| - \| - \| 1.05 / 1.06 / 1.04 \|" "a paper configuration predicted"
expect "bench across the link: no data \(skipped: link.sh: refused: not root \(a test\)\)" "a skipped step's reason"
expect "^\| laga \| [0-9.]+ \| [0-9.]+ \| " "a training row"
if [ -f "$pkg/laga/__init__.py" ]; then
  expect "^\| laga \(P 2\) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| 6 \| [0-9]+ \|" "the language model's laga row"
  expect "^\| PyTorch \(P 1\) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| 6 \| [0-9]+ \|" "the language model's PyTorch row"
  expect "^Train loss \(nats\) between the two: max \|Δ\| " "the language model's loss difference"
  [ -s "$d/train_lm.png" ] && ok "train_lm.png" || fail "no train_lm.png"
fi
expect "^Every rate was read in two rounds; [0-9]+ whose readings differed by more than 10 % were read a third time" \
  "the calibration's rounds"

# The link section's check of the matched rate: a later calibration (the link steps' own) reading bf16
# matmul 2× the one the matched rate came from is flagged with the factor; one within 10 % is not.
d2=$d/link
mkdir -p "$d2"
cp "$d/bench.threads.fused.json" "$d2/bench.link.matched.json"  # a real bench file in the link's place
for factor in 2.0 1.05; do
  /usr/bin/python3 - "$d/hw.here.json" "$d2" "$factor" <<'PY'
import json, sys
hw, d2, f = json.load(open(sys.argv[1])), sys.argv[2], float(sys.argv[3])
here = hw["compute"]["bf16"]["matmul_tflops"]["64"]
json.dump({"paper_link_Bps": 11e9, "npu_matmul_tflops": 192, "here_matmul_tflops": here, "seq": 64,
           "matched_Bps": 11e9 * here / 192}, open(f"{d2}/link_rates.json", "w"))
hw["compute"]["bf16"]["matmul_tflops"]["64"] = here * f
json.dump(hw, open(f"{d2}/hw.link.matched.json", "w"))
PY
  /usr/bin/python3 "$src/scripts/report.py" "$d2" >"$d2/report.py.log" 2>&1 || fail "report.py (link check, ×$factor): $(tail -3 "$d2/report.py.log")"
  if [ "$factor" = 2.0 ]; then
    grep -qE "^\*\*Check: the matched rate's calibration disagrees.*\+100 % at the worst.*2\.00× the rate used" "$d2/report.md" \
      && ok "a disagreeing calibration flagged" || fail "no flag for a calibration 2× the matched rate's"
  else
    grep -qE "^Check: the later calibrations in this run read bf16 matmul at T 64 .* within 10 %" "$d2/report.md" \
      && ok "an agreeing calibration not flagged" || fail "an agreeing calibration (×1.05) not reported as agreeing"
  fi
done

# The targets that open report.md, on rows made up to fall on either side of each line: "missed" has
# laga slower than explicit where communication is 20 % of explicit's step, laga / explicit 1.026 at the
# matched rate and T 4096 (the paper: 1.07 at 4K) and the model 12 % off one row, 2.2 % off once its
# 0.1 s of skew (ranks waiting for each other) is taken out, which the missed line then says; "met"
# mends all three.
# A row whose communication is 5 % of explicit's step is not judged, whichever form is faster.
for mode in missed met; do
  d3=$d/targets.$mode
  mkdir -p "$d3"
  /usr/bin/python3 - "$d3" "$mode" <<'PY'
import json, sys
d, met = sys.argv[1], sys.argv[2] == "met"
def row(T, form, total, comm, skew=None):
    r = {"seq": T, "variant": form, "form": form, "fwd_s": total / 3, "bwd_s": total / 3, "comm_s": comm,
         "total_s": total, "tokens_per_s": T / total, "speedup_vs_explicit": 0, "wrong": 0}
    if skew is not None:
        r["comm_skew_s"] = skew
    return r
def bench(name, rows):
    json.dump({"kernel": "fused", "link": "made up", "rows": rows}, open(f"{d}/{name}", "w"))
def model(name, rows):
    json.dump({"comparison": {"rows": [{"seq": T, "form": f, "measured": {"total_s": m, "comm_skew_s": k},
                                        "predicted": {"total_s": p}, "rel_error_total": p / m - 1,
                                        "rel_error_without_skew": p / (m - k) - 1,
                                        "by_class": {"matmul": {"measured_s": m / 2, "predicted_s": p / 2}}}
                                       for T, f, m, p, k in rows]}},
              open(f"{d}/{name}", "w"))
bench("bench.threads.fused.json", [row(2048, "explicit", 1.0, 0.05), row(2048, "laga", 1.02, 0.04)])
bench("bench.link.matched.json", [row(2048, "explicit", 2.0, 1.0), row(2048, "laga", 1.6, 0.6),
                                  row(4096, "explicit", 4.0, 2.0), row(4096, "laga", 3.7 if met else 3.9, 1.9)])
bench("bench.link.fast.overlap.json", [row(2048, "explicit", 1.0, 0.2, 0.1), row(2048, "laga", 0.95 if met else 1.1, 0.1)])
model("model.vs_bench.link.matched.json", [(2048, "laga", 1.6, 1.648, 0.0)])
model("model.vs_bench.link.fast.overlap.json", [(2048, "laga", 1.0, 0.96 if met else 0.88, 0.1)])
PY
  /usr/bin/python3 "$src/scripts/report.py" "$d3" >"$d3/report.py.log" 2>&1 || fail "report.py (targets, $mode): $(tail -3 "$d3/report.py.log")"
  if [ "$mode" = missed ]; then
    lines=("^\| laga at least as fast as explicit, fused, .* \| 2 of 3 rows; slowest explicit / laga 0\.909 \(link, 4× faster, overlap, T 2048\) \| \*\*missed\*\* \|$"
           "^\| laga / explicit across the link at the matched rate .* \| T 2048: 1\.250 \(paper 1\.07 at 4K\); T 4096: 1\.026 \(paper 1\.07 at 4K\) \| \*\*missed\*\* \|$"
           "^\| the model within 10 % .* \| 1 of 2 rows within 10 %; max 12\.0 % \(link, 4× faster, overlap, T 2048, laga\), mean 7\.5 %\. Against each total less .* \(skew: .*\): 2 of 2 within 10 %, max 3\.0 %, mean 2\.6 % \(section 7\) \| \*\*missed\*\* \|$")
  else
    lines=("^\| laga at least as fast as explicit, fused, .* \| 3 of 3 rows; slowest explicit / laga 1\.053 \(link, 4× faster, overlap, T 2048\) \| met \|$"
           "^\| laga / explicit across the link at the matched rate .* \| T 2048: 1\.250 \(paper 1\.07 at 4K\); T 4096: 1\.081 \(paper 1\.07 at 4K\) \| met \|$"
           "^\| the model within 10 % .* \| 2 of 2 rows within 10 %; max 4\.0 % \(link, 4× faster, overlap, T 2048, laga\), mean 3\.5 % \| met \|$")
  fi
  for l in "${lines[@]}"; do
    grep -qE -- "$l" "$d3/report.md" && ok "target ($mode): ${l:4:40}" || fail "targets ($mode): no /$l/ in report.md"
  done
  # The judged rows show the share of explicit's step that is its ranks waiting for each other, where the
  # bench measured it.
  grep -qE "^\| link, 4× faster, overlap \| 2048 \| 20 % \| 10 % \| $([ "$mode" = met ] && echo 1\\.053 || echo 0\\.909) \| 0 \|$" "$d3/report.md" \
    && grep -qE "^\| link, matched \| 2048 \| 50 % \| - \| 1\.250 \| 0 \|$" "$d3/report.md" \
    && ok "target 1's rows with their skew ($mode)" || fail "targets ($mode): target 1's rows lack their skew share"
  # Section 7's model errors by op class: the median over a comparison's rows (here one row each, its
  # matmul half at the total's error), "-" for a class its rows lack.
  grep -qE "^\| link, 4× faster, overlap \| 1 \| $([ "$mode" = met ] && echo -4 || echo -12) % \| - \| - \| - \|$" "$d3/report.md" \
    && grep -qE "^\| link, matched \| 1 \| \+3 % \| - \| - \| - \|$" "$d3/report.md" \
    && ok "model errors by class ($mode)" || fail "targets ($mode): section 7 lacks the model's errors by class"
  grep -qE "^Below 10 % \(not judged\): 1 row, explicit / laga 0\.980 to 0\.980\.$" "$d3/report.md" \
    && ok "a row below 10 % not judged ($mode)" || fail "targets ($mode): the row below 10 % not reported as not judged"
done

# Every registered form, iterated from laga's own registry (plan lists each with the kernel it runs): in an
# eager bench, the forms with their own kernel (laga-fused's latent, the ring forms' fused) must never be
# listed under eager, in any table; and a grid whose cells a form outside every list of the script wins
# (here "laga-newform") must come out as the heat map and the summary's line, its table left in the JSON.
d4=$d/registry
mkdir -p "$d4"
cp "$d"/verify.json "$d"/plan_sweep.json "$d"/train.json "$d"/hw.here.json "$d4"/
run plan.eager "$laga" plan --model tiny --seq 64 --sp 2 --kernel eager --json "$d4/plan.eager.json"
all=$(/usr/bin/python3 -c "import json; print(','.join(k for k, v in json.load(open('$d4/plan.eager.json'))['forms'].items() if k != 'absorbed' and 'not_run' not in v))")
own=$(/usr/bin/python3 -c "import json; print(' '.join(k for k, v in json.load(open('$d4/plan.eager.json'))['forms'].items() if v.get('attention_kernel', 'eager') != 'eager'))")
[ -n "$own" ] && ok "forms with their own kernel: $own" || fail "plan --kernel eager names no form with its own kernel"
run bench.eager "$laga" bench --model tiny --seq 64 --sp 2 --kernel eager --forms "$all" --iters 1 --json "$d4/bench.threads.eager.json"
run bench.fused "$laga" bench --model tiny --seq 64 --sp 2 --kernel fused --forms "$all" --iters 1 --json "$d4/bench.threads.fused.json"
run model.eager "$laga" model --hw "$src/docs/hw/ascend-910b.json" --bench-json "$d4/bench.threads.eager.json" \
  --json "$d4/model.vs_bench.eager.json"
run model.grid "$laga" model --grid --hw "$src/docs/hw/h100-class.json" --json "$d4/model.grid.h100-class.json"
/usr/bin/python3 - "$d4/model.grid.h100-class.json" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
for i, row in enumerate(g["grid"]):
    # a form no list in report.py names wins a third of the dense cells, by 1.5×
    if i % 3 == 0 and row["model"] != "deepseek-v3.2":
        row["times_s"]["laga-newform"] = min(row["times_s"].values()) / 1.5
        row["winner"] = "laga-newform"
json.dump(g, open(sys.argv[1], "w"))
PY
if /usr/bin/python3 "$src/scripts/report.py" "$d4" >"$d4/report.py.log" 2>&1; then ok "report.py (registry)"; else fail "report.py (registry): $(tail -5 "$d4/report.py.log")"; fi
[ -s "$d4/winners_h100-class.png" ] && ok "the grid's heat map" || fail "no heat map winners_h100-class.png"
n_cells=$(/usr/bin/python3 -c "import json; print(sum(1 for i, r in enumerate(json.load(open('$d4/model.grid.h100-class.json'))['grid']) if i % 3 == 0 and r['model'] != 'deepseek-v3.2'))")
grep -qE "^cells won, of [0-9]+: .*laga-newform $n_cells[,;]" "$d4/report.md" && ok "the grid's line names the new form ($n_cells cells)" \
  || fail "no line counting laga-newform's $n_cells cells"
grep -qE "^\| the predicted fastest form over the grid .*laga-newform" "$d4/report.md" && ok "the summary names the grid's winners" \
  || fail "the summary lacks the grid's winners"
grep -qE "^\| (0\.25|1|4) \| deepseek" "$d4/report.md" && fail "the grid's table is in report.md" || ok "the grid's table stays in its JSON"
[ "$(grep -n '^## ' "$d4/report.md" | head -2 | cut -d' ' -f2- | tr '\n' ,)" = "Summary,Targets in detail," ] \
  && ok "report.md opens with the summary and the targets" || fail "report.md does not open with the summary"
/usr/bin/python3 - "$d4/report.md" $own <<'PY' && ok "no form with its own kernel listed under eager" || fail "a form with its own kernel listed under eager"
import sys
md, own = open(sys.argv[1]).read().splitlines(), set(sys.argv[2:])
bad = [l for l in md if l.startswith("|") and "eager" in (c.strip() for c in l.split("|")) and own & {c.strip() for c in l.split("|")}]
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
for f in $own; do
  k=$(/usr/bin/python3 -c "import json; print(json.load(open('$d4/plan.eager.json'))['forms']['$f']['attention_kernel'])")
  grep -qE "^\| 64 \| $f( \(ulysses [0-9]+\))? \| $k \| " "$d4/report.md" && ok "$f's bench row under $k" || fail "no bench row of $f under $k"
done

# The published-measurements section is report_published.py's section_published(r), called when that
# module lies beside report.py (here a stand-in), after section 9; without it report.py has no such section.
grep -q "^## Published" "$d4/report.md" && [ ! -f "$src/scripts/report_published.py" ] && fail "a published section without its module"
mkdir -p "$d/scripts"
cp "$src"/scripts/report*.py "$d/scripts/"
printf 'def section_published(r):\n    r.h("Published measurements")\n    r.p("stand-in")\n' >"$d/scripts/report_published.py"
/usr/bin/python3 "$d/scripts/report.py" "$d4" >"$d4/report.py.log" 2>&1 || fail "report.py with report_published.py: $(tail -3 "$d4/report.py.log")"
[ "$(grep '^## ' "$d4/report.md" | tail -3 | head -2 | tr '\n' ,)" = "## 9. Training,## Published measurements," ] \
  && ok "the published section, after section 9, where its module is" || fail "no published section after section 9"

for png in memory_vs_T comm_vs_H speedup_one_machine model_vs_measured train_loss; do
  [ -s "$d/$png.png" ] && ok "$png.png" || fail "$png.png not written"
done
if [ "$failures" -eq 0 ]; then echo "report: all checks pass"; else echo "report: $failures failure(s)"; exit 1; fi
