#!/usr/bin/env bash
# A bounded random sample of the verification sweep (scripts/verify_sweep.sh --quick: the tiny preset
# over T 16–512, both kernels and dtypes, L 1–2, B 1–2, two seeds, every P of 1, 2, 4, 8 dividing T),
# drawn anew each run; the seed is printed, and LAGA_SWEEP_SEED reproduces a failing draw.
# First the sweep's case ranges (--from K --to K), with a stand-in binary that passes every case: cases
# 639–641 of the whole sweep's order are small's last two T 512 cases and deepseek-v2-lite's first, and
# a range outside 1..960 is refused with exit 2.
# Usage: verify_sample.sh <laga binary> <source dir>
set -u
sweep="$2/scripts/verify_sweep.sh"
mapfile -t ran < <(LAGA=/bin/true bash "$sweep" --from 639 --to 641 | grep '^ok')
if [ "${#ran[@]}" -ne 3 ] ||
   [[ ${ran[0]} != *"laga verify --model small --seq 512 --sp 1,2,4,8 --kernel eager --dtype fp32 --layers 2 --batch 2 --seed 1234 "* ]] ||
   [[ ${ran[2]} != *"laga verify --model deepseek-v2-lite --seq 16 --sp 1,2,4,8 --kernel fused --dtype bf16 --layers 1 --batch 1 --seed 1234 "* ]]; then
  echo "FAIL: verify_sweep --from 639 --to 641 ran: $(printf '%s | ' "${ran[@]}")"; exit 1
fi
for bad in "--to 961" "--from 5 --to 4" "--to 0"; do
  # shellcheck disable=SC2086
  LAGA=/bin/true bash "$sweep" $bad >/dev/null 2>&1; status=$?
  [ "$status" -eq 2 ] || { echo "FAIL: verify_sweep $bad: status $status, not 2"; exit 1; }
done
echo "ok: verify_sweep --from/--to run the cases named, and refuse a range outside the sweep"
LAGA=$1 exec bash "$sweep" --quick --sample "${LAGA_SWEEP_SAMPLE:-4}"
