#!/usr/bin/env bash
# scripts/link.sh, the emulated multi-machine link: `laga bench-comm` at P 2 through a 200mbit token
# bucket validates every row (#wrong 0), names the link, and its busbw at the largest size stays under
# the configured rate (a check of the mechanism, loose: ≤ 1.2× the rate; never a timing claim); a
# SIGINT while mpirun runs leaves no namespace, interface, qdisc, process (mpirun, orted, the ranks) or
# temporary file behind; what a SIGKILLed run leaves, the next run removes (and a live run's it leaves
# alone); MPI daemons that exit without calling mpirun back (orte_launch_agent `true`)
# end the run after --startup-timeout with exit 3 and a message, leaving nothing, where mpirun alone
# would wait forever;
# not root, a failing `ip netns add` and a bad option each exit 2 with a message, leaving nothing.
# Skips (77) when not root or when this machine cannot make namespaces, veths, bridges or tbf.
# Usage: link.sh <laga binary> <source dir>
set -u
laga=$1
src=$2
link=$src/scripts/link.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
skip() { echo "link: SKIP: $*"; exit 77; }

[ "$(id -u)" -eq 0 ] || skip "not root (namespaces need root)"
command -v mpirun >/dev/null || skip "mpirun not found (Debian: openmpi-bin)"
probe=laga-probe-$$
if ! err=$(ip netns add "$probe" 2>&1); then skip "ip netns add failed: $err"; fi
ok=1
ip -n "$probe" link add br0 type bridge 2>/dev/null || ok=0
ip -n "$probe" link add e0 type veth peer name e1 2>/dev/null || ok=0
ip netns exec "$probe" tc qdisc add dev e0 root tbf rate 200mbit burst 64kb latency 50ms 2>/dev/null || ok=0
ip netns del "$probe"
[ "$ok" -eq 1 ] || skip "bridge, veth or tc tbf unavailable in a network namespace"

# What the host has before: interfaces, qdiscs, namespaces. Every case must leave them as they were.
host_state() { ip -o link show | sed 's/^[0-9]*: //' | cut -d' ' -f1-2 | sort; tc qdisc show | sort; ip netns list | sort; }
host_state >"$work/before"
left_behind() {  # pid of a link.sh run -> what it left: namespaces, its temporary directory, host changes
  ip netns list | grep "^laga-$1-" && echo "namespaces of run $1 left"
  host_state | diff "$work/before" - >/dev/null || echo "host interfaces, qdiscs or namespaces changed"
  ls -d /tmp/laga-link.$1.* 2>/dev/null && echo "temporary files of run $1 left"
}

# 1. bench-comm through a 200mbit link: validated rows, the link named, busbw under the rate.
rate_mbit=200
"$link" --ranks 2 --rate ${rate_mbit}mbit -- "$laga" bench-comm -b 256K -e 4M -f 16 --ops all_gather,all_to_all \
  -n 3 -w 1 --timeout 120 --json "$work/link.json" >"$work/out" 2>&1 &
pid=$!
wait $pid
status=$?
[ "$status" -eq 0 ] && echo "ok: bench-comm through link.sh" || fail "bench-comm through link.sh: status $status: $(tail -5 "$work/out")"
grep -q "^# link: 2 namespaces, tbf rate ${rate_mbit}mbit" "$work/out" || fail "the table's header does not name the link"
# TCP's congestion control is link.sh's own (CUBIC, else Reno), not the host's default (BBR on some
# hosts), and OpenMPI sends eagerly up to 32 MiB (no rendezvous whose handshake can queue behind bulk
# data): both named in the header (docs/throughput.md §2), with laga's own MPI progress setting
# (--mpi-progress, default 500 µs).
grep -Eq "^# link: .*, tcp (cubic|reno), mpi eager up to 32768 KiB; MPI progress from compute every 500 µs$" "$work/out" \
  || fail "the header does not name link.sh's congestion control, eager limit and laga's MPI progress: $(grep '^# link' "$work/out")"
/usr/bin/python3 - "$work/link.json" "$rate_mbit" <<'PY' || fail "bench-comm JSON through the link"
import json, sys
j = json.load(open(sys.argv[1])); rate_GBps = float(sys.argv[2]) * 1e6 / 8 / 1e9
assert j["backend"] == "mpi" and j["sp"] == 2 and "tbf rate" in j["link"], (j["backend"], j["sp"], j["link"])
rows = j["rows"]
assert len(rows) == 4 and all(r["wrong"] == 0 for r in rows), rows
for op in ("all_gather", "all_to_all"):
    big = max((r for r in rows if r["op"] == op), key=lambda r: r["bytes"])
    print(f"{op} {big['bytes']} B: busbw {big['busbw_GBps']:.4f} GB/s, rate {rate_GBps:.4f} GB/s "
          f"({big['busbw_GBps'] / rate_GBps:.2f}x)")
    assert big["busbw_GBps"] <= 1.2 * rate_GBps, f"{op}: busbw {big['busbw_GBps']} GB/s above 1.2x the rate"
