#!/usr/bin/env bash
# Soak test of lossless training restarts (not run by CI): `laga train` for 1,000 steps under
# `mpirun -np 4`, one random rank SIGKILLed at a random moment and the job resumed from its checkpoint
# (--resume), five times; then the losses (JSON), the final weights (--dump-weights) and the final
# optimizer state (masters and Adam moments) must be bitwise those of an uninterrupted run.
# Usage: scripts/soak.sh [laga binary, default build/laga]   (LAGA_SOAK_SEED reproduces the kill moments;
# LAGA_SOAK_STEPS, default 1000; LAGA_SOAK_KILLS, default 5)
set -u
cd "$(dirname "$0")/.."
laga=$(realpath "${1:-build/laga}")
source tests/cli/lib/mpi.bash
steps=${LAGA_SOAK_STEPS:-1000}
want=${LAGA_SOAK_KILLS:-5}
seed=${LAGA_SOAK_SEED:-$(date +%s)}
RANDOM=$seed
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "soak: $steps steps, $want kills, mpirun -np 4, LAGA_SOAK_SEED=$seed, in $work"
args=(train --model tiny --seq 32 --sp 4 --layers 2 --lr 3e-3 --dtype bf16 --forms laga --steps "$steps" --checkpoint-every 25)
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

t0=$(now_ms)
"${mpi[@]}" -np 4 "$laga" "${args[@]}" --checkpoint "$work/ref" --json "$work/ref.json" --dump-weights "$work/ref.st" \
  >"$work/ref.log" 2>&1
ref_rc=$?
span=$(( $(now_ms) - t0 + 1 ))
[ "$ref_rc" -eq 0 ] || { echo "soak: the uninterrupted run failed ($ref_rc): $(tail -5 "$work/ref.log")" >&2; exit 1; }
echo "soak: uninterrupted run: exit $ref_rc in $span ms"

dir=$work/ck
kills=0
runs=0
while true; do
  resume=()
  [ -f "$dir/laga/latest" ] && resume=(--resume "$dir")
  runs=$((runs + 1))
  "${mpi[@]}" -np 4 "$laga" "${args[@]}" --checkpoint "$dir" "${resume[@]}" --json "$work/out.json" \
    --dump-weights "$work/out.st" >"$work/run.$runs.log" 2>&1 &
  pid=$!
  if [ "$kills" -lt "$want" ]; then
    # Uniform in [0.5 s, 0.5 s + 2·span/(kills + 1)): on average each run gets 1/(kills + 1) of the work done.
    delay=$(( 500 + (RANDOM * 32768 + RANDOM) % (2 * span / (want + 1) + 1) ))
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    ranks=($(ps -o pid= --ppid "$pid" 2>/dev/null))
    if [ ${#ranks[@]} -gt 0 ]; then
      victim=${ranks[$((RANDOM % ${#ranks[@]}))]}
      if kill -9 "$victim" 2>/dev/null; then
        for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then  # Open MPI 4 may hang when a rank dies in MPI_Init
          for r in $(ps -o pid= --ppid "$pid" 2>/dev/null); do kill -9 "$r" 2>/dev/null; done
          kill -9 "$pid" 2>/dev/null
        fi
        wait "$pid" 2>/dev/null
        kills=$((kills + 1))
        echo "soak: kill $kills of rank pid $victim at +$delay ms; latest $(cat "$dir/laga/latest" 2>/dev/null || echo none)"
        continue
      fi
    fi
  fi
  wait "$pid"
  rc=$?
  [ "$rc" -eq "$ref_rc" ] || { echo "soak: run $runs ended with $rc, expected $ref_rc: $(tail -5 "$work/run.$runs.log")" >&2; exit 1; }
  break
done

fail=0
/usr/bin/python3 -c "import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:3]); \
  sys.exit(0 if [r['losses'] for r in a['runs']]==[r['losses'] for r in b['runs']] else 1)" "$work/ref.json" "$work/out.json" \
  && echo "soak: losses bitwise equal" || { echo "soak: FAIL: losses differ" >&2; fail=1; }
cmp -s "$work/ref.st" "$work/out.st" && echo "soak: final weights bitwise equal" || { echo "soak: FAIL: weights differ" >&2; fail=1; }
last=$(printf 'step-%08d' "$steps")
cmp -s "$work/ref/laga/$last/state.safetensors" "$dir/laga/$last/state.safetensors" &&
  echo "soak: final masters and Adam moments bitwise equal" || { echo "soak: FAIL: optimizer state differs" >&2; fail=1; }
echo "soak: $kills kills, $runs runs: $([ $fail -eq 0 ] && echo pass || echo FAIL)"
exit $fail
