#!/usr/bin/env bash
# An installed laga stands alone: `cmake --install BUILD --prefix DIR` gives DIR/bin/laga and
# DIR/share/laga (the scripts and hardware files it runs, tools/laga/resources.hpp); the binary holds no
# path of the source tree or of the build tree; run from / it runs every command, and laga report finds
# its scripts relative to itself (its first steps run and record commands under DIR/share/laga); a
# binary without its resources is refused with an error naming the directory it looked in.
# Usage: install.sh <laga binary> <source dir>
set -u
laga=$1
src=$(realpath "$2")
d=$(mktemp -d)
report_pid=
cleanup() {
  [ -n "$report_pid" ] && kill -- -"$report_pid" 2>/dev/null
  rm -rf "$d"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }

# The build tree: the directory above the binary holding CMakeCache.txt.
build=$(dirname "$(realpath "$laga")")
while [ "$build" != / ] && [ ! -f "$build/CMakeCache.txt" ]; do build=$(dirname "$build"); done
[ -f "$build/CMakeCache.txt" ] || { echo "FAIL: no build tree (CMakeCache.txt) above $laga" >&2; exit 1; }

prefix=$d/prefix
if cmake --install "$build" --prefix "$prefix" >"$d/install.log" 2>&1; then ok "cmake --install into $prefix"
else fail "cmake --install: $(tail -3 "$d/install.log")"; exit 1; fi
bin=$prefix/bin/laga
[ -x "$bin" ] && ok "installed $bin" || fail "no executable $bin"
for f in scripts/report.py scripts/report_common.py scripts/report_model.py scripts/report_published.py \
  scripts/report_train_lm.py examples/train_lm.py scripts/link.sh tests/torch/mla_block_torch.py tests/torch/dsa_block_torch.py docs/hw/ascend-910b.json \
  docs/hw/h100-class.json docs/published.json; do
  [ -f "$prefix/share/laga/$f" ] || fail "not installed: share/laga/$f"
done

# No path of the source tree or the build tree inside the binary (the tree's own name, e.g. "laga", is
# not a path: each is matched with its leading directories).
for tree in "$src" "$build"; do
  n=$(strings "$bin" | grep -c -F "$tree")
  [ "$n" -eq 0 ] && ok "no reference to $tree in the installed binary" ||
    fail "$n string(s) of the installed binary name $tree: $(strings "$bin" | grep -F "$tree" | head -3)"
done

# Every command, run from / with the installed binary (tiny sizes).
run() {  # name, command...
  local name=$1; shift
  if (cd / && "$@") >"$d/$name.log" 2>&1; then ok "$name (from /)"; else fail "$name: $(tail -3 "$d/$name.log")"; fi
}
hw=$prefix/share/laga/docs/hw
run help "$bin" --help
run plan "$bin" plan --model tiny --seq 64 --sp 2
run run "$bin" run --model tiny --seq 32 --sp 2 --form laga
run verify "$bin" verify --model tiny --seq 32 --sp 1,2
run bench "$bin" bench --model tiny --seq 32 --sp 2 --forms explicit,laga --iters 1
run bench-comm "$bin" bench-comm --sp 2 -b 4K -e 16K
run train "$bin" train --model tiny --seq 32 --sp 2 --steps 40 --lr 1e-2 --dtype fp32 --forms laga
run model "$bin" model --model deepseek-v3 --seq 4096 --sp 8 --hw "$hw/h100-class.json"
run model.grid "$bin" model --grid --hw "$hw/ascend-910b.json"
run model.published "$bin" model --published "$prefix/share/laga/docs/published.json"

# The Python package, where it was built: DIR/lib/python3/dist-packages/laga (LAGA_PY_INSTALL_DIR),
# imported from / with no source tree; it runs the installed binary's commands and a torch module.
pkg=$prefix/lib/python3/dist-packages
if [ -d "$build/python/laga" ]; then
  run python /usr/bin/env PYTHONPATH="$pkg" /usr/bin/python3 -c "
import laga, laga.torch, torch
assert laga.__file__.startswith('$pkg'), laga.__file__
assert laga._binary() == '$bin', laga._binary()
assert laga.plan(laga.Config.preset('tiny', seq=64, sp=2))['forms']['laga']['activation_peak_bytes'] > 0
y = laga.torch.MLABlock(laga.Config.preset('tiny'))(torch.randn(1, 16, 64))
assert y.shape == (1, 16, 64)"
  # laga report's language model: the installed example with the installed package, as its step runs them.
  run train_lm /usr/bin/env PYTHONPATH="$pkg" /usr/bin/python3 "$prefix/share/laga/examples/train_lm.py" \
    --steps 2 --seq 32 --batch 1 --eval-every 0 --eval-windows 2 --json "$d/train_lm.json"
  for tree in "$src" "$build"; do
    n=$(strings "$pkg"/laga/_C*.so | grep -c -F "$tree")
    [ "$n" -eq 0 ] && ok "no reference to $tree in the installed extension" ||
      fail "$n string(s) of the installed extension name $tree: $(strings "$pkg"/laga/_C*.so | grep -F "$tree" | head -3)"
  done
fi

# laga report from /, with the installed scripts: until its first two steps (verify, and the PyTorch
# check, which runs the installed tests/torch/mla_block_torch.py) have ended; then it is stopped.
out=$d/report
(cd / && exec setsid "$bin" report --out "$out" --quick) >"$d/report.log" 2>&1 &
report_pid=$!
for _ in $(seq 1 600); do
  [ "$(grep -c '^  \[[0-9]*/[0-9]*\] .* \(ok\|failed\|skipped\) (' "$d/report.log")" -ge 2 ] && break
  kill -0 "$report_pid" 2>/dev/null || break
  sleep 1
done
kill -- -"$report_pid" 2>/dev/null
wait "$report_pid" 2>/dev/null
report_pid=
if grep -q '^  \[1/[0-9]*\] verify: .* ok (' "$d/report.log" && grep -q '^  \[2/[0-9]*\] torch: .* ok (' "$d/report.log"; then
  ok "laga report (from /): its first steps ran: $(grep -c ' ok (' "$d/report.log") ok"
else
  fail "laga report from /: $(cat "$d/report.log" | tail -5)"
fi
if [ -f "$out/steps.json" ] && grep -q -F "$prefix/share/laga/tests/torch/mla_block_torch.py" "$out/steps.json" &&
   ! grep -q -F "$src" "$out/steps.json"; then
  ok "steps.json: the steps ran the installed scripts, none of $src"
else
  fail "steps.json does not name the installed scripts (or names $src)"
fi

# A binary without its resources: refused, naming where it looked.
mkdir -p "$d/bare/bin"
cp "$bin" "$d/bare/bin/laga"
(cd / && "$d/bare/bin/laga" report --out "$d/bare/out") >"$d/bare.log" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && grep -q -F "$d/bare/share/laga" "$d/bare.log"; then
  ok "without share/laga: exit 2, naming $d/bare/share/laga"
else
  fail "without share/laga: exit $rc: $(cat "$d/bare.log")"
fi

[ "$failures" -eq 0 ] && echo "install: all checks passed" || { echo "install: $failures failure(s)" >&2; exit 1; }
