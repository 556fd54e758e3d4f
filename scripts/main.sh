#!/usr/bin/env bash
# Sets laga up (scripts/setup.sh) and runs the main job: the forms side by side on the `small`
# preset — `laga verify` checks laga bit-identical to explicit at P = 1, laga against explicit at
# P = 2, 4, 8 and absorbed against the fp64 reference — then one measured run of each form at P = 4,
# a laga dump at P = 2 checked tensor by tensor against an independent PyTorch autograd implementation
# of the block, the forms timed side by side, and every form planned at DeepSeek-V3 scale.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
out=$(mktemp -d)
./build/laga verify --model small --seq 256 --layers 1 --dtype fp32 --sp 1,2,4,8 --json "$out/verify.json"
for form in explicit absorbed laga; do
  ./build/laga run --model small --seq 1024 --sp 4 --form "$form" --json "$out/run.$form.json"
done
./build/laga run --model small --seq 256 --sp 2 --form laga --dtype fp32 --layers 2 --dump "$out/dump"
/usr/bin/python3 tests/torch/mla_block_torch.py "$out/dump"
./build/laga bench --model small --seq 1024 --sp 2 --forms explicit,absorbed,laga --iters 2 --json "$out/bench.json"
for kernel in fused eager; do
  ./build/laga plan --model deepseek-v3 --seq 16384 --sp 8 --kernel "$kernel" --json "$out/plan.$kernel.json"
done
echo "main: JSON and dumps in $out"
