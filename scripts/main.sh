#!/usr/bin/env bash
# Sets laga up (scripts/setup.sh) and runs the main job: the block on the `small` preset, forward
# and backward, measured, then checked tensor by tensor against an independent PyTorch autograd
# implementation.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
out=$(mktemp -d)
./build/laga run --model small --seq 512 --sp 1 --form explicit --dtype fp32 --layers 2 --dump "$out/dump" --json "$out/run.json"
/usr/bin/python3 tests/torch/mla_block_torch.py "$out/dump"
echo "main: results in $out"
