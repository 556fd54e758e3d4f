#!/usr/bin/env bash
# Every command under mpirun, one process per rank, against the same command with ranks as threads:
# `laga verify --sp 1,2,4` under mpirun -np 4 (each P on the first P processes) passes and reports the
# same cases; `laga train` under mpirun -np 2 gives bitwise the same losses as under threads; `laga
# bench` under mpirun -np 2 reports validated rows for every form with the MPI backend named, and a
# wrong result once with a non-zero exit; so does `laga bench-comm` (every collective, #wrong 0); a bad
# flag still exits 2 on every process. Usage: commands_mpi.sh <laga binary> <source dir>
set -u
laga=$1
source "$(dirname "$0")/lib/mpi.bash"  # mpirun settings: the array mpi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/lib/check.bash"  # fail, ok, json_has; failures counts

common=(--model tiny --seq 16 --batch 2 --layers 2 --dtype fp32)
if timeout 300 "${mpi[@]}" -np 4 "$laga" verify "${common[@]}" --sp 1,2,4 --json "$work/verify.mpi.json" \
    >"$work/out" 2>&1; then
  echo "ok: verify under mpirun -np 4"
else
  fail "verify under mpirun -np 4: $(tail -5 "$work/out")"
fi
"$laga" verify "${common[@]}" --sp 1,2,4 --comm threads --json "$work/verify.threads.json" >/dev/null 2>&1 \
  || fail "verify under threads"
/usr/bin/python3 - "$work/verify.mpi.json" "$work/verify.threads.json" <<'PY' || fail "verify: MPI cases differ from threads'"
import json, sys
m, t = (json.load(open(f)) for f in sys.argv[1:3])
assert m["backend"] == "mpi" and t["backend"] == "threads", (m["backend"], t["backend"])
key = lambda c: (c["sp"], c["form"], c["vs"])
assert sorted(map(key, m["cases"])) == sorted(map(key, t["cases"]))
# The same numbers: MPI and threads sum in the same order, so every error is the same to the bit.
tm = {key(c): c["max_abs_diff"] for c in t["cases"]}
assert all(c["max_abs_diff"] == tm[key(c)] for c in m["cases"]), "max_abs_diff differs"
PY

for comm in threads mpi; do
  launcher=()
  [ "$comm" = mpi ] && launcher=("${mpi[@]}" -np 2)
  timeout 300 "${launcher[@]}" "$laga" train --model tiny --seq 16 --sp 2 --steps 150 --lr 3e-3 --dtype fp32 \
    --forms explicit,laga --json "$work/train.$comm.json" >"$work/out" 2>&1 || fail "train ($comm): $(tail -3 "$work/out")"
done
/usr/bin/python3 - "$work/train.mpi.json" "$work/train.threads.json" <<'PY' && echo "ok: train under mpirun -np 2 bitwise equal to threads" || fail "train: MPI losses differ from threads'"
import json, sys
m, t = (json.load(open(f)) for f in sys.argv[1:3])
assert [r["losses"] for r in m["runs"]] == [r["losses"] for r in t["runs"]]
PY

if timeout 300 "${mpi[@]}" -np 2 "$laga" bench --model tiny --seq 16,32 --sp 2 --iters 2 --json "$work/bench.json" \
    >"$work/out" 2>&1; then
  echo "ok: bench under mpirun -np 2"
else
  fail "bench under mpirun -np 2: $(tail -5 "$work/out")"
fi
json_has "$work/bench.json" "j['backend']=='mpi' and len(j['rows'])==6 and all(r['tokens_per_s']>0 for r in j['rows']) \
  and j['pass'] and j['link']=='MPI, one process per rank; MPI progress from compute every 500 µs' and all(r['validation']['validated'] for r in j['rows'])" \
  || fail "bench JSON under MPI: backend, rows or validation missing"
[ "$(grep -c "laga bench" "$work/out")" -eq 1 ] || fail "bench under MPI printed its table more than once"
# A wrong result under MPI: reported once, by the root, and the job exits non-zero.
timeout 120 "${mpi[@]}" -np 2 "$laga" bench --model tiny --seq 16 --sp 2 --iters 1 --dtype fp32 --inject-wrong laga:1e4 \
  >"$work/out" 2>&1
status=$?
{ [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && [ "$(grep -c "^# FAIL T 16 laga" "$work/out")" -eq 1 ]; } \
  && echo "ok: bench under mpirun -np 2 reports a wrong result and fails" \
  || fail "bench --inject-wrong under mpirun: status $status: $(grep FAIL "$work/out")"

timeout 60 "${mpi[@]}" -np 2 "$laga" bench --model tiny --seq 16 --sp 2 --iters 0 >"$work/out" 2>&1
status=$?
[ "$status" -eq 2 ] || fail "bench --iters 0 under mpirun: status $status, want 2"

# bench-comm under mpirun -np 2 (--sp from the job's size; --mpi-progress 0 named in the link): every row validated, MPI named, one table.
if timeout 300 "${mpi[@]}" -np 2 "$laga" bench-comm -b 1K -e 64K -f 8 --dtype bf16,fp32 -n 3 -w 1 --mpi-progress 0 \
    --json "$work/bench_comm.json" >"$work/out" 2>&1; then
  echo "ok: bench-comm under mpirun -np 2"
else
  fail "bench-comm under mpirun -np 2: $(tail -5 "$work/out")"
fi
json_has "$work/bench_comm.json" "j['backend']=='mpi' and j['sp']==2 and j['link']=='MPI, one process per rank; MPI progress only inside MPI calls' and \
len(j['rows'])==24 and all(r['wrong']==0 and r['busbw_GBps']>0 for r in j['rows'])" \
  || fail "bench-comm JSON under MPI: backend, sp, link or rows wrong"
[ "$(grep -c "^# machine:" "$work/out")" -eq 1 ] || fail "bench-comm under MPI printed its header more than once"
timeout 60 "${mpi[@]}" -np 2 "$laga" bench-comm --sp 3 -b 64 -e 64 >"$work/out" 2>&1
status=$?
[ "$status" -eq 2 ] || fail "bench-comm --sp 3 under mpirun -np 2: status $status, want 2"

[ "$failures" -eq 0 ] && echo "commands_mpi: all cases pass" || echo "commands_mpi: $failures failures"
[ "$failures" -eq 0 ]
