#!/usr/bin/env bash
# Sets laga up (scripts/setup.sh) and runs the whole test suite: GoogleTest claims and the
# script checks (the CLI, PyTorch autograd on dumped tensors).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
ctest --test-dir build --output-on-failure -j 2 --timeout 900
