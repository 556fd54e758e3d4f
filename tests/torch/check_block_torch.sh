#!/usr/bin/env bash
# CTest script: laga's whole block stack, forward and every gradient, checked against an
# independent PyTorch autograd implementation (tests/torch/mla_block_torch.py and, for DeepSeek
# Sparse Attention's forms, tests/torch/dsa_block_torch.py; Debian's python3-torch under
# /usr/bin/python3) on the tensors of `laga run --dump DIR` and the indexer loss of its --json; and
# round trips: a run loading the dumped weights back (--weights) reproduces y, dx, every gradient
# and every selection bit for bit.
#
#   bash tests/torch/check_block_torch.sh <path-to-laga-binary> <source-dir> [CASE...]
#
# Cases (all, or the CASEs named; a round trip needs the case it loads): the sparse model's
# self-test (finite differences, the dense model, synthetic dumps; no laga needed); dense: fp32,
# batch 2, bf16, eager kernel, deepseek-v2-lite (q_lora_rank 0), laga and absorbed at sp 2,
# rotate-half RoPE; sparse, tiny at T 48 so that its top-16 selects: dsa-gather fp32 and bf16,
# dsa-regather at sp 2, the warmup stage, indexer loss scale 0.5; the attention alone
# (--attention-only: explicit fp32 and bf16, laga at sp 2, dsa-gather); and four round trips. A
# missing torch is a failure, never a skip.
set -u

if [ $# -lt 2 ]; then
  echo "usage: bash $0 <path-to-laga-binary> <source-dir> [CASE...]" >&2
  exit 2
fi
LAGA=$1
SRC=$2
shift 2
ONLY=" $* "
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

# wanted NAME: the case is to run (no CASE given, or NAME among them).
wanted() {
  [ "$ONLY" = "  " ] || [[ "$ONLY" == *" $1 "* ]]
}

# The sparse model checked on its own first: a wrong model would fail every sparse case below.
if wanted dsa_model; then
  cases=$((cases + 1))
  echo "== dsa_model: $PY $CHECK --self-test"
  if ! "$PY" "$CHECK" --self-test >"$TMP/dsa_model.log" 2>&1; then
    echo "FAIL: dsa_model: the sparse model's self-test failed:"
    tail -n 20 "$TMP/dsa_model.log"
    failures=$((failures + 1))
  fi
fi

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

# run_case NAME "key=value ..." laga-run-args...: run laga with --dump and --json, check config,
# tensors and the reported indexer loss (a dense form's: none).
run_case() {
  local name=$1 expect=$2
  shift 2
  wanted "$name" || return 0
  local dir="$TMP/$name"
  cases=$((cases + 1))
  echo "== $name: laga run $* --dump $dir --json $dir.json"
  "$LAGA" run "$@" --dump "$dir" --json "$dir.json" >"$TMP/$name.log" 2>&1
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
  if ! "$PY" "$CHECK" "$dir" --json "$dir.json"; then
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

# DeepSeek Sparse Attention: tiny's indexer (4 heads of 32 dims) selects 16 keys of up to 48.
SPARSE="--model tiny --seq 48 --layers 2"
DSA="seq_len=48 num_layers=2 index_n_heads=4 index_head_dim=32 index_topk=16"
run_case dsa_gather_fp32 "form=dsa-gather indexer_stage=sparse batch=2 dtype=fp32 $DSA" \
  $SPARSE --sp 1 --form dsa-gather --dtype fp32 --batch 2
run_case dsa_gather_bf16 "form=dsa-gather batch=2 dtype=bf16 $DSA" \
  $SPARSE --sp 1 --form dsa-gather --dtype bf16 --batch 2
run_case dsa_regather_sp2 "form=dsa-regather sp=2 dtype=fp32 $DSA" \
  $SPARSE --sp 2 --form dsa-regather --dtype fp32 --batch 2
run_case dsa_warmup "form=dsa-gather indexer_stage=warmup dtype=fp32 $DSA" \
  $SPARSE --sp 1 --form dsa-gather --dtype fp32 --indexer-stage warmup
run_case dsa_loss_scale "form=dsa-gather indexer_loss_scale=0.5 dtype=fp32 $DSA" \
  $SPARSE --sp 1 --form dsa-gather --dtype fp32 --indexer-loss-scale 0.5

# The attention alone (Hugging Face's self_attn: no input norm, no residual), dense and sparse.
run_case alone_fp32 "attention_only=true dtype=fp32" $TINY --dtype fp32 --batch 2 --attention-only
run_case alone_bf16 "attention_only=true dtype=bf16" $TINY --dtype bf16 --attention-only
run_case alone_laga_sp2 "attention_only=true form=laga sp=2" \
  --model tiny --seq 16 --sp 2 --form laga --layers 2 --dtype fp32 --attention-only
run_case alone_dsa "attention_only=true form=dsa-gather dtype=fp32 $DSA" \
  $SPARSE --sp 1 --form dsa-gather --dtype fp32 --attention-only

# Round trip: the dumped weights (fp32, bf16, sparse and attention-alone dumps) loaded back reproduce
# the run exactly, the sparse one its selections too.
round_trip() {
  local name=$1 from=$2
  shift 2
  wanted "$name" || return 0
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
round_trip round_trip_dsa "$TMP/dsa_gather_fp32" $SPARSE --sp 1 --form dsa-gather --dtype fp32 --batch 2
round_trip round_trip_alone "$TMP/alone_fp32" $TINY --dtype fp32 --batch 2 --attention-only

echo "# $cases cases, $failures failed"
[ "$failures" -eq 0 ] || exit 1
exit 0