PY
[ -z "$(left_behind $pid)" ] || fail "after a run: $(left_behind $pid)"

# 1b. Each namespace's rank is bound to its own core (link.sh's taskset) and is a "node" of one rank to
# MPI: it must run one OpenMP thread on that core, not the machine's count (two threads on one core).
cores=$(nproc)
want=$(( cores / 2 > 0 ? cores / 2 : 1 ))
"$link" --ranks 2 --rate ${rate_mbit}mbit -- "$laga" bench --model tiny --seq 64 --sp 2 --forms explicit --iters 1 \
  --warmup 0 --timeout 120 >"$work/threads.out" 2>&1 &
pid=$!
wait $pid
status=$?
if [ "$status" -eq 0 ] && grep -q "threads per rank: $want (OpenMP" "$work/threads.out"; then
  echo "ok: a rank under link.sh runs $want OpenMP thread(s) on its $want core(s)"
else
  fail "threads per rank under link.sh (want $want): status $status: $(grep -m1 'threads per rank' "$work/threads.out" || tail -3 "$work/threads.out")"
fi
[ -z "$(left_behind $pid)" ] || fail "after the bench: $(left_behind $pid)"

# 2. SIGINT while mpirun runs (a sweep that would take minutes at 200mbit): exit 130, nothing left.
# (Job control on: a background job of a script otherwise starts with SIGINT ignored, untrappable.)
set -m
long_run() {  # output file -> a link.sh run of minutes at 200mbit, in the background
  "$link" --ranks 2 --rate ${rate_mbit}mbit -- "$laga" bench-comm -b 64M -e 64M -n 100 >"$1" 2>&1 &
}
wait_started() {  # pid, output file: until its rank 1 runs in its namespace and the table has begun
  # Up to 120 s: a loaded machine (the sanitizer stage runs two tests at once) can start slowly, and
  # past mpirun's own 60 s startup timeout its message lands in the output.
  for _ in $(seq 1200); do
    [ -n "$(ip netns pids laga-$1-1 2>/dev/null)" ] && grep -q "^# op" "$2" && break
    kill -0 $1 2>/dev/null || break
    sleep 0.1
  done
}
long_run "$work/int.out"
pid=$!
wait_started $pid "$work/int.out"
in_namespaces() {  # what runs in run $1's namespaces, for a failure's message
  local ns p
  for ns in laga-$1-head laga-$1-0 laga-$1-1; do
    for p in $(ip netns pids $ns 2>/dev/null); do
      echo "$ns: $(ps -o pid=,stat=,etimes=,args= -p $p | cut -c1-160)"
    done
  done
}
grep -q "^# op" "$work/int.out" \
  || fail "the interrupted run never started: $(tail -5 "$work/int.out"); in its namespaces: $(in_namespaces $pid)"
inside=$(for ns in laga-$pid-head laga-$pid-0 laga-$pid-1; do ip netns pids $ns 2>/dev/null; done)
kill -INT $pid
wait $pid
status=$?
set +m
[ "$status" -eq 130 ] && echo "ok: SIGINT ends link.sh with 130" || fail "SIGINT: status $status, want 130"
[ -z "$(left_behind $pid)" ] && echo "ok: nothing left after SIGINT" || fail "after SIGINT: $(left_behind $pid)"
[ -n "$inside" ] || fail "no process was running in the namespaces when SIGINT came"
alive() {  # a process that still runs (an exited one waiting for init to reap it does not)
  local state
  state=$(sed -n 's/^State:\s*\(.\).*/\1/p' /proc/$1/status 2>/dev/null)
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}
for p in $inside; do alive "$p" && fail "process $p ($(cat /proc/$p/comm 2>/dev/null)) outlived SIGINT"; done

# 2b. SIGKILL, which no trap catches, leaves the run's namespaces, its processes (mpirun, orted, the
# ranks) and its temporary directory. The next run removes them when it starts, and a run that starts
# while another runs leaves the live run's alone.
set -m
long_run "$work/kill.out"
killed=$!
wait_started $killed "$work/kill.out"
grep -q "^# op" "$work/kill.out" || fail "the run to be killed never started: $(tail -5 "$work/kill.out")"
stale=$(for ns in laga-$killed-head laga-$killed-0 laga-$killed-1; do ip netns pids $ns 2>/dev/null; done)
kill -KILL $killed
wait $killed
if [ -z "$stale" ] || ! ip netns list | grep -q "^laga-$killed-"; then
  fail "SIGKILL left no namespace or process behind: nothing for the next run to remove"
