#!/usr/bin/env bash
# A bounded random sample of the verification sweep (scripts/verify_sweep.sh --quick: the tiny preset
# over T 16–512, both kernels and dtypes, L 1–2, B 1–2, two seeds, every P of 1, 2, 4, 8 dividing T),
# drawn anew each run; the seed is printed, and LAGA_SWEEP_SEED reproduces a failing draw.
# Usage: verify_sample.sh <laga binary> <source dir>
set -u
LAGA=$1 exec bash "$2/scripts/verify_sweep.sh" --quick --sample "${LAGA_SWEEP_SAMPLE:-4}"
