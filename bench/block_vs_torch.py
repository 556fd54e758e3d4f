"""The MLA block's forward + backward, laga against PyTorch eager, side by side in one run.

Holds: the driver that runs bench_block (laga) and bench/torch_block.py (PyTorch eager) on the same
configuration with the same thread count (laga: --threads n and OMP_NUM_THREADS=n; torch:
torch.set_num_threads(n)), alternating the two round by round (the first to go swaps every round)
so that machine noise falls on both, and prints a table per dtype: the median forward + backward
seconds of each over every timed iteration of every round, their spread, and the ratio torch/laga.
With --check DIR it first verifies, on a laga dump, that the torch block is the same function.

Not here: the block itself (bench_block.cpp, torch_block.py); the meaning of the numbers:
docs/benchmarks.md.

Usage (Debian's torch imports only under /usr/bin/python3):
  /usr/bin/python3 bench/block_vs_torch.py build-bench/bench/bench_block [--threads 2] [--rounds 3]
      [--dtypes fp32,bf16] [--kernel fused] [--model small --seq 2048 --batch 1 --layers 1]
      [--iters 3 --warmup 1] [--torch-fp32-iters 1 --torch-fp32-warmup 0] [--check DIR] [--json F]
      [--attn-backward two-pass|one-pass] [--torch-blas system|openblas]
--torch-blas openblas loads Debian's OpenBLAS (libopenblas0-pthread) into the torch processes alone
(LD_PRELOAD of its libblas.so.3; Debian's torch links the reference BLAS, ~6 GFLOP/s in fp32); the
system's BLAS is never changed. The header says which BLAS the torch process actually mapped. Beware:
installing libopenblas0-pthread makes it the system's libblas.so.3 (update-alternatives, priority 100
over the reference's 10); set the system back with
  update-alternatives --set libblas.so.3-x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/blas/libblas.so.3
  update-alternatives --set liblapack.so.3-x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/lapack/liblapack.so.3
so that only the preload decides. Without --torch-blas openblas the header then says "mapped reference".
Targets: laga / torch >= 3x in bf16, >= 2.5x in fp32 against torch on OpenBLAS.
Exit: 0 measured (whether or not a target is met), 1 a run failed or the check disagreed, 2 usage.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_BLOCK = os.path.join(HERE, "torch_block.py")
TARGET = {"bf16": 3.0, "fp32": 2.5}
OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"


def machine():
    cpu, flags = "unknown", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if cpu == "unknown" and line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                if not flags and line.startswith("flags"):
                    flags = line + " "
    except OSError:
        pass
    for ext in ("avx512f", "avx512_bf16", "amx_bf16"):
        if f" {ext} " in flags:
            cpu += f" +{ext}"
    try:
        commit = subprocess.run(["git", "-C", HERE, "describe", "--always", "--dirty"], capture_output=True,
                                text=True, timeout=30).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return cpu, commit


def torch_env(a):
    """The torch processes' environment: OpenBLAS preloaded for them alone with --torch-blas openblas."""
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    if a.torch_blas == "openblas":
        env["LD_PRELOAD"] = OPENBLAS + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    return env


