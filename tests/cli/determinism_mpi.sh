#!/usr/bin/env bash
# Determinism of whole runs through the CLI: `laga run --dump` twice gives byte-identical
# tensors.safetensors (inputs, weights, outputs, every gradient) for every form (explicit, laga,
# absorbed shared and expanded), kernel (fused, eager) and dtype (fp32, bf16) — under mpirun -np 2
# (the MPI backend) and with ranks as threads; and under mpirun -np 4 for laga and absorbed.
# Usage: determinism_mpi.sh <laga binary> <source dir>
set -u
laga=$1
source "$(dirname "$0")/lib/mpi.bash"  # mpirun settings: the array mpi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
checked=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

common=(--model tiny --seq 32 --batch 2 --layers 2)

# twice TAG LAUNCH... -- RUN-ARGS...: the same run twice, dumps compared byte for byte.
twice() {
  local tag=$1
  shift
  local launch=()
  while [ "$1" != "--" ]; do launch+=("$1"); shift; done
  shift
  for i in 1 2; do
    if ! timeout 300 "${launch[@]}" "$laga" run "${common[@]}" "$@" --dump "$work/$tag.$i" >"$work/out" 2>&1; then
      fail "$tag run $i: $(tail -3 "$work/out")"
      return
    fi
  done
  checked=$((checked + 1))
  if cmp -s "$work/$tag.1/tensors.safetensors" "$work/$tag.2/tensors.safetensors"; then
    echo "ok: $tag: two runs bitwise identical"
  else
    fail "$tag: two runs differ: $(cmp "$work/$tag.1/tensors.safetensors" "$work/$tag.2/tensors.safetensors")"
  fi
  rm -rf "$work/$tag.1" "$work/$tag.2"
}

for form in explicit laga absorbed-shared absorbed-expanded; do
  args=(--form "${form%%-*}")
  [[ $form == absorbed-* ]] && args+=(--absorbed-kv "${form#absorbed-}")
  for kernel in fused eager; do
    for dtype in fp32 bf16; do
      run=("${args[@]}" --kernel "$kernel" --dtype "$dtype")
      twice "mpi2.$form.$kernel.$dtype" "${mpi[@]}" -np 2 -- --sp 2 "${run[@]}"
      twice "threads2.$form.$kernel.$dtype" env -- --sp 2 --comm threads "${run[@]}"
    done
  done
done
for form in laga absorbed; do
  twice "mpi4.$form.fused.bf16" "${mpi[@]}" -np 4 -- --sp 4 --form "$form" --dtype bf16
done

if [ "$failures" -eq 0 ]; then
  echo "determinism_mpi: all $checked cases pass"
else
  echo "determinism_mpi: $failures failures in $checked cases"
fi
[ "$failures" -eq 0 ]
