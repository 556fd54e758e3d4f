#!/usr/bin/env bash
# The forms under mpirun -np 1, 2, 4, 8: `laga run --dump` gives bitwise the same tensors (y, dx,
# every synced gradient) as the threads backend for the same configuration, for every form, and with
# --overlap on under MPI the same tensors as with it off under threads (P 2, 4, every form; P 2 with a
# progress call from compute at nearly every matmul, --mpi-progress 1, P 4 with none, 0); ranks
# started with different configurations stop before any work with status 2; a rank failing
# mid-forward or mid-backward takes the whole job down with a non-zero status within 30 s, under both
# backends. Usage: forms_mpi.sh <laga binary> <source dir>
set -u
laga=$1
source "$(dirname "$0")/lib/mpi.bash"  # mpirun settings: the array mpi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

common=(--model tiny --seq 16 --batch 2 --layers 2)
for P in 1 2 4 8; do
  for form in explicit laga absorbed; do
    for dtype in fp32 bf16; do
      tag="$P.$form.$dtype"
      "$laga" run "${common[@]}" --sp "$P" --form "$form" --dtype "$dtype" --comm threads --dump "$work/t.$tag" >/dev/null \
        || { fail "threads run $tag"; continue; }
      if ! timeout 120 "${mpi[@]}" -np "$P" "$laga" run "${common[@]}" --sp "$P" --form "$form" --dtype "$dtype" \
          --dump "$work/m.$tag" >"$work/out" 2>&1; then
        fail "mpirun -np $P $tag: $(tail -3 "$work/out")"
        continue
      fi
      grep -q "(mpi)" "$work/out" || fail "mpirun -np $P $tag did not use the MPI backend"
      if cmp -s "$work/t.$tag/tensors.safetensors" "$work/m.$tag/tensors.safetensors"; then
        echo "ok: P=$P $form $dtype: MPI dump bitwise equal to threads"
      else
        fail "P=$P $form $dtype: MPI dump differs from threads"
      fi
    done
  done
done

# --overlap on under MPI (collectives in flight across MPI processes) against off under threads, with
# MPI progress made from inside compute at nearly every matmul (P 2) and only inside MPI calls (P 4).
for P in 2 4; do
  progress=1; [ "$P" = 4 ] && progress=0
  for form in explicit explicit-recompute laga laga-recompute laga-fused absorbed-shared absorbed-expanded; do
    tag="$P.$form.overlap"
    "$laga" run "${common[@]}" --sp "$P" --form "$form" --overlap off --comm threads --dump "$work/t.$tag" >/dev/null \
      || { fail "threads run $tag"; continue; }
    if ! timeout 120 "${mpi[@]}" -np "$P" "$laga" run "${common[@]}" --sp "$P" --form "$form" --overlap on \
        --mpi-progress "$progress" --dump "$work/m.$tag" >"$work/out" 2>&1; then
      fail "mpirun -np $P $tag: $(tail -3 "$work/out")"
      continue
    fi
    grep -q "(mpi) .* overlap on" "$work/out" || fail "mpirun -np $P $tag did not run MPI with overlap on"
    if cmp -s "$work/t.$tag/tensors.safetensors" "$work/m.$tag/tensors.safetensors"; then
      echo "ok: P=$P $form: MPI with overlap on (--mpi-progress $progress) bitwise equal to threads with overlap off"
    else
      fail "P=$P $form: MPI with overlap on differs from threads with overlap off"
    fi
    rm -rf "$work/t.$tag" "$work/m.$tag"
  done
done

# Ranks started with different configurations: detected before any work, status 2.
start=$(date +%s)
timeout 60 "${mpi[@]}" -np 1 "$laga" run --model tiny --seq 16 --sp 2 : -np 1 "$laga" run --model tiny --seq 32 --sp 2 \
  >"$work/out" 2>&1
status=$?
if [ "$status" -eq 2 ] && grep -q "different configurations" "$work/out"; then
  echo "ok: mismatched configurations -> status 2 in $(( $(date +%s) - start )) s"
else
  fail "mismatched configurations -> status $status: $(tail -3 "$work/out")"