def torch_info(a):
    # BLAS_INFO is what torch was built against; the mapped libraries say what this process runs.
    code = ("import torch; c = torch.__config__.show(); "
            "b = [s.split('=')[1] for s in c.replace(',', ' ').split() if s.startswith('BLAS_INFO=')]; "
            "m = open('/proc/self/maps').read(); "
            "run = 'openblas' if 'libopenblas' in m else 'reference (libblas)' if 'libblas' in m else 'unknown'; "
            "print(torch.__version__, b[0] if b else 'unknown', run.replace(' ', '_'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=torch_env(a))
    if out.returncode != 0:
        raise SystemExit(f"block_vs_torch: {sys.executable} cannot import torch: {out.stderr.strip()[-500:]}\n"
                         "run it with Debian's /usr/bin/python3 (apt-get install python3-torch)")
    version, built, mapped = out.stdout.split()
    return version, f"{built}, mapped {mapped.replace('_', ' ')}"


def run(cmd, env, what):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(f"block_vs_torch: {what} exited {p.returncode}: {' '.join(cmd)}\n{p.stdout[-2000:]}"
                         f"{p.stderr[-3000:]}\n")
        raise SystemExit(1)
    return p.stdout


def laga_round(a, dtype, tmp):
    out = os.path.join(tmp, f"laga_{dtype}.json")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    cmd = [a.bench_block, "--model", a.model, "--seq", str(a.seq), "--batch", str(a.batch), "--layers",
           str(a.layers), "--dtype", dtype, "--kernel", a.kernel, "--iters", str(a.iters), "--warmup",
           str(a.warmup), "--threads", str(a.threads), "--attn-backward", a.attn_backward, "--json", out]
    log = run(cmd, env, "bench_block")
    with open(out) as f:
        j = json.load(f)
    if not j.get("pass"):
        sys.stderr.write(f"block_vs_torch: bench_block reported wrong values:\n{log}")
        raise SystemExit(1)
    c = j["config"]
    return {"fwd": c["fwd_s"], "bwd": c["bwd_s"], "total": c["total_s"], "threads": c["threads"],
            "check": c["check"], "flops": c["flops"]}


def torch_round(a, dtype, tmp):
    out = os.path.join(tmp, f"torch_{dtype}.json")
    env = torch_env(a)
    iters, warmup = (a.torch_fp32_iters, a.torch_fp32_warmup) if dtype == "fp32" else (a.iters, a.warmup)
    cmd = [sys.executable, TORCH_BLOCK, "--model", a.model, "--seq", str(a.seq), "--batch", str(a.batch),
           "--layers", str(a.layers), "--dtype", dtype, "--threads", str(a.threads), "--iters", str(iters),
           "--warmup", str(warmup), "--json", out]
    run(cmd, env, "torch_block.py")
    with open(out) as f:
        j = json.load(f)
    return {"fwd": j["fwd_s"], "bwd": j["bwd_s"], "total": j["total_s"], "threads": j["threads"]}


def summary(samples):
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "n": len(samples)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench_block", help="path to the bench_block executable")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both (default: every core)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--kernel", default="fused", choices=["fused", "eager"], help="laga's attention kernel")
    ap.add_argument("--model", default="small")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3, help="timed iterations per round (both sides)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--torch-fp32-iters", type=int, default=1,
                    help="torch fp32 iterations per round: Debian's torch does fp32 matmuls in the reference "
                         "BLAS, ~100 s per iteration at the default size")
    ap.add_argument("--torch-fp32-warmup", type=int, default=0)
    ap.add_argument("--check", metavar="DIR", help="first check the torch block on this laga dump")
    ap.add_argument("--json", help="write the table and every sample here")
    ap.add_argument("--attn-backward", default="two-pass", choices=["two-pass", "one-pass"],
                    help="laga's fused attention backward order")
    ap.add_argument("--torch-blas", default="system", choices=["system", "openblas"],
                    help="openblas: preload Debian's OpenBLAS into the torch processes alone")
    a = ap.parse_args()
    if a.torch_blas == "openblas" and not os.path.exists(OPENBLAS):
        ap.error(f"--torch-blas openblas needs {OPENBLAS}: apt-get install libopenblas0-pthread")
    dtypes = [d for d in a.dtypes.split(",") if d]
    if not os.access(a.bench_block, os.X_OK):
        ap.error(f"{a.bench_block} is not an executable; build it: ninja -C build-bench bench_block")
    if any(d not in ("fp32", "bf16") for d in dtypes) or not dtypes:
        ap.error(f"--dtypes {a.dtypes}: valid values are fp32, bf16 (comma-separated)")
    if min(a.threads, a.rounds, a.iters, a.torch_fp32_iters) < 1 or min(a.warmup, a.torch_fp32_warmup) < 0:
        ap.error("--threads, --rounds and the iteration counts must be positive, warm-ups non-negative")

    if a.check:
        out = run([sys.executable, TORCH_BLOCK, "--check", a.check], dict(os.environ), "torch_block.py --check")
        print(out, end="")

    cpu, commit = machine()
    tv, blas = torch_info(a)
    samples = {d: {"laga": {"fwd": [], "bwd": [], "total": []}, "torch": {"fwd": [], "bwd": [], "total": []}}
               for d in dtypes}
    meta, loads = {}, [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="block_vs_torch.") as tmp:
        for d in dtypes:
            for r in range(a.rounds):
                order = ("laga", "torch") if r % 2 == 0 else ("torch", "laga")
                for side in order:
                    res = laga_round(a, d, tmp) if side == "laga" else torch_round(a, d, tmp)
                    loads.append(os.getloadavg()[0])
                    for k in ("fwd", "bwd", "total"):
                        samples[d][side][k] += res[k]
                    meta.setdefault(d, {})[side + "_threads"] = res["threads"]
                    if side == "laga":
                        meta[d]["check"], meta[d]["flops"] = res["check"], res["flops"]
                    print(f"# {d} round {r + 1}/{a.rounds} {side}: total "
                          + " ".join(f"{t:.3f}" for t in res["total"]) + " s", file=sys.stderr, flush=True)

    rows = []
    for d in dtypes:
        L = {k: summary(v) for k, v in samples[d]["laga"].items()}
        T = {k: summary(v) for k, v in samples[d]["torch"].items()}
        ratio = T["total"]["median"] / L["total"]["median"]
        rows.append({"dtype": d, "laga": L, "torch": T, "ratio": ratio,
                     "ratio_fwd": T["fwd"]["median"] / L["fwd"]["median"],
                     "ratio_bwd": T["bwd"]["median"] / L["bwd"]["median"],
                     "laga_gflops": meta[d]["flops"]["total"] / 1e9 / L["total"]["median"],
                     "torch_gflops": meta[d]["flops"]["total"] / 1e9 / T["total"]["median"],
                     "threads": {"laga": meta[d]["laga_threads"], "torch": meta[d]["torch_threads"]},
                     "target": TARGET[d], "target_met": ratio >= TARGET[d]})

    print(f"# block_vs_torch: MLA block forward + backward, laga (kernel {a.kernel}, {a.attn_backward} attention "
          f"backward, form explicit, sp 1) vs PyTorch {tv} eager")
    print(f"# machine: {cpu}, {a.threads} threads each, commit {commit}; torch BLAS: built {blas}")
    print(f"# model {a.model}, T {a.seq}, B {a.batch}, layers {a.layers}; {a.rounds} alternating rounds; "
          f"medians over every timed iteration [min, max]")
    print(f"# noise: 1-minute load average {min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} cores "
          f"during the run (above the thread count, the two sides compete with other processes)")
    print(f"# {'dtype':>5} {'laga_s':>9} {'[min, max]':>17} {'torch_s':>9} {'[min, max]':>17} {'ratio':>6} "
          f"{'fwd':>6} {'bwd':>6} {'laga_GF/s':>9} {'torch_GF/s':>10}  target")
    print(f"# {'':>5} {'s':>9} {'s':>17} {'s':>9} {'s':>17} {'t/l':>6} {'t/l':>6} {'t/l':>6} {'1e9/s':>9} "
          f"{'1e9/s':>10}")
    for r in rows:
        L, T = r["laga"]["total"], r["torch"]["total"]
        print(f"  {r['dtype']:>5} {L['median']:9.3f} [{L['min']:7.3f}, {L['max']:7.3f}] {T['median']:9.3f} "
              f"[{T['min']:7.3f}, {T['max']:7.3f}] {r['ratio']:6.2f} {r['ratio_fwd']:6.2f} {r['ratio_bwd']:6.2f} "
              f"{r['laga_gflops']:9.1f} {r['torch_gflops']:10.1f}  {r['target']:g}x "
              f"{'met' if r['target_met'] else 'NOT met'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "block_vs_torch", "machine": {"cpu": cpu, "commit": commit, "threads": a.threads},
                       "torch": {"version": tv, "blas": blas},
                       "config": {"model": a.model, "seq": a.seq, "batch": a.batch, "layers": a.layers,
                                  "kernel": a.kernel, "attn_backward": a.attn_backward, "torch_blas": a.torch_blas,
                                  "rounds": a.rounds, "iters": a.iters, "warmup": a.warmup,
                                  "torch_fp32_iters": a.torch_fp32_iters, "torch_fp32_warmup": a.torch_fp32_warmup},
                       "rows": rows, "samples": samples, "load_average": loads, "checks": {d: meta[d]["check"] for d in dtypes}},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