fi
long_run "$work/next.out"
pid=$!
wait_started $pid "$work/next.out"
grep -q "^link.sh: removed laga-$killed-0, left by run $killed, which no longer runs" "$work/next.out" \
  && echo "ok: the next run removes what a SIGKILLed run left" \
  || fail "the next run did not say it removed laga-$killed-0: $(head -5 "$work/next.out")"
[ -z "$(ip netns list | grep "^laga-$killed-")$(ls -d /tmp/laga-link.$killed.* 2>/dev/null)" ] \
  || fail "after the next run started, run $killed's namespaces or files are left: $(ip netns list | grep "^laga-$killed-")"
for p in $stale; do alive "$p" && fail "process $p ($(cat /proc/$p/comm 2>/dev/null)) of the SIGKILLed run outlived the next run's start"; done
out=$("$link" --rate bogus -- "$laga" bench-comm 2>&1)  # a third run, while the second runs (exits 2 at tc)
[ -n "$(ip netns pids laga-$pid-1 2>/dev/null)" ] && echo "ok: a run starting beside a live one leaves its namespaces" \
  || fail "a run starting beside run $pid removed its namespaces or ended its rank: $out"
kill -INT $pid
wait $pid
status=$?
set +m
[ "$status" -eq 130 ] && [ -z "$(left_behind $pid)" ] || fail "the run after the SIGKILLed one: status $status (want 130), left: $(left_behind $pid)"

# 2c. Daemons that exit at once without calling back: mpirun alone waits forever; link.sh ends the run.
start=$SECONDS
out=$(LAGA_LINK_MCA="--mca orte_launch_agent true" timeout -s TERM 120 "$link" --startup-timeout 3 -- "$laga" bench-comm 2>&1)
status=$?
pid=$(sed -n 's/.*namespaces laga-\([0-9]*\)-\*$/\1/p' <<<"$out")
[ "$status" = 3 ] && [ -n "$pid" ] && grep -q "after 3 s no rank runs in laga-$pid-0 laga-$pid-1 (2 of 2 ranks" <<<"$out" \
  && echo "ok: daemons that never call back -> 3 after $((SECONDS - start)) s" \
  || fail "daemons that never call back: want status 3 and the namespaces named: $out"
[ -z "$(left_behind $pid)" ] || fail "after the startup timeout: $(left_behind $pid)"

# 3. Refusals, each exit 2 with a message, nothing made.
out=$(setpriv --reuid=65534 --regid=65534 --clear-groups bash "$link" -- "$laga" bench-comm 2>&1)
status=$?
[ "$status" -eq 2 ] && grep -q "must run as root" <<<"$out" && echo "ok: not root -> 2: $out" \
  || fail "not root: status $status, want 2 and 'must run as root': $out"
mkdir "$work/bin"  # an `ip` whose `netns add` fails, as on a kernel without namespaces
cat >"$work/bin/ip" <<EOF
#!/bin/sh
[ "\$1 \$2" = "netns add" ] && { echo "mount --make-shared /run/netns failed: Operation not permitted" >&2; exit 1; }
exec $(command -v ip) "\$@"
EOF
chmod +x "$work/bin/ip"
out=$(PATH="$work/bin:$PATH" "$link" -- "$laga" bench-comm 2>&1)
status=$?
[ "$status" -eq 2 ] && grep -q "ip netns add .* failed" <<<"$out" && echo "ok: ip netns add failing -> 2: $out" \
  || fail "ip netns add failing: status $status, want 2: $out"
out=$("$link" --rate 2>&1)
status=$?
[ "$status" -eq 2 ] && echo "ok: --rate without a value -> 2: $out" || fail "--rate without a value: status $status: $out"
out=$("$link" --startup-timeout 0 -- "$laga" bench-comm 2>&1)
status=$?
[ "$status" -eq 2 ] && grep -q "startup-timeout '0' must be" <<<"$out" && echo "ok: --startup-timeout 0 -> 2" \
  || fail "--startup-timeout 0: status $status: $out"
out=$("$link" --speed 1gbit -- "$laga" bench-comm 2>&1)
status=$?
[ "$status" -eq 2 ] && grep -q "unknown option '--speed'" <<<"$out" && echo "ok: unknown option -> 2" \
  || fail "unknown option: status $status: $out"
out=$("$link" --rate bogus -- "$laga" bench-comm 2>&1)
status=$?
[ "$status" -eq 2 ] && grep -q "tc qdisc" <<<"$out" && echo "ok: a rate tc refuses -> 2: $out" \
  || fail "--rate bogus: status $status, want 2: $out"
host_state | diff "$work/before" - >/dev/null || fail "the refusals changed the host's interfaces, qdiscs or namespaces"

[ "$failures" -eq 0 ] && echo "link: all cases pass" || echo "link: $failures failures"
[ "$failures" -eq 0 ]
