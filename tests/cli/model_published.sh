#!/usr/bin/env bash
# laga model --published docs/published.json: every row predicted, its JSON complete (what it
# assumes, the prediction, the published number, the difference, a reason where they differ by more
# than 10 %); every number of the hardware files the rows added has a source note; a bad data file
# is refused with exit 2 naming the field. Usage: model_published.sh <laga binary> <source dir>
set -u
laga=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$src/tests/cli/lib/check.bash"

before=$failures
out=$("$laga" model --published "$src/docs/published.json" --json "$tmp/p.json") ||
  fail "laga model --published exit $?"
grep -q "^# row .*published.*predicted" <<<"$out" || fail "no table header in the output"
/usr/bin/python3 - "$tmp/p.json" "$src/docs/published.json" <<'PY' || fail "the JSON's rows"
import json, math, sys
j = json.load(open(sys.argv[1]))
data = json.load(open(sys.argv[2]))
rows = j["rows"]
assert len(rows) == len(data["rows"]) > 0, (len(rows), len(data["rows"]))
ids = [r["id"] for r in rows]
assert len(set(ids)) == len(ids), ids
for r in rows:
    p, pub, d = r["predicted"]["speedup"], r["published"], r["difference"]
    for x in (p, pub, d):
        assert isinstance(x, float) and math.isfinite(x), (r["id"], x)
    assert p > 0 and pub > 0 and abs(d - (p / pub - 1)) < 1e-12, r["id"]
    a = r["assumes"]
    for k in ("model", "dims", "seq", "sp", "layers", "batch", "kernel", "dtype", "hw_file", "hw_name",
              "ranks_per_node", "link", "form", "baseline", "outside_attention", "mapping"):
        assert k in a and a[k] not in ("", None), (r["id"], k)
    o = a["outside_attention"]
    assert o["method"] in ("none", "share", "flops") and o["how"], (r["id"], o)
    assert 0 <= o["share_of_baseline_step"] < 1, (r["id"], o)
    assert (o["method"] == "none") == (o["seconds"] == 0), (r["id"], o)
    # The step is attention plus the time outside it, on both sides.
    q = r["predicted"]
    assert abs(q["form_step_s"] - q["form_attention_s"] - q["outside_s"]) <= 1e-12 * q["form_step_s"], r["id"]
    assert abs(p - q["baseline_step_s"] / q["form_step_s"]) < 1e-12 * p, r["id"]
    # Where the prediction and the publication differ by more than 10 %, the data file says why.
    if abs(d) > j["explain_above"]:
        assert r["why"], r["id"]
        assert not r["within_10_percent"], r["id"]
    assert not r["why_missing"], r["id"]
    m = r["share_outside_to_match"]
    if m is not None:  # at that share the prediction equals the published ratio
        ab, af = q["baseline_attention_s"], q["form_attention_s"]
        om = m / (1 - m) * ab
        assert abs((om + ab) / (om + af) / pub - 1) < 1e-9, (r["id"], m)
for f in {r["assumes"]["hw_file"] for r in rows}:
    assert f in j["hardware"], f
PY
grep -q "^  why: " <<<"$out" || fail "no why line printed"
[ "$failures" -eq "$before" ] && ok "laga model --published: $(grep -c '^## ' <<<"$out") rows"

# The report's section (scripts/report_published.py) renders every row and every reason.
mkdir -p "$tmp/report" && cp "$tmp/p.json" "$tmp/report/model.published.json"
(cd "$src/scripts" && /usr/bin/python3 - "$tmp/report" "$tmp/p.json" <<'PY') || fail "scripts/report_published.py"
import json, sys
import report, report_published
r = report.Report(sys.argv[1])
report_published.section_published(r)
md = "\n".join(r.md)
j = json.load(open(sys.argv[2]))
for x in j["rows"]:
    assert f"| {x['id']} |" in md, x["id"]
    if x["why"]:
        assert x["why"] in md, x["id"]
empty = report.Report(sys.argv[1] + "/none")
report_published.section_published(empty)
assert "no data" in "\n".join(empty.md)
print(f"ok: report_published.section_published: {len(j['rows'])} rows rendered")
PY

