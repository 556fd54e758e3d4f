#!/usr/bin/env bash
# CTest script: laga's whole block stack, forward and every gradient, checked against an
# independent PyTorch autograd implementation (tests/torch/mla_block_torch.py, Debian's
# python3-torch under /usr/bin/python3) on the tensors of `laga run --dump DIR`; and a round trip:
# a run loading the dumped weights back (--weights) reproduces y, dx and every gradient bit for bit.
#
#   bash tests/torch/check_block_torch.sh <path-to-laga-binary> <source-dir>
#
# Cases: fp32, batch 2, bf16, eager kernel, deepseek-v2-lite (q_lora_rank 0), laga and absorbed at
# sp 2, rotate-half RoPE, and the two round trips. A missing torch is a failure, never a skip.
set -u

if [ $# -ne 2 ]; then
  echo "usage: bash $0 <path-to-laga-binary> <source-dir>" >&2
  exit 2
fi
LAGA=$1
SRC=$2
PY=/usr/bin/python3
CHECK="$SRC/tests/torch/mla_block_torch.py"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

[ -x "$LAGA" ] || fail "$LAGA is not an executable laga binary"
[ -f "$CHECK" ] || fail "$CHECK not found; is $SRC the source directory?"
[ -x "$PY" ] || fail "$PY not found: the torch check needs Debian's python3 with python3-torch"
"$PY" -c "import torch, numpy" 2>/dev/null ||
  fail "$PY cannot import torch and numpy; install python3-torch (apt-get install python3-torch)"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/laga-torch-check.XXXXXX") || fail "cannot create a temporary directory"
trap 'rm -rf "$TMP"' EXIT

HELP=$("$LAGA" run --help 2>&1) || fail "'$LAGA run --help' failed: $HELP"
grep -q -- "--dump" <<<"$HELP" || fail "'laga run' has no --dump option; the check needs it"

failures=0
cases=0

# expect_config DIR key=value ...: the dump's config.json says what the case asked for.
expect_config() {
  local dir=$1
  shift
  "$PY" - "$dir/config.json" "$@" <<'EOF'
import json, sys
cfg = json.load(open(sys.argv[1]))
bad = []
for kv in sys.argv[2:]:
    k, v = kv.split("=", 1)
    got = cfg.get(k)
    if str(got).lower() != v.lower():
        bad.append(f"{k} = {got!r}, expected {v}")
if bad:
    print("config.json: " + "; ".join(bad))
    sys.exit(1)
EOF
}

# run_case NAME "key=value ..." laga-run-args...: run laga with --dump, check config and tensors.
run_case() {
  local name=$1 expect=$2
  shift 2
  local dir="$TMP/$name"
  cases=$((cases + 1))
  echo "== $name: laga run $* --dump $dir"
  "$LAGA" run "$@" --dump "$dir" >"$TMP/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAIL: $name: laga run exited $rc:"
    tail -n 20 "$TMP/$name.log"
    failures=$((failures + 1))
    return
  fi
  # shellcheck disable=SC2086
  if ! expect_config "$dir" $expect; then
    echo "FAIL: $name: the dump's configuration is not what was asked for"
    failures=$((failures + 1))
    return
  fi
  if ! "$PY" "$CHECK" "$dir"; then
    echo "FAIL: $name: the PyTorch check failed"
    failures=$((failures + 1))
  fi
}

TINY="--model tiny --seq 16 --sp 1 --form explicit --layers 2"
run_case fp32 "model=tiny seq_len=16 batch=1 num_layers=2 dtype=fp32" $TINY --dtype fp32
run_case batch2 "batch=2 dtype=fp32" $TINY --dtype fp32 --batch 2
run_case bf16 "batch=2 dtype=bf16" $TINY --dtype bf16 --batch 2
run_case eager "kernel=eager" $TINY --dtype fp32 --kernel eager
run_case lite "model=deepseek-v2-lite q_lora_rank=0 seq_len=8 dtype=fp32" \
  --model deepseek-v2-lite --seq 8 --sp 1 --form explicit --layers 1 --dtype fp32
# The other forms and rank counts compute the same block; their dumps are whole tensors.
run_case laga_sp2 "form=laga sp=2" --model tiny --seq 16 --sp 2 --form laga --layers 2 --dtype fp32 --batch 2
run_case absorbed_sp2 "form=absorbed-expanded sp=2" --model tiny --seq 16 --sp 2 --form absorbed --layers 2 --dtype fp32

# Rotate-half RoPE.
run_case rotate_half "rope_interleaved=false" $TINY --dtype fp32 --batch 2 --rope-layout rotate-half

# Round trip: the dumped weights (fp32 and bf16 dumps) loaded back reproduce the run exactly.
round_trip() {
  local name=$1 from=$2
  shift 2
  cases=$((cases + 1))
  echo "== $name: laga run $* --weights $from/tensors.safetensors"
  if [ ! -f "$from/tensors.safetensors" ]; then
    echo "FAIL: $name: no dump to load ($from)"
    failures=$((failures + 1))
    return
  fi
  "$LAGA" run "$@" --weights "$from/tensors.safetensors" --dump "$TMP/$name" >"$TMP/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAIL: $name: laga run --weights exited $rc:"
    tail -n 20 "$TMP/$name.log"
    failures=$((failures + 1))
    return
  fi
  if ! "$PY" "$CHECK" --same "$from" "$TMP/$name"; then
    echo "FAIL: $name: loading the dumped weights did not reproduce the run"
    failures=$((failures + 1))
  fi
}
round_trip round_trip_fp32 "$TMP/fp32" $TINY --dtype fp32
round_trip round_trip_bf16 "$TMP/bf16" $TINY --dtype bf16 --batch 2

echo "# $cases cases, $failures failed"
[ "$failures" -eq 0 ] || exit 1
exit 0
