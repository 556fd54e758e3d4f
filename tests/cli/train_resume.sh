#!/usr/bin/env bash
# Lossless training restarts (docs/cli.md §5, io/train_checkpoint.hpp): `laga train --checkpoint DIR` killed
# with SIGKILL at 20 random moments (10 under threads, 10 under `mpirun -np 2`, where one rank is
# killed and mpirun ends the rest) and resumed with --resume DIR each time gives bitwise the losses
# (JSON), the final weights (--dump-weights) and the final checkpoint state (masters and Adam moments)
# of a run never interrupted. Then: a truncated, corrupted or mismatched checkpoint, or none, is
# refused with exit 2 naming what is wrong; --forms a,b checkpoints into one subdirectory per form.
# The kill moments are random (LAGA_TEST_SEED reproduces them); no timing is asserted.
# Usage: train_resume.sh <laga binary> <source dir>
set -u
laga=$1
source "$2/tests/cli/lib/mpi.bash"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
seed=${LAGA_TEST_SEED:-$(date +%s)}
RANDOM=$seed
echo "train_resume: LAGA_TEST_SEED=$seed"

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
same_losses() {  # two --json files: the losses of every run equal, bit for bit (JSON numbers round-trip)
  /usr/bin/python3 -c "import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:3]); \
    sys.exit(0 if [r['losses'] for r in a['runs']]==[r['losses'] for r in b['runs']] else 1)" "$1" "$2"
}

# mode: threads | mpi; dtype; kills wanted
kill_and_resume() {
  local mode=$1 dtype=$2 want=$3
  local args=(train --model tiny --seq 16 --sp 2 --lr 1e-2 --dtype "$dtype" --forms laga --steps 60 --checkpoint-every 3)
  local launch=()
  [ "$mode" = mpi ] && launch=("${mpi[@]}" -np 2)
  local ref=$work/ref.$mode
  local t0; t0=$(now_ms)
  "${launch[@]}" "$laga" "${args[@]}" --checkpoint "$ref.ck" --json "$ref.json" --dump-weights "$ref.st" >"$ref.out" 2>&1
  local ref_rc=$?
  local span=$(( $(now_ms) - t0 + 1 ))
  [ "$ref_rc" -eq 0 ] || { fail "$mode: the uninterrupted run ended with $ref_rc: $(tail -3 "$ref.out")"; return; }
  local kills=0 chains=0 runs=0
  while [ "$kills" -lt "$want" ]; do
    chains=$((chains + 1))
    local dir=$work/ck.$mode.$chains out=$work/out.$mode.$chains
    while true; do
      local resume=()
      [ -f "$dir/laga/latest" ] && resume=(--resume "$dir")
      runs=$((runs + 1))
      "${launch[@]}" "$laga" "${args[@]}" --checkpoint "$dir" "${resume[@]}" --json "$out.json" \
        --dump-weights "$out.st" >"$out.log" 2>&1 &
      local pid=$!
      local delay=0
      if [ "$kills" -lt "$want" ]; then
        delay=$(( RANDOM % (span + span / 4) ))
        sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
      fi
      local victim=$pid
      if [ "$mode" = mpi ]; then
        local ranks; ranks=($(ps -o pid= --ppid "$pid" 2>/dev/null))
        [ ${#ranks[@]} -gt 0 ] && victim=${ranks[$((RANDOM % ${#ranks[@]}))]}
      fi
      if [ "$kills" -lt "$want" ] && kill -9 "$victim" 2>/dev/null; then
        if [ "$mode" = mpi ]; then
          # mpirun ends the other ranks; Open MPI 4 can hang instead when a rank dies inside MPI_Init, so
          # after a grace period the rest of the job (its ranks, then mpirun) is killed too.
          local i
          for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
          if kill -0 "$pid" 2>/dev/null; then
            for r in $(ps -o pid= --ppid "$pid" 2>/dev/null); do kill -9 "$r" 2>/dev/null; done
            kill -9 "$pid" 2>/dev/null
          fi
        fi
        wait "$pid" 2>/dev/null
        kills=$((kills + 1))
        echo "  $mode kill $kills at +${delay} ms (pid $victim): latest $(cat "$dir/laga/latest" 2>/dev/null || echo none)"
        continue
      fi
      wait "$pid"
      local rc=$?
      [ "$rc" -eq "$ref_rc" ] || { fail "$mode chain $chains: the run ended with $rc, the uninterrupted one $ref_rc: $(tail -3 "$out.log")"; break; }
      same_losses "$ref.json" "$out.json" || fail "$mode chain $chains: losses differ from the uninterrupted run"
      cmp -s "$ref.st" "$out.st" || fail "$mode chain $chains: final weights differ from the uninterrupted run"
      cmp -s "$ref.ck/laga/step-00000060/state.safetensors" "$dir/laga/step-00000060/state.safetensors" ||
        fail "$mode chain $chains: final masters / Adam moments differ from the uninterrupted run"
      echo "ok: $mode chain $chains: losses, weights and optimizer state bitwise equal to the uninterrupted run"
      break
    done
  done
  echo "ok: $mode: $kills kills in $chains chains, $runs runs"
}

kill_and_resume threads fp32 10
kill_and_resume mpi bf16 10

# Refusals, each exit 2 naming what is wrong.
base=(train --model tiny --seq 16 --forms laga --steps 60)
ck=$work/ck.threads.1
expect2() {  # label, pattern the message must hold, command...
  local label=$1 pattern=$2
  shift 2
  "$@" >"$work/refuse.out" 2>&1
  local rc=$?
  if [ "$rc" -ne 2 ]; then fail "$label: exit $rc, expected 2: $(tail -2 "$work/refuse.out")"
  elif ! grep -q -- "$pattern" "$work/refuse.out"; then fail "$label: message lacks '$pattern': $(tail -2 "$work/refuse.out")"
  else echo "ok: refused $label"; fi
}
expect2 "another P" "config.sp: expected 4, found 2" "$laga" "${base[@]}" --lr 1e-2 --sp 4 --dtype fp32 --resume "$ck"
expect2 "another dtype" 'dtype: expected "bf16", found "fp32"' "$laga" "${base[@]}" --lr 1e-2 --sp 2 --dtype bf16 --resume "$ck"
expect2 "another model" "config.num_layers: expected 2, found 1" "$laga" "${base[@]}" --lr 1e-2 --sp 2 --dtype fp32 --layers 2 --resume "$ck"
expect2 "another lr" "lr: expected" "$laga" "${base[@]}" --sp 2 --dtype fp32 --lr 2e-2 --resume "$ck"
expect2 "another form" "no checkpoint in" "$laga" "${base[@]}" --lr 1e-2 --sp 2 --dtype fp32 --forms explicit --resume "$ck"
expect2 "no checkpoint" "no checkpoint in" "$laga" "${base[@]}" --lr 1e-2 --sp 2 --dtype fp32 --resume "$work/empty"
expect2 "a fresh run into a used --checkpoint" "already holds a checkpoint" "$laga" "${base[@]}" --lr 1e-2 --sp 2 \
  --dtype fp32 --checkpoint "$ck"
step=$(cat "$ck/laga/latest")
for damage in truncate flip manifest pointer missing; do
  d=$work/damaged.$damage
  cp -r "$ck" "$d"
  case $damage in
    truncate) truncate -s 1000 "$d/laga/$step/state.safetensors"; pattern="1000 bytes; expected" ;;
    flip) printf '\x55' | dd of="$d/laga/$step/state.safetensors" bs=1 seek=4000 conv=notrunc 2>/dev/null; pattern="checksum" ;;
    manifest) sed -i 's/"next_step": 60/"next_step": 61/' "$d/laga/$step/manifest.json"; pattern="manifest checksum" ;;
    pointer) echo "step-0000006x" >"$d/laga/latest"; pattern="expected a checkpoint name" ;;
    missing) rm "$d/laga/$step/state.safetensors"; pattern="state.safetensors: missing" ;;
  esac
  expect2 "a damaged checkpoint ($damage)" "$pattern" "$laga" "${base[@]}" --lr 1e-2 --sp 2 --dtype fp32 --resume "$d"