# Every number of the hardware files added for the published rows has a note with its source and how
# the number follows from it (an assumption says so): notes.<path> for the number's path or one of
# its ancestors.
/usr/bin/python3 - "$src/docs/hw/h100-sxm-ib.json" "$src/docs/hw/tpu-v5p.json" <<'PY' || fail "hardware notes"
import json, sys
for path in sys.argv[1:]:
    hw = json.load(open(path))
    notes = hw["notes"]
    numbers = []
    def walk(v, p):
        if isinstance(v, dict):
            for k, x in v.items():
                if k not in ("notes", "source"):
                    walk(x, f"{p}.{k}" if p else k)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            numbers.append(p)
    walk({k: hw[k] for k in ("compute", "link", "ranks_per_node")}, "")
    assert numbers, path
    for n in numbers:
        parts = n.split(".")
        keys = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
        note = next((notes[k] for k in keys if k in notes), None)
        assert isinstance(note, dict), f"{path}: {n} has no note"
        for field in ("source", "states", "how"):
            assert isinstance(note.get(field), str) and note[field].strip(), f"{path}: {n}: note lacks {field}"
        assert "http" in note["source"] or "assum" in note["how"] or note["source"].startswith("none: an assumption"), \
            f"{path}: {n}: the note names no document and says no assumption"
        if note["source"].startswith("none"):
            assert "assumed" in note["how"], f"{path}: {n}: a number without a source must say it is assumed"
    print(f"ok: {path}: {len(numbers)} numbers, each with a source note")
PY

# A bad data file: exit 2 and a message naming the field.
bad() {  # name, python edit of d (the data file), the field the message must name
  /usr/bin/python3 - "$src/docs/published.json" "$tmp/bad.json" "$2" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
src_dir = os.path.dirname(os.path.abspath(sys.argv[1]))
for r in d["rows"]:
    r["hw"] = os.path.join(src_dir, r["hw"])
exec(sys.argv[3])
json.dump(d, open(sys.argv[2], "w"))
PY
  msg=$("$laga" model --published "$tmp/bad.json" 2>&1)
  local rc=$?
  [ $rc -eq 2 ] || { fail "$1: exit $rc, want 2"; return; }
  grep -qF "$3" <<<"$msg" || { fail "$1: the message does not name $3: $msg"; return; }
  ok "$1 refused naming $3"
}
bad "a row without seq" 'del d["rows"][0]["seq"]' "rows[0].seq"
bad "a misspelt field" 'd["rows"][1]["sq"] = 4096' "rows[1].sq"
bad "a published ratio of the wrong type" 'd["rows"][2]["published"] = "1.05"' "rows[2].published"
bad "an unknown outside method" 'd["rows"][3]["outside_attention"]["method"] = "guess"' "rows[3].outside_attention.method"
bad "a share without whose step" 'd["rows"][0]["outside_attention"] = {"method": "share", "share": 0.5, "how": "x"}' \
  "rows[0].outside_attention.of"
bad "a side without overlap" 'del d["rows"][0]["form"]["overlap"]' "rows[0].form.overlap"
bad "a link factor without its reason" 'd["rows"][0]["form"]["link_scale"] = 2' "rows[0].form.link_scale_why"
bad "a repeated id" 'd["rows"][1]["id"] = d["rows"][0]["id"]' "rows[1].id"
bad "an unknown model" 'd["rows"][0]["model"] = "gpt"' "rows[0].model"
bad "no rows" 'd["rows"] = []' "rows"
bad "a form that cannot run the row" 'd["rows"][0]["form"]["form"] = "no-such-form"' "rows[0].form"
bad "a missing hardware file" 'd["rows"][0]["hw"] = "/nonexistent/hw.json"' "/nonexistent/hw.json"
msg=$("$laga" model --published "$src/docs/published.json" --seq 4096 2>&1)
[ $? -eq 2 ] && grep -q -- "--published" <<<"$msg" || fail "--published with --seq: not refused naming --published"
msg=$("$laga" model --published "$tmp/none.json" 2>&1)
[ $? -eq 2 ] && grep -qF "$tmp/none.json" <<<"$msg" || fail "a missing data file: not refused naming it"

exit $((failures > 0))
