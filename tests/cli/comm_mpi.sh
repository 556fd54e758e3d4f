#!/usr/bin/env bash
# The MPI backend under mpirun: (1) every collective gives bitwise the bytes the threads backend
# gives for the same P (1, 2, 4, 8), without and with a timeout and a tiny MPI piece size (the
# >INT_MAX split path), both as blocking calls and as non-blocking ones all in flight at once and
# waited in rank-dependent orders (the driver's "nonblocking" cases, which must also equal the
# blocking ones); (2) a rank that throws, is killed by SIGKILL, times out, or starts with a
# different configuration ends the whole job with a non-zero status within 30 s, also while the
# others wait on non-blocking collectives in flight.
# Usage: comm_mpi.sh <laga binary> <source dir>; the driver is laga_comm_check ($LAGA_COMM_CHECK,
# set by tests/CMakeLists.txt, else found beside the test binaries).
set -euo pipefail
laga=$1
check=${LAGA_COMM_CHECK:-$(dirname "$laga")/tests/laga_comm_check}
[[ -x $check ]] || { echo "comm_mpi: no laga_comm_check at $check" >&2; exit 1; }

source "$(dirname "$0")/lib/mpi.bash"  # mpirun settings: the array mpi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# (1) bitwise agreement with the threads backend
for P in 1 2 4 8; do
  "$check" --threads "$P" >"$work/threads.$P"
  lines=$(grep -vc '^#' "$work/threads.$P")
  nb=$(grep -c '^nonblocking ' "$work/threads.$P" || true)
  # (the driver itself fails unless each non-blocking output equals the blocking one on its inputs)
  ((nb > 0)) || fail "P=$P: the driver printed no nonblocking cases"
  for variant in blocking nonblocking; do
    args=()
    [[ $variant == nonblocking ]] && args=(--timeout 60 --piece-bytes 1000)
    if ! timeout 120 "${mpi[@]}" -np "$P" "$check" "${args[@]}" >"$work/mpi.$P.$variant" 2>"$work/err"; then
      fail "mpirun -np $P ($variant) exited non-zero: $(tail -5 "$work/err")"
      continue
    fi
    if diff -q "$work/threads.$P" "$work/mpi.$P.$variant" >/dev/null; then
      echo "ok: P=$P $variant: MPI bitwise equal to threads ($lines digests, $nb of them non-blocking)"
    else
      fail "P=$P $variant: MPI differs from threads:"
      diff "$work/threads.$P" "$work/mpi.$P.$variant" | head -10 >&2
    fi
  done
done

# (1b) sub-groups: the first P ranks of an 8-rank world give the bytes of a P-rank group; a group
# larger than the world is a usage error (exit 2) that suggests mpirun -np P
for P in 1 2 4; do
  if ! timeout 120 "${mpi[@]}" -np 8 "$check" --group "$P" >"$work/group.$P" 2>"$work/err"; then
    fail "mpirun -np 8 --group $P exited non-zero: $(tail -5 "$work/err")"
  elif diff -q "$work/threads.$P" "$work/group.$P" >/dev/null; then
    echo "ok: first $P of 8 MPI ranks bitwise equal to $P threads"
  else
    fail "first $P of 8 MPI ranks differ from $P threads:"
    diff "$work/threads.$P" "$work/group.$P" | head -10 >&2
  fi
done
rc=0
timeout 60 "${mpi[@]}" -np 2 "$check" --group 4 >/dev/null 2>"$work/err.group" || rc=$?
if [[ $rc != 2 ]]; then
  fail "--group 4 on 2 ranks: exit status $rc, expected 2"
elif ! grep -q "the world has 2; start the job with mpirun -np 4" "$work/err.group"; then
  fail "--group 4 on 2 ranks: stderr lacks the suggestion: $(head -3 "$work/err.group")"
else
  echo "ok: --group 4 on 2 ranks: usage error, exit 2"
fi

# (2) faults: expected exit status ('nonzero' for any), message to find in stderr
fault() {
  local name=$1 want=$2 pattern=$3
  shift 3
  local t0 t1 rc=0
  t0=$(date +%s.%N)
  timeout 60 "${mpi[@]}" -np 4 "$check" "$@" >/dev/null 2>"$work/err.$name" || rc=$?
  t1=$(date +%s.%N)
  local took
  took=$(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }")
  if [[ $rc == 0 ]]; then fail "$name: mpirun exited 0"; return; fi
  if [[ $rc == 124 ]]; then fail "$name: mpirun still running after 60 s"; return; fi
  if [[ $want != nonzero && $rc != "$want" ]]; then fail "$name: exit status $rc, expected $want"; fi
  if awk "BEGIN { exit !($took > 30) }"; then fail "$name: took $took s (limit 30 s)"; fi
  if ! grep -q "$pattern" "$work/err.$name"; then
    fail "$name: stderr lacks '$pattern':"
    head -20 "$work/err.$name" >&2
  fi
  echo "ok: $name: exit $rc after $took s"
}
fault throw 1 "laga: rank 2 on .*: injected fault" --fault throw --fault-rank 2
fault kill nonzero "signal 9\|Killed\|killed" --fault kill --fault-rank 1
fault timeout 1 "all_gather of 'latent' timed out after 2 s" --fault timeout --fault-rank 2 --timeout 2
fault config 2 "ranks started with different seq: rank 3 differs from rank 0" --fault config --fault-rank 3
fault throw-pending 1 "laga: rank 2 on .*: injected fault" --fault throw --fault-rank 2 --pending 1
fault kill-pending nonzero "signal 9\|Killed\|killed" --fault kill --fault-rank 1 --pending 1
fault timeout-pending 1 "all_reduce of 'grad_sync' timed out after 2 s" --fault timeout --fault-rank 2 --timeout 2 --pending 1

if ((failures > 0)); then
  echo "comm_mpi: $failures failure(s)" >&2
  exit 1
fi
echo "comm_mpi: all passed"
