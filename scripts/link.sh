#!/usr/bin/env bash
# N machines joined by a rate-limited link, emulated on this one (run as root): N network namespaces,
# one per MPI rank, each with a veth into a bridge that lives in one more namespace (the head, where
# mpirun runs), addresses of a private /24 that only these namespaces see, and a tc token bucket
# (tbf rate R burst B latency L, optionally behind a netem delay) on every rank's egress, TCP's
# congestion control set to CUBIC on the subnet's route (not the host's default, which may be BBR), and
# OpenMPI's TCP transport sending messages up to 32 MiB eagerly (no rendezvous handshake). The
# command runs under mpirun as one process per namespace, its MPI traffic (btl tcp) and mpirun's own
# (oob) over the bridge; LAGA_LINK describes the link to laga (bench-comm prints it).
#
#   scripts/link.sh [--ranks N] [--rate R] [--burst B] [--latency L] [--delay D] [--startup-timeout S]
#                   -- PROGRAM ARGS...
#     --ranks N    namespaces = MPI ranks (default 2)
#     --rate R     tbf rate per rank, tc's units (default 28mbit; `laga report` derives the rate that
#                  matches the paper's two-node setting on the machine it runs on: docs/throughput.md §3)
#     --burst B    tbf bucket, tc's units (default 64kb)
#     --latency L  tbf queueing limit (default 50ms)
#     --delay D    netem delay before the bucket, e.g. 100us (needs sch_netem in the kernel)
#     --startup-timeout S  seconds for every rank to start (default 120): past them the run is ended
#                  with a message and exit 3, since mpirun itself waits forever for a daemon that died
#                  before calling back (its orte_startup_timeout does not cover that)
#     PROGRAM      laga (this checkout's build/laga) or a path to any binary; its arguments follow
#   e.g. scripts/link.sh --ranks 2 --rate 1gbit -- laga bench-comm -b 64K -e 16M --ops all_gather,all_to_all
#
# Nothing of the host's network is touched: every interface, address, route and qdisc is inside the
# namespaces this run creates (laga-<pid>-0 .. laga-<pid>-<N-1>, laga-<pid>-head), and the subnet is
# one that no route of the host covers. On exit, on error and on SIGINT/SIGTERM, the processes left
# in them are killed and the namespaces deleted, which removes their veths, bridge and qdiscs with
# them; the temporary hostfile, agent and each machine's temporary directory go too. What a run killed
# by SIGKILL leaves (no trap runs) is removed by the next run, when it starts. Exit status: the
# program's (mpirun's), 2 for bad usage, not root, or namespaces/tc unavailable, 3 when the ranks did
# not all start within the startup timeout, 130/143 when interrupted.
set -u

die() { echo "link.sh: $*" >&2; exit 2; }

ranks=2 rate=28mbit burst=64kb latency=50ms delay="" startup_timeout=120
while [ $# -gt 0 ]; do
  case $1 in
    --ranks) ranks=${2-}; shift 2 || die "--ranks needs a value" ;;
    --rate) rate=${2-}; shift 2 || die "--rate needs a value, e.g. --rate 200mbit" ;;
    --burst) burst=${2-}; shift 2 || die "--burst needs a value, e.g. --burst 64kb" ;;
    --latency) latency=${2-}; shift 2 || die "--latency needs a value, e.g. --latency 50ms" ;;
    --delay) delay=${2-}; shift 2 || die "--delay needs a value, e.g. --delay 100us" ;;
    --startup-timeout) startup_timeout=${2-}; shift 2 || die "--startup-timeout needs a value, e.g. --startup-timeout 120" ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1'; valid: --ranks --rate --burst --latency --delay --startup-timeout, then -- PROGRAM ARGS" ;;
  esac
