#!/usr/bin/env bash
# laga bench-comm under threads at P 2 and 4 on a small sweep of every collective and both dtypes:
# exit 0, every row validated (#wrong 0), the JSON keys the performance model reads, busbw = algbw ·
# (P−1)/P (all_reduce 2(P−1)/P), algbw = bytes / time, counts as the ops need them, the table's header.
# (The checker catching a broken collective: tests/comm/test_bench_comm.cpp.)
# Usage: bench_comm.sh <laga binary> <source dir>
set -u
laga=$1
src=${2:-.}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

for P in 2 4; do
  if timeout 300 "$laga" bench-comm --sp "$P" -b 1K -e 256K -f 16 --dtype bf16,fp32 -n 5 -w 1 \
      --json "$work/p$P.json" >"$work/out$P" 2>&1; then
    echo "ok: bench-comm --sp $P"
  else
    fail "bench-comm --sp $P: $(tail -5 "$work/out$P")"
    continue
  fi
  grep -q '^# machine: ' "$work/out$P" || fail "P $P: no '# machine:' header"
  grep -q "^# backend: threads, P $P, dtype bf16,fp32" "$work/out$P" || fail "P $P: no backend/P/dtype header"
  grep -q '^# link: in-process threads' "$work/out$P" || fail "P $P: no '# link:' header"
  grep -q '#wrong' "$work/out$P" || fail "P $P: no #wrong column"
  /usr/bin/python3 - "$work/p$P.json" "$P" <<'PY' || fail "P $P: JSON"
import json, sys
j = json.load(open(sys.argv[1])); P = int(sys.argv[2])
assert j["command"] == "bench-comm" and j["sp"] == P and j["backend"] == "threads", (j["command"], j["sp"], j["backend"])
assert j["link"] == "in-process threads" and "cpu_model" in j["machine"], j["link"]
keys = {"op", "dtype", "bytes", "count", "time_s", "time_s_min", "time_s_max", "algbw_GBps", "busbw_GBps", "wrong"}
rows = j["rows"]
assert len(rows) == 4 * 2 * 3, len(rows)  # 4 ops × 2 dtypes × sizes 1K, 16K, 256K
for r in rows:
    assert keys <= set(r), keys - set(r)
    assert r["wrong"] == 0, r
    assert 0 < r["time_s_min"] <= r["time_s"] <= r["time_s_max"], r
    size = {"bf16": 2, "fp32": 4}[r["dtype"]]
    assert r["bytes"] == r["count"] * size, r
    assert r["op"] == "all_reduce" or r["count"] % P == 0, r
    assert abs(r["algbw_GBps"] - r["bytes"] / r["time_s"] / 1e9) <= 1e-9 * r["algbw_GBps"], r
    factor = (2 if r["op"] == "all_reduce" else 1) * (P - 1) / P
    assert abs(r["busbw_GBps"] - r["algbw_GBps"] * factor) <= 1e-12 + 1e-9 * r["busbw_GBps"], r
assert {r["op"] for r in rows} == {"all_gather", "reduce_scatter", "all_to_all", "all_reduce"}
assert {r["bytes"] for r in rows if r["op"] == "all_reduce"} == {1024, 16384, 262144}
PY
done

# One op, LAGA_LINK names the link in the header and the JSON.
LAGA_LINK="test link" "$laga" bench-comm --sp 2 -b 64 -e 64 --ops all_to_all -n 2 --json "$work/link.json" \
  >"$work/out" 2>&1 || fail "bench-comm with LAGA_LINK: $(tail -3 "$work/out")"
grep -q '^# link: test link' "$work/out" || fail "LAGA_LINK not in the header"
/usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['link']=='test link' and len(j['rows'])==1" \
  "$work/link.json" || fail "LAGA_LINK not in the JSON"

# --host-cost: one reading per op at the largest size, in the text and the JSON, which laga model's
# --comm-json takes (its link line then names the host cost).
"$laga" bench-comm --sp 2 -b 256K -e 16M -f 8 -n 3 -w 1 --host-cost --json "$work/host.json" >"$work/host.out" 2>&1 \
  || fail "bench-comm --host-cost: $(tail -3 "$work/host.out")"
grep -q '^# host cost: ' "$work/host.out" || fail "--host-cost: no '# host cost:' header"
/usr/bin/python3 - "$work/host.json" <<'PY' || fail "--host-cost: JSON"
import json, math, sys
j = json.load(open(sys.argv[1]))
h = j["host_cost"]
assert sorted(r["op"] for r in h) == ["all_gather", "all_reduce", "all_to_all", "reduce_scatter"], h
for r in h:
    assert r["bytes"] == 16777216 and r["products"] >= 8 and r["alone_s"] > 0 and r["beside_s"] > 0, r
    assert r["exposed_s"] >= 0 and math.isfinite(r["host_ns_per_byte"]), r
    assert abs(r["host_ns_per_byte"] - (r["beside_s"] - r["alone_s"]) / r["wire_bytes"] * 1e9) < 1e-6 * max(1, abs(r["host_ns_per_byte"])), r
    factor = (2 if r["op"] == "all_reduce" else 1) * 0.5
    assert r["wire_bytes"] == r["bytes"] * factor, r
PY
# laga model takes that file's host cost. Its rows' times are replaced by a known link (latency 10 us,
# busbw 2 GB/s): three sizes timed on a loaded machine (ASan, a parallel suite) need not grow with the
# size, and the fit then rightly refuses them. The link line must give back that link and the host cost.
/usr/bin/python3 - "$work/host.json" "$work/host-link.json" <<'PY' || fail "--host-cost: could not write the known link"
import json, sys
j = json.load(open(sys.argv[1]))
P = j["sp"]
for r in j["rows"]:
    factor = (2 if r["op"] == "all_reduce" else 1) * (P - 1) / P
    r["time_s"] = 10e-6 + r["bytes"] * factor / 2e9
    r["algbw_GBps"] = r["bytes"] / r["time_s"] / 1e9
    r.pop("busbw_GBps", None)
json.dump(j, open(sys.argv[2], "w"))
PY
"$laga" model --model small --seq 512 --sp 2 --hw "$src/docs/hw/h100-class.json" --comm-json "$work/host-link.json" \
  >"$work/model.out" 2>&1 || fail "model --comm-json with a host cost: $(tail -3 "$work/model.out")"
/usr/bin/python3 - "$work/host.json" "$work/model.out" <<'PY' || fail "model: the link line does not give back the known link and each op's host cost: $(grep '^# intra' "$work/model.out")"
import json, sys
line = next(l for l in open(sys.argv[2]) if l.startswith("# intra"))
assert "busbw GB/s all_to_all 2, all_gather 2, reduce_scatter 2, all_reduce 2; latency 10 us; " \
       "host cost of hidden bytes, ns per byte sent: " in line, line
for r in json.load(open(sys.argv[1]))["host_cost"]:
    assert "%s %s" % (r["op"], format(max(0.0, r["host_ns_per_byte"]), ".3g")) in line, (r, line)
PY
[ "$failures" -eq 0 ] && echo "bench_comm: all cases pass" || echo "bench_comm: $failures failures"
[ "$failures" -eq 0 ]
