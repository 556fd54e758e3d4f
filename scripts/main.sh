#!/usr/bin/env bash
# Sets laga up (scripts/setup.sh) and runs the main job: the quick report (`laga report --quick`) —
# the forms verified against the fp64 reference and laga against PyTorch autograd, every form planned
# at DeepSeek-V3 scale, the forms timed side by side in one machine (and across an emulated link when
# run as root), the collectives benchmarked, the performance model against measurement, training
# curves — written to report/report.md with its plots (LAGA_REPORT_DIR to put it elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
out=${LAGA_REPORT_DIR:-report}
./build/laga report --out "$out" --quick
echo "main: the report is $(cd "$out" && pwd)/report.md"