done

# --overlap is not part of a run's identity (it changes no bit): 6 steps with it off, resumed to 12 with it
# on, equal an uninterrupted 12 steps with it on.
ov=(train --model tiny --seq 16 --sp 2 --lr 1e-2 --dtype bf16 --forms laga)
"$laga" "${ov[@]}" --steps 12 --overlap on --json "$work/ov.ref.json" --dump-weights "$work/ov.ref.st" >/dev/null 2>&1
"$laga" "${ov[@]}" --steps 6 --overlap off --checkpoint "$work/ov.ck" >/dev/null 2>&1
"$laga" "${ov[@]}" --steps 12 --overlap on --checkpoint "$work/ov.ck" --resume "$work/ov.ck" --json "$work/ov.json" \
  --dump-weights "$work/ov.st" >"$work/ov.out" 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then fail "resuming with another --overlap: exit $rc: $(tail -2 "$work/ov.out")"
elif same_losses "$work/ov.ref.json" "$work/ov.json" && cmp -s "$work/ov.ref.st" "$work/ov.st"; then
  echo "ok: resumed with --overlap on after --overlap off: losses and weights bitwise those of an uninterrupted run"
else fail "resumed with another --overlap: losses or weights differ from an uninterrupted run"; fi

# --forms a,b: one subdirectory per form, each resumable alone.
multi=$work/multi
"$laga" train --model tiny --seq 16 --sp 2 --lr 1e-2 --dtype fp32 --forms explicit,laga --steps 6 --checkpoint "$multi" \
  >/dev/null 2>&1
[ -f "$multi/explicit/latest" ] && [ -f "$multi/laga/latest" ] && echo "ok: --forms explicit,laga: $multi/{explicit,laga}/" ||
  fail "--forms explicit,laga did not write one checkpoint subdirectory per form: $(ls "$multi" 2>&1)"

[ "$failures" -eq 0 ] && echo "train_resume: all cases pass" || echo "train_resume: $failures failures"
[ "$failures" -eq 0 ]