fi

# A rank failing mid-forward / mid-backward takes every rank down within 30 s.
for place in forward backward; do
  start=$(date +%s)
  timeout 60 "${mpi[@]}" -np 4 "$laga" run "${common[@]}" --sp 4 --form laga --inject-fault "2:$place" >"$work/out" 2>&1
  status=$?
  took=$(( $(date +%s) - start ))
  if [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && [ "$took" -le 30 ] && grep -q "injected fault in $place on rank 2" "$work/out"; then
    echo "ok: MPI rank 2 failing in $place -> status $status in $took s"
  else
    fail "MPI rank 2 failing in $place -> status $status in $took s: $(tail -3 "$work/out")"
  fi
  start=$(date +%s)
  timeout 60 "$laga" run "${common[@]}" --sp 4 --form laga --inject-fault "2:$place" >"$work/out" 2>&1
  status=$?
  took=$(( $(date +%s) - start ))
  if [ "$status" -eq 1 ] && [ "$took" -le 30 ] && grep -q "injected fault in $place on rank 2" "$work/out"; then
    echo "ok: threads rank 2 failing in $place -> status $status in $took s"
  else
    fail "threads rank 2 failing in $place -> status $status in $took s: $(tail -3 "$work/out")"
  fi
done

# laga-ulysses, spelled laga --ulysses Pu (head scatter in groups × a ring over them, on
# sub-communicators): MPI with overlap on bitwise equal to threads with overlap off; a rank failing in
# backward (inside one ring group) takes every rank down under both backends.
for spec in 4:2 8:2 8:4 4:1; do
  P=${spec%:*} Pu=${spec#*:}
  for dtype in fp32 bf16; do
    tag="$P.$Pu.$dtype.ulysses"
    "$laga" run "${common[@]}" --sp "$P" --form laga --ulysses "$Pu" --dtype "$dtype" --comm threads \
      --dump "$work/t.$tag" >/dev/null || { fail "threads run $tag"; continue; }
    if ! timeout 120 "${mpi[@]}" -np "$P" "$laga" run "${common[@]}" --sp "$P" --form laga --ulysses "$Pu" \
        --dtype "$dtype" --overlap on --dump "$work/m.$tag" >"$work/out" 2>&1; then
      fail "mpirun -np $P $tag: $(tail -3 "$work/out")"
      continue
    fi
    grep -q "(mpi) .*form laga-ulysses (ulysses $Pu)" "$work/out" || fail "mpirun -np $P $tag did not run laga-ulysses (ulysses $Pu) under MPI"
    if cmp -s "$work/t.$tag/tensors.safetensors" "$work/m.$tag/tensors.safetensors"; then
      echo "ok: P=$P --ulysses $Pu $dtype: MPI (overlap on) bitwise equal to threads (overlap off)"
    else
      fail "P=$P --ulysses $Pu $dtype: MPI dump differs from threads"
    fi
    rm -rf "$work/t.$tag" "$work/m.$tag"
  done
done
for launcher in threads mpi; do
  start=$(date +%s)
  if [ "$launcher" = threads ]; then
    timeout 60 "$laga" run "${common[@]}" --sp 4 --form laga --ulysses 2 --comm threads --inject-fault "3:backward" \
      >"$work/out" 2>&1
  else
    timeout 60 "${mpi[@]}" -np 4 "$laga" run "${common[@]}" --sp 4 --form laga --ulysses 2 --inject-fault "3:backward" \
      >"$work/out" 2>&1
  fi
  status=$?
  took=$(( $(date +%s) - start ))
  if [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && [ "$took" -le 30 ] && grep -q "injected fault in backward on rank 3" "$work/out"; then
    echo "ok: $launcher, --ulysses 2, rank 3 failing in backward -> status $status in $took s"
  else
    fail "$launcher, --ulysses 2, rank 3 failing in backward -> status $status in $took s: $(tail -3 "$work/out")"
  fi
done

[ "$failures" -eq 0 ] && echo "forms_mpi: all cases pass" || echo "forms_mpi: $failures failures"
[ "$failures" -eq 0 ]