done
[ $# -ge 1 ] || die "no program: give -- laga ARGS..., e.g. -- laga bench-comm"
[[ $ranks =~ ^[0-9]+$ ]] && [ "$ranks" -ge 1 ] && [ "$ranks" -le 250 ] || die "--ranks '$ranks' must be 1 .. 250, e.g. --ranks 2"
[[ $startup_timeout =~ ^[0-9]+$ ]] && [ "$startup_timeout" -ge 1 ] \
  || die "--startup-timeout '$startup_timeout' must be a whole number of seconds >= 1, e.g. --startup-timeout 120"
[ "$(id -u)" -eq 0 ] || die "must run as root (it creates network namespaces and qdiscs); try: sudo $0 ..."
for tool in ip tc mpirun python3; do command -v $tool >/dev/null || die "$tool not found (Debian: iproute2, openmpi-bin, python3)"; done

# What an earlier run could not remove: a run killed by SIGKILL (which no trap catches) leaves its
# namespaces (with their veths and qdiscs, and any process still in them) and its temporary directory.
# Those of a run whose script no longer runs (laga-<pid>-*, /tmp/laga-link.<pid>.*, <pid> not a live
# link.sh) are removed here; a live run's are left alone.
run_alive() { [ "$1" = $$ ] || tr '\0' '\n' 2>/dev/null <"/proc/$1/cmdline" | grep -qE '(^|/)link\.sh$'; }
for ns in $(ip netns list 2>/dev/null | cut -d' ' -f1 | grep -E '^laga-[0-9]+-(head|[0-9]+)$'); do
  run=${ns#laga-}; run=${run%%-*}
  run_alive "$run" && continue
  pids=$(ip netns pids "$ns" 2>/dev/null)
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
  ip netns del "$ns" 2>/dev/null && echo "link.sh: removed $ns, left by run $run, which no longer runs" >&2
done
for dir in /tmp/laga-link.*.*; do
  [ -d "$dir" ] || continue
  run=${dir#/tmp/laga-link.}; run=${run%%.*}
  [[ $run =~ ^[0-9]+$ ]] && ! run_alive "$run" && rm -rf "$dir"
done

# The program: "laga" is this checkout's build; otherwise a path or a command on PATH. Absolute,
# since the ranks start in their namespaces' view of the same filesystem but not in this directory.
repo=$(cd "$(dirname "$0")/.." && pwd)
program=$1
shift
if [ "$program" = laga ] && [ ! -e laga ]; then program=${LAGA:-$repo/build/laga}; fi
resolved=$(command -v -- "$program") || die "program '$program' not found; build laga first (cmake --build build)"
program=$(realpath "$resolved")

# A /24 that no route of the host covers (10.213.k.0/24, the first free k).
subnet=$(python3 - <<'PY'
import ipaddress, subprocess
taken = []
for line in subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout.splitlines():
    word = line.split()[0] if line.split() else ""
    if word in ("default", "broadcast", "local", "unreachable", "prohibit", "blackhole"):
        word = line.split()[1] if word != "default" and len(line.split()) > 1 else ""
    try:
        taken.append(ipaddress.ip_network(word, strict=False))
    except ValueError:
        pass
for k in range(256):
    net = ipaddress.ip_network(f"10.213.{k}.0/24")
    if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
        print(net); break
PY
)
[ -n "$subnet" ] || die "no free 10.213.k.0/24 subnet: every one is routed on this host"
prefix=${subnet%.0/24}

id=laga-$$
head=$id-head
work=$(mktemp -d /tmp/laga-link.$$.XXXXXX)  # its pid in the name: what a run leaves is its own
made=()  # namespaces created, for cleanup
mpirun_pid=""

cleanup() {
  trap - EXIT INT TERM
  if [ -n "$mpirun_pid" ] && kill -0 "$mpirun_pid" 2>/dev/null; then
    kill -TERM "$mpirun_pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$mpirun_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$mpirun_pid" 2>/dev/null
  fi
  # A namespace lives on while a process is in it: end them (TERM, then KILL), then delete.
  local ns pids
  for ns in "${made[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -TERM $pids 2>/dev/null
  done
  for _ in $(seq 30); do
    pids=""
    for ns in "${made[@]}"; do pids+=$(ip netns pids "$ns" 2>/dev/null); done
    [ -z "$pids" ] && break
    sleep 0.1
  done
  for ns in "${made[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$work"
}
trap 'status=$?; cleanup; exit $status' EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

add_ns() {
  local err
  err=$(ip netns add "$1" 2>&1) || die "ip netns add $1 failed: ${err:-no message} (network namespaces unavailable?)"
  made+=("$1")
  ip -n "$1" link set lo up || die "cannot bring up lo in $1"
}

# The head: the bridge, its address (.254) and mpirun.
add_ns "$head"
ip -n "$head" link add br0 type bridge || die "cannot create a bridge in $head (bridge support missing?)"
ip -n "$head" addr add "$prefix.254/24" dev br0 && ip -n "$head" link set br0 up || die "cannot configure br0 in $head"

# Each emulated machine gets its own share of this one's cores (the orted started in its namespace,
# and so its rank, keep the mask; mpirun binds nothing): otherwise every orted, seeing a node of its
# own, would bind its rank to the same first core. More ranks than cores share them round-robin.
cores=$(nproc)
share=$(( cores / ranks > 0 ? cores / ranks : 1 ))
cpus_of() {  # rank -> a taskset list of its cores
  local first=$(( ($1 * share) % cores ))
  echo "$first-$(( first + share - 1 ))"
}
[ "$ranks" -le "$cores" ] || echo "link.sh: $ranks ranks on $cores cores: ranks share cores" >&2

qdisc="tbf rate $rate burst $burst latency $latency"
# TCP's congestion control, set on the route of the subnet inside each rank's namespace (the host's
# default is left alone): loss-based CUBIC (else Reno, always built in). BBR, the default of some
# hosts, estimates bandwidth from the veth's bursts, far above the bucket's rate, so its transfers
# through the bucket vary from run to run where the loss-based ones take the same time
# (docs/throughput.md §2).
congctl=reno
grep -qw cubic /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null && congctl=cubic
link="$ranks namespaces, tbf rate $rate burst $burst latency $latency${delay:+, netem delay $delay}, tcp $congctl"
hostfile=$work/hostfile
agent=$work/agent
{
  echo '#!/bin/sh'
  echo '# plm_rsh_agent of scripts/link.sh: HOST COMMAND... runs COMMAND inside HOST'"'"'s namespace.'
  echo 'host=$1; shift'
  echo 'case $host in'
} >"$agent"
for ((i = 0; i < ranks; i++)); do
  ns=$id-$i
  addr=$prefix.$((i + 1))
  add_ns "$ns"
  ip -n "$ns" link add eth0 type veth peer name v$i netns "$head" || die "cannot create a veth pair for $ns"
  ip -n "$ns" addr add "$addr/24" dev eth0 && ip -n "$ns" link set eth0 up || die "cannot configure eth0 in $ns"
  err=$(ip -n "$ns" route replace "$subnet" dev eth0 congctl "$congctl" 2>&1) \
    || die "cannot set TCP congestion control $congctl on the route of $subnet in $ns: $err"
  ip -n "$head" link set v$i master br0 && ip -n "$head" link set v$i up || die "cannot attach v$i to br0"
  if [ -n "$delay" ]; then
    err=$(ip netns exec "$ns" tc qdisc add dev eth0 root handle 1: netem delay "$delay" 2>&1) \
      || die "tc netem delay $delay failed in $ns: $err (sch_netem missing? leave out --delay)"
    err=$(ip netns exec "$ns" tc qdisc add dev eth0 parent 1:1 handle 10: $qdisc 2>&1) \
      || die "tc qdisc $qdisc failed in $ns: $err"
  else
    err=$(ip netns exec "$ns" tc qdisc add dev eth0 root $qdisc 2>&1) || die "tc qdisc $qdisc failed in $ns: $err"
  fi
  echo "$addr slots=1" >>"$hostfile"
  mkdir "$work/tmp$i"
  echo "  $addr) ns=$ns cpus=$(cpus_of "$i") tmp=$work/tmp$i ;;" >>"$agent"
done
{
  echo '  *) echo "link.sh agent: unknown host $host" >&2; exit 1 ;;'
  echo 'esac'
  # Each machine its own TMPDIR, where OpenMPI keeps its session directory (named by hostname and
  # job, both the same in every namespace): daemons sharing one raced on it, and one at times died
  # after daemonizing, before calling mpirun back, leaving mpirun waiting for it forever.
  echo 'exec ip netns exec "$ns" env TMPDIR="$tmp" taskset -c "$cpus" sh -c "$*"'
} >>"$agent"
chmod +x "$agent"

# Every link up end to end (both ends of each veth with carrier, each bridge port forwarding) before an
# orted tries to call mpirun back: an orted that finds no route gives up, and mpirun would wait for it.
for ((i = 0; i < ranks; i++)); do
  for _ in $(seq 100); do
    ip -n "$id-$i" -o link show eth0 | grep -q LOWER_UP && ip -n "$head" -o -d link show "v$i" | grep -q "state forwarding" \
      && continue 2
    sleep 0.1
  done
  die "the link of $id-$i did not come up within 10 s: $(ip -n "$head" -o -d link show "v$i" | head -c 300)"
done

# OpenMPI's TCP transport sends every message up to 32 MiB eagerly (its default, 64 KiB, starts a
# rendezvous above that). Under a rendezvous, a rank's clear-to-send for its peer's message travels in
# the same ordered stream as its own bulk data and can be queued behind all of it: the two directions
# of an all-to-all then run one after the other, at half the rate, whenever the handshakes race that
# way (at 14 Mbit/s, 6 MB all-to-alls after 0.1 s of compute: 1.0 then 0.8 MB/s against 1.7–1.8;
# docs/throughput.md §2). The emulated RoCE link has no such protocol. Set in the environment, where
# mpirun passes it on to the ranks; a value already there, or an --mca in LAGA_LINK_MCA, wins.
: "${OMPI_MCA_btl_tcp_eager_limit:=33554432}" "${OMPI_MCA_btl_tcp_rndv_eager_limit:=$OMPI_MCA_btl_tcp_eager_limit}"
: "${OMPI_MCA_btl_tcp_max_send_size:=$OMPI_MCA_btl_tcp_eager_limit}"
export OMPI_MCA_btl_tcp_eager_limit OMPI_MCA_btl_tcp_rndv_eager_limit OMPI_MCA_btl_tcp_max_send_size
link="$link, mpi eager up to $((OMPI_MCA_btl_tcp_eager_limit / 1024)) KiB"
export LAGA_LINK=$link OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "link.sh: $link; subnet $subnet; namespaces $id-*" >&2
# mpirun in the background and `wait`, so a signal to this script runs its trap at once; no rank reads
# stdin (--stdin none), so mpirun never touches the terminal from a background process group.
ip netns exec "$head" mpirun --allow-run-as-root --hostfile "$hostfile" -np "$ranks" \
  --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1 --mca orte_startup_timeout 60 --bind-to none --stdin none \
  ${LAGA_LINK_MCA-} --mca btl self,tcp --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
  -x LAGA_LINK --wdir "$PWD" "$program" "$@" &
mpirun_pid=$!

# Until a rank runs in every namespace (a child of the orted there), or mpirun ends. mpirun waits
# forever for a daemon that exits without calling back, so past the startup timeout the run is ended.
rank_started() {  # namespace -> whether a process other than orted runs in it
  local p
  for p in $(ip netns pids "$1" 2>/dev/null); do
    [ "$(cat /proc/$p/comm 2>/dev/null)" != orted ] && [ -e /proc/$p ] && return 0
  done
  return 1
}
deadline=$((SECONDS + startup_timeout))
waiting=("${made[@]:1}")  # the ranks' namespaces (the head's is first)
while [ ${#waiting[@]} -gt 0 ] && kill -0 "$mpirun_pid" 2>/dev/null; do
  still=()
  for ns in "${waiting[@]}"; do rank_started "$ns" || still+=("$ns"); done
  waiting=("${still[@]}")
  [ ${#waiting[@]} -gt 0 ] || break
  if [ $SECONDS -ge $deadline ]; then
    echo "link.sh: after ${startup_timeout} s no rank runs in ${waiting[*]} (${#waiting[@]} of $ranks ranks:" \
      "an MPI daemon that never started, or died before calling mpirun back); ending the run" >&2
    exit 3
  fi
  sleep 0.2
done
wait "$mpirun_pid"
status=$?
mpirun_pid=""
exit $status
