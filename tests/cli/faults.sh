#!/usr/bin/env bash
# Faults under both backends: --check-finite names the first non-finite tensor and step and exits 1;
# a stalled rank makes the others' collectives time out with an error naming the collective and the
# rank (--timeout); a rank killed by SIGKILL mid-run (MPI) takes every other rank down within 30 s.
# Usage: faults.sh <laga binary> <source dir>
set -u
laga=$1
source "$(dirname "$0")/lib/mpi.bash"  # mpirun settings: the array mpi
mpi+=(-np 4)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
common=(--model tiny --seq 16 --sp 4 --form laga)

expect() {  # name, status wanted ("nonzero" or a number), seconds at most, pattern, command...
  local name=$1 want=$2 limit=$3 pattern=$4
  shift 4
  local start status took
  start=$(date +%s%N)
  timeout 60 "$@" >"$work/out" 2>&1
  status=$?
  local ms=$(( ($(date +%s%N) - start) / 1000000 ))
  took="$((ms / 1000)).$(( (ms % 1000) / 100 ))"
  local ok=1
  if [ "$want" = nonzero ]; then [ "$status" -ne 0 ] && [ "$status" -ne 124 ] || ok=0; else [ "$status" -eq "$want" ] || ok=0; fi
  [ "$ms" -le $((limit * 1000)) ] || ok=0
  grep -q -- "$pattern" "$work/out" || ok=0
  if [ $ok -eq 1 ]; then
    echo "ok: $name -> status $status in $took s: $(grep -m1 -- "$pattern" "$work/out")"
  else
    echo "FAIL: $name -> status $status in $took s (want $want within $limit s, /$pattern/): $(tail -3 "$work/out")"
    failures=$((failures + 1))
  fi
}

for backend in threads mpi; do
  run=("$laga" run); [ $backend = mpi ] && run=("${mpi[@]}" "$laga" run)
  expect "$backend nan in x" 1 30 "non-finite value in x at layer 0 forward, rank 1" \
    "${run[@]}" "${common[@]}" --check-finite --inject-fault 1:nan-x
  expect "$backend nan in dy" 1 30 "non-finite value in dy at layer 0 backward, rank 2" \
    "${run[@]}" "${common[@]}" --check-finite --inject-fault 2:nan-dy
  expect "$backend inf in a weight" 1 30 "non-finite value in layers.0.wkv_b at the weights, rank 0" \
    "${run[@]}" "${common[@]}" --check-finite --inject-fault 0:inf-wkv_b
  expect "$backend stalled rank" nonzero 30 "timed out after 2 s" \
    "${run[@]}" "${common[@]}" --timeout 2 --inject-fault 1:stall
done
expect "mpi rank killed by SIGKILL" nonzero 30 "" "${mpi[@]}" "$laga" run "${common[@]}" --inject-fault 2:kill
# Without --check-finite a NaN input runs to the end (the check is opt-in), and says nothing false.
"$laga" run "${common[@]}" --inject-fault 1:nan-x >/dev/null 2>&1 || { echo "FAIL: unchecked NaN run"; failures=$((failures + 1)); }

[ "$failures" -eq 0 ] && echo "faults: all cases pass" || echo "faults: $failures failures"
[ "$failures" -eq 0 ]
