"""laga.torch.MLABlock measured side by side: against laga bench, against plain PyTorch, across communicators.

Holds: the driver of three measurements, each a table (and JSON with --json), taken in one run with
alternating rounds (the side that goes first rotates every round, so machine noise falls on every
side) and medians over iterations:

  1. binding   the binding's overhead at P 1: laga.torch.MLABlock forward + backward in this process
               (torch.set_num_threads and OMP_NUM_THREADS = every usable core) against the step of
               `laga bench --sp 1 --forms <form>` (its row's total_s: the median over iterations of
               fwd + bwd, as the module's), run in this same process
               through laga._C.cli; per dtype. Ratio module / bench; target <= 1.05.
  2. plain     against the plain PyTorch MLA block (laga.plain.MLABlock, autograd, materialised
               scores) on the same state dict and inputs, in a worker process of its own (with
               --torch-blas openblas, Debian's OpenBLAS preloaded into that process alone); the
               module side is this process, without the preload. Ratio plain / module; target
               >= 2.5 in fp32 (against torch on OpenBLAS).
  3. backends  P ranks (--sp, default 2), each with cores / P threads: `laga bench --sp P --forms
               explicit,laga,ring-kv` over threads (the laga binary), MPI (mpirun of the binary) and
               gloo (torch.distributed.run workers running the CLI's own bench over a laga._C.Group
               on the gloo group), plus the module itself (MLABlock over the gloo group): step time,
               exposed communication, ratios gloo / threads and gloo / MPI; then `laga bench-comm`
               (all_gather, reduce_scatter, all_to_all, all_reduce over a size sweep) over the same
               backends: algbw per size and the same ratios. Optional backend threads-py: the
               threads backend inside a Python process (laga._C.cli), the process gloo's ranks run in.

The script re-invokes itself as its workers (--worker plain|dist|cli SPEC): the plain PyTorch side,
a torch.distributed.run rank, a Python process running CLI commands.

Validation, before anything is reported: laga bench validates its rows in each side's first round
(#wrong must be 0; later rounds run --no-validate); bench-comm checks every row (#wrong 0); every
timed iteration's y, dx and weight gradients of the module and of plain are finite (on every rank);
part 2 also checks, once per dtype outside the timing, the module's y, dx and every weight gradient
against the plain block in fp32 on the same state dict and inputs (for bf16: the bf16 values widened):
within 1e-4 (fp32) or 3e-2 (bf16, torch_block.py --check's bound) of each tensor's largest value.
plain bf16's own error against that reference is reported beside it.

Not here: the block (laga.torch, laga.plain, the engine), the meaning of bench's and bench-comm's
figures (docs/benchmarks.md §7, docs/throughput.md). How to run and read it: docs/benchmarks.md §8.

Usage (Debian's torch imports only under /usr/bin/python3; the package is built into build/python):
  PYTHONPATH=build/python /usr/bin/python3 bench/torch_module.py [--parts 1,2,3] [--rounds 3]
      [--model small --seq 2048 --kernel fused --form laga] [--dtypes fp32,bf16] [--iters 3 --warmup 1]
      [--torch-blas system|openblas] [--plain-fp32-iters N --plain-fp32-warmup N]
      [--sp 2 --forms explicit,laga,ring-kv --comm-dtype bf16 --backends threads,mpi,gloo[,threads-py]]
      [--bind core|none] [-b 64K -e 16M -f 4 --ops all_gather,reduce_scatter,all_to_all,all_reduce
      --comm-iters 20 --comm-warmup 2] [--laga build/bin/laga] [--json F]
--torch-blas openblas preloads Debian's OpenBLAS (libopenblas0-pthread's libblas.so.3) into the plain
PyTorch worker alone; read bench/block_vs_torch.py's docstring before installing it (installing makes
it the system's libblas.so.3; set the alternatives back as described there). Without it the plain
side's fp32 products run on the BLAS torch maps (the reference BLAS on Debian: slow; its fp32
iterations then default to 1 per round, no warm-up).
Exit: 0 measured (whether or not a target is met), 1 a run failed or a validation failed (after the
tables and the JSON), 2 usage (also --torch-blas openblas without libopenblas0-pthread).
"""

import argparse
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SELF = os.path.abspath(__file__)
OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"
TARGET_BINDING = 1.05  # module / bench at most
TARGET_PLAIN = {"fp32": 2.5}  # plain / module at least
AGREE = {"fp32": 1e-4, "bf16": 3e-2}  # max|reference - module| <= AGREE * max|reference|, per tensor
TRANSPORT = {
    "threads": "the laga binary, the ranks threads of one process (--comm threads)",
    "mpi": "mpirun of the laga binary, btl self,vader (shared memory)",
    "gloo": "torch.distributed.run processes, laga's c10d communicator on a gloo group (TCP over 127.0.0.1)",
    "threads-py": "laga._C.cli in a Python process, the ranks threads of it (--comm threads)",
}
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


# --------------------------------------------------------------------------------------------
# Shared by the driver and the workers.


def torch_dtype(name):
    import torch
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


def mapped_blas():
    """The BLAS this process has mapped: openblas, mkl, reference (libblas) or none."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return "unknown"
    if "libopenblas" in maps or "openblas-pthread/libblas" in maps or "openblas-openmp/libblas" in maps:
        return "openblas"
    if "libmkl" in maps:
        return "mkl"
    if "libblas.so" in maps:
        return "reference (libblas)"
    return "none"


def torch_blas_built():
    import torch
    c = torch.__config__.show().replace(",", " ").split()
    b = [s.split("=", 1)[1] for s in c if s.startswith("BLAS_INFO=")]
    return b[0] if b else "unknown"


def block_inputs(config, seq, batch, dtype, seed):
    """x and dy [B, T, D] of the whole sequence, the same on every process for a seed."""
    import torch
    d = config.to_dict()["hidden_size"] if hasattr(config, "to_dict") else config["hidden_size"]
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, d, generator=gen)
    dy = torch.randn(batch, seq, d, generator=gen)
    return x.to(dtype), dy.to(dtype)


def time_block(block, x, dy, iters, warmup, group=None, keep=False):
    """Forward, then backward of y.backward(dy), warmup + iters times, each timed apart; the
    timed iterations' (fwd, bwd, exposed comm) seconds, each the slowest rank's over group, whether
    every iteration's y, dx and weight gradients were finite (on every rank), and with keep the last
    iteration's outputs. Exposed comm: Σ wait_s of the module's attention collectives (laga.torch
    modules only; 0 for any other module)."""
    import torch
    import torch.distributed as dist
    params = [(n, p) for n, p in block.named_parameters() if p.requires_grad]
    has_ledger = hasattr(block, "ledger")
    fwd, bwd, comm, finite, last = [], [], [], True, None
    for it in range(warmup + iters):
        xi = x.detach().requires_grad_(True)
        for _, p in params:
            p.grad = None
        if has_ledger:
            block.clear_ledger()
        if group is not None:
            dist.barrier(group)
        t0 = time.perf_counter()
        y = block(xi)
        t1 = time.perf_counter()
        y.backward(dy)
        t2 = time.perf_counter()
        exposed = sum(e["wait_s"] for e in block.ledger() if e["tensor"] != "grad_sync") if has_ledger else 0.0
        ok = bool(torch.isfinite(y).all()) and xi.grad is not None and bool(torch.isfinite(xi.grad).all())
        ok = ok and all(p.grad is None or bool(torch.isfinite(p.grad).all()) for _, p in params)
        times = [t1 - t0, t2 - t1, exposed, 0.0 if ok else 1.0]
        if group is not None:
            t = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            times = t.tolist()
        finite = finite and times[3] == 0.0
        if it >= warmup:
            fwd.append(times[0])
            bwd.append(times[1])
            comm.append(times[2])
        if keep and it == warmup + iters - 1:
            last = {"y": y.detach().clone(), "dx": xi.grad.detach().clone()}
            for n, p in params:
                last[n] = None if p.grad is None else p.grad.detach().clone()
        del y, xi
    return fwd, bwd, comm, finite, last


# --------------------------------------------------------------------------------------------
# Workers: the script re-invoked.


def load_plain():
    """laga.plain from the package's own file, without importing laga (which loads the engine)."""
    spec = importlib.util.find_spec("laga")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch_module: no package laga on the path; PYTHONPATH=build/python")
    path = os.path.join(list(spec.submodule_search_locations)[0], "plain.py")
    s = importlib.util.spec_from_file_location("laga_plain", path)
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    return mod


def worker_plain(spec):
    """laga.plain.MLABlock on the saved state dict and inputs: the timed iterations, and with
    spec['save'] the last iteration's outputs."""
    import torch
    torch.set_num_threads(spec["threads"])
    plain = load_plain()
    data = torch.load(spec["inputs"])
    block = plain.MLABlock(data["cfg"]).to(data["x"].dtype)
    block.load_state_dict(data["state"])
    fwd, bwd, _, finite, last = time_block(block, data["x"], data["dy"], spec["iters"], spec["warmup"],
                                           keep=bool(spec.get("save")))
    if spec.get("save"):
        reference = last
        if data["x"].dtype != torch.float32:
            # the reference of a bf16 run: the plain block in fp32 on the same (bf16) values
            ref = plain.MLABlock(data["cfg"])
            ref.load_state_dict(data["state"])
            _, _, _, _, reference = time_block(ref, data["x"].float(), data["dy"].float(), 1, 0, keep=True)
        torch.save({"plain": last, "reference": reference}, spec["save"])
    with open(spec["out"], "w") as f:
        json.dump({"fwd": fwd, "bwd": bwd, "finite": finite, "threads": torch.get_num_threads(),
                   "torch": torch.__version__, "blas_built": torch_blas_built(), "blas_mapped": mapped_blas()}, f)
    return 0


def run_items(items, group=None, dist_group=None):
    """Every item of a spec in turn: a CLI command (bench, bench-comm) through laga._C.cli over group
    (None: the command's own threads), or the module timed over dist_group."""
    import laga
    results = []
    for item in items:
        if item["kind"] == "cli":
            status, message = laga._C.cli(item["args"], quiet=True, group=group)
            results.append({"kind": "cli", "status": status, "message": message})
        else:
            results.append(module_item(item, dist_group))
    return results


def module_item(item, dist_group):
    """laga.torch.MLABlock at the group's size: the timed iterations, each the slowest rank's."""
    import torch
    import torch.distributed as dist
    import laga
    import laga.torch as lt
    rank, size = (dist.get_rank(dist_group), dist.get_world_size(dist_group)) if dist_group is not None else (0, 1)
    config = laga.Config.preset(item["model"])
    dtype = torch_dtype(item["dtype"])
    block = lt.MLABlock(config, form=item["form"], kernel=item["kernel"], group=dist_group,
                        grad_reduction="none", dtype=dtype)
    torch.manual_seed(item["seed"])
    block.reset_parameters()
    x, dy = block_inputs(config, item["seq"], 1, dtype, item["seed"])
    x = lt.shard(x, item["form"], rank, size, config=config)
    dy = lt.shard(dy, item["form"], rank, size, config=config)
    fwd, bwd, comm, finite, _ = time_block(block, x, dy, item["iters"], item["warmup"], group=dist_group)
    return {"kind": "module", "fwd": fwd, "bwd": bwd, "comm": comm, "finite": finite,
            "threads": torch.get_num_threads(), "sp": size}


def worker_dist(spec):
    """One rank of a torch.distributed.run job: the items over the gloo group."""
    import torch
    import torch.distributed as dist
    torch.set_num_threads(spec["threads"])
    dist.init_process_group("gloo")
    import laga.torch as lt
    g = lt._laga_group(dist.group.WORLD, 0)
    results = run_items(spec["items"], group=g, dist_group=dist.group.WORLD)
    if dist.get_rank() == 0:
        with open(spec["out"], "w") as f:
            json.dump({"results": results, "torch": torch.__version__}, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def worker_cli(spec):
    """CLI commands in a Python process (the threads backend where gloo's ranks run)."""
    results = run_items(spec["items"])
    with open(spec["out"], "w") as f:
        json.dump({"results": results}, f)
    return 0


def worker_main(kind, path):
    with open(path) as f:
        spec = json.load(f)
    if kind == "dist" and spec.get("bind") == "core":
        # each rank on its share of the cores, as mpirun --bind-to core places MPI's ranks
        cores = sorted(os.sched_getaffinity(0))
        size, local = int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
        per = max(1, len(cores) // size)
        mine = cores[(local * per) % len(cores):][:per]
        os.sched_setaffinity(0, mine)
    return {"plain": worker_plain, "dist": worker_dist, "cli": worker_cli}[kind](spec)


# --------------------------------------------------------------------------------------------
# The driver.


def progress(msg):
    print(f"# {msg}", file=sys.stderr, flush=True)


class Failed(Exception):
    """A run that did not produce results (exit 1), or bad usage found by a command (exit 2)."""

    def __init__(self, message, status=1):
        super().__init__(message)
        self.status = status


def machine():
    cpu, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if cpu == "unknown" and line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                if not flags and line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                                text=True, timeout=30).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return {"cpu": cpu, "host": socket.gethostname(), "cores": len(os.sched_getaffinity(0)),
            "online_cores": os.cpu_count(), "flags": {f: f in flags for f in CPU_FLAGS},
            "laga_max_isa": os.environ.get("LAGA_MAX_ISA", "unset"), "commit": commit}


def laga_machine(tmp):
    """laga's own view of the machine (the kernels its ISA gives, its build's commit), from the
    JSON of the cheapest command that writes it: a one-element all_reduce at P 1."""
    import laga
    path = os.path.join(tmp, "machine.json")
    status, message = laga._C.cli(["bench-comm", "--sp", "1", "-b", "8", "-e", "8", "-n", "1", "-w", "0",
                                   "--ops", "all_reduce", "--comm", "threads", "--json", path])
    cli_status(status, message, "laga bench-comm (the machine's description)")
    m = load_json(path, "laga bench-comm").get("machine", {})
    return m.get("isa"), m.get("commit")


def summary(round_medians, lo, hi):
    return {"median": statistics.median(round_medians), "min": lo, "max": hi, "rounds": round_medians}


def check_run(p, what):
    if p.returncode not in (0, 1):
        raise Failed(f"{what} exited {p.returncode}:\n{p.stdout[-3000:]}{p.stderr[-3000:]}",
                     2 if p.returncode == 2 else 1)


def load_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise Failed(f"{what} wrote no JSON {path}: {e}")


def cli_status(status, message, what):
    if status not in (0, 1):
        raise Failed(f"{what} exited {status}: {message}", 2 if status == 2 else 1)


# ---- parts 1 and 2: this process's module, laga bench in this process, plain PyTorch in a worker


class Local:
    """Parts 1 and 2 for one dtype: the module in this process and its sides."""

    def __init__(self, a, dtype, tmp, cores):
        import torch
        import laga
        import laga.torch as lt
        self.a, self.dtype, self.tmp, self.cores = a, dtype, tmp, cores
        self.config = laga.Config.preset(a.model)
        self.block = lt.MLABlock(self.config, form=a.form, kernel=a.kernel, grad_reduction="none",
                                 dtype=torch_dtype(dtype))
        torch.manual_seed(a.seed)
        self.block.reset_parameters()
        self.x, self.dy = block_inputs(self.config, a.seq, 1, torch_dtype(dtype), a.seed)
        self.inputs = os.path.join(tmp, f"inputs_{dtype}.pt")
        torch.save({"state": self.block.state_dict(), "x": self.x, "dy": self.dy,
                    "cfg": self.config.to_dict(seq=a.seq, form=a.form)}, self.inputs)
        self.samples = {s: {"fwd": [], "bwd": [], "total": [], "min": [], "max": []}
                        for s in ("module", "bench", "plain")}
        self.finite = {"module": True, "plain": True}
        self.bench_wrong, self.bench_pass, self.bench_json = 0, True, None
        self.reference = None  # the module's outputs, for the agreement with plain
        self.agree = None
        self.plain_info = None
        self.plain_iters, self.plain_warmup = a.iters, a.warmup
        if dtype == "fp32":  # on the reference BLAS an fp32 iteration takes minutes: one, unwarmed
            slow = a.torch_blas != "openblas"
            self.plain_iters = a.plain_fp32_iters if a.plain_fp32_iters is not None else 1 if slow else a.iters
            self.plain_warmup = (a.plain_fp32_warmup if a.plain_fp32_warmup is not None
                                 else 0 if slow else a.warmup)

    def add(self, side, fwd, bwd, total=None, lo=None, hi=None):
        """One round of a side: per-iteration lists (module, plain) or bench's medians (total: the
        median of fwd + bwd per iteration, as the lists give it)."""
        s = self.samples[side]
        if isinstance(fwd, list):
            tot = [f + b for f, b in zip(fwd, bwd)]
            s["fwd"].append(statistics.median(fwd))
            s["bwd"].append(statistics.median(bwd))
            s["total"].append(statistics.median(tot))
            s["min"].append(min(tot))
            s["max"].append(max(tot))
            return s["total"][-1]
        s["fwd"].append(fwd)
        s["bwd"].append(bwd)
        s["total"].append(total)
        s["min"].append(lo)
        s["max"].append(hi)
        return total

    def validate_module(self):
        """One untimed run: the module's outputs kept for the agreement with plain."""
        _, _, _, finite, last = time_block(self.block, self.x, self.dy, 1, 0, keep=True)
        self.finite["module"] &= finite
        self.reference = last

    def module_round(self):
        fwd, bwd, _, finite, _ = time_block(self.block, self.x, self.dy, self.a.iters, self.a.warmup)
        self.finite["module"] &= finite
        return self.add("module", fwd, bwd)

    def bench_round(self, r):
        import laga
        a = self.a
        path = os.path.join(self.tmp, f"bench_p1_{self.dtype}_{r}.json")
        args = ["bench", "--model", a.model, "--seq", str(a.seq), "--sp", "1", "--forms", a.form,
                "--dtype", self.dtype, "--kernel", a.kernel, "--iters", str(a.iters), "--warmup",
                str(a.warmup), "--seed", str(a.seed), "--json", path] + (["--no-validate"] if r > 0 else [])
        status, message = laga._C.cli(args, quiet=True)
        cli_status(status, message, "laga bench " + " ".join(args[1:]))
        j = load_json(path, "laga bench")
        row = j["rows"][0]
        if r == 0:
            self.bench_json = j
            self.bench_wrong = int(j.get("wrong", 0))
            self.bench_pass = bool(j.get("pass")) and status == 0
        return self.add("bench", row["fwd_s"], row["bwd_s"], row["total_s"], row["total_s_min"],
                        row["total_s_max"])

    def plain_round(self, r, env):
        import torch
        out = os.path.join(self.tmp, f"plain_{self.dtype}_{r}.json")
        save = os.path.join(self.tmp, f"plain_out_{self.dtype}.pt") if r == 0 else None
        spec = {"inputs": self.inputs, "iters": self.plain_iters, "warmup": self.plain_warmup,
                "threads": self.cores, "out": out, "save": save}
        sp = os.path.join(self.tmp, f"plain_spec_{self.dtype}_{r}.json")
        with open(sp, "w") as f:
            json.dump(spec, f)
        p = subprocess.run([sys.executable, SELF, "--worker", "plain", sp], env=env, capture_output=True, text=True,
                           timeout=self.a.subprocess_timeout)
        if p.returncode != 0:
            raise Failed(f"the plain PyTorch worker exited {p.returncode}:\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
        j = load_json(out, "the plain PyTorch worker")
        self.finite["plain"] &= j["finite"]
        self.plain_info = {k: j[k] for k in ("threads", "torch", "blas_built", "blas_mapped")}
        if save:
            saved = torch.load(save)
            self.agree = agreement(self.reference, saved["reference"], self.dtype)
            if self.dtype != "fp32":
                self.agree["plain_vs_reference"] = agreement(saved["plain"], saved["reference"], self.dtype)["worst"]
        return self.add("plain", j["fwd"], j["bwd"])

    def side(self, name):
        s = self.samples[name]
        return {"fwd": statistics.median(s["fwd"]), "bwd": statistics.median(s["bwd"]),
                "total": summary(s["total"], min(s["min"]), max(s["max"]))}


def agreement(got, ref, dtype):
    """Per tensor (y, dx, every weight gradient) max|got - ref| / max|ref| (a gradient left None
    counts as zeros); the worst, and whether every tensor is within AGREE[dtype] (NaN fails)."""
    import torch
    worst, name, ok, per = 0.0, "", set(got) == set(ref), {}
    for k in sorted(set(got) & set(ref)):
        g, r = got[k], ref[k]
        if g is None and r is None:
            continue
        g = torch.zeros_like(r) if g is None else g
        r = torch.zeros_like(g) if r is None else r
        g, r = g.double(), r.double()
        scale = r.abs().max().item()
        diff = (g - r).abs().max().item()
        rel = diff / scale if scale > 0 else diff
        per[k] = rel
        ok = ok and rel <= AGREE[dtype]
        if not rel <= worst:
            worst, name = rel, k
    missing = sorted(set(got) ^ set(ref))
    return {"worst": worst, "worst_tensor": name, "bound": AGREE[dtype], "pass": ok, "per_tensor": per,
            "unmatched": missing}


def run_local(a, dtypes, parts, cores, tmp, plain_env):
    out = {}
    for d in dtypes:
        progress(f"parts {','.join(str(p) for p in sorted(parts & {1, 2}))}, {d}: building the module")
        L = Local(a, d, tmp, cores)
        if 2 in parts:
            L.validate_module()
        sides = (["module"] + (["bench"] if 1 in parts else []) + (["plain"] if 2 in parts else []))
        for r in range(a.rounds):
            order = sides[r % len(sides):] + sides[:r % len(sides)]
            for side in order:
                t = (L.module_round() if side == "module" else L.bench_round(r) if side == "bench"
                     else L.plain_round(r, plain_env))
                progress(f"{d} round {r + 1}/{a.rounds} {side}: {t:.4f} s (median fwd + bwd)")
        out[d] = L
    return out


# ---- part 3: the backends


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Backends:
    def __init__(self, a, cores, tmp):
        self.a, self.tmp = a, tmp
        self.P = a.sp
        self.per = max(1, cores // a.sp)
        self.oversubscribed = a.sp > cores
        self.bench = {}  # (backend, label) -> {"fwd": [...], ...}
        self.module = {"fwd": [], "bwd": [], "total": [], "comm": [], "min": [], "max": [], "finite": True}
        self.comm = {}  # (backend, op, dtype, bytes) -> {"time": [...], "wrong": 0}
        self.meta = {}  # backend -> {"threads": ..., "link": ..., "pass": ..., "wrong": ...}
        self.failures = []

    def env(self):
        return dict(os.environ, OMP_NUM_THREADS=str(self.per))

    def bench_args(self, path, validate):
        a = self.a
        return (["bench", "--model", a.model, "--seq", str(a.seq), "--sp", str(self.P), "--forms", a.forms,
                 "--dtype", a.comm_dtype, "--kernel", a.kernel, "--iters", str(a.iters), "--warmup",
                 str(a.warmup), "--seed", str(a.seed), "--timeout", str(a.timeout), "--json", path]
                + ([] if validate else ["--no-validate"]))

    def comm_args(self, path):
        a = self.a
        return ["bench-comm", "--sp", str(self.P), "-b", a.minbytes, "-e", a.maxbytes, "-f", str(a.stepfactor),
                "--ops", a.ops, "--dtype", a.comm_dtype, "-n", str(a.comm_iters), "-w", str(a.comm_warmup),
                "--timeout", str(a.timeout), "--json", path]

    def mpirun(self):
        cmd = ["mpirun", "-np", str(self.P)]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd += ["--mca", "btl", "self,vader"]
        if self.oversubscribed:
            cmd += ["--oversubscribe", "--bind-to", "none"]
        elif self.a.bind == "core":
            cmd += (["--map-by", f"slot:PE={self.per}"] if self.per > 1 else []) + ["--bind-to", "core"]
        else:
            cmd += ["--bind-to", "none"]
        for var in ("OMP_NUM_THREADS", "LAGA_MAX_ISA", "PYTHONPATH"):
            if var in self.env():
                cmd += ["-x", var]
        return cmd

    def run_round(self, backend, r):
        tag = f"{backend}_{r}"
        bench_json = os.path.join(self.tmp, f"bench_{tag}.json")
        comm_json = os.path.join(self.tmp, f"comm_{tag}.json")
        items = [{"kind": "cli", "args": self.bench_args(bench_json, r == 0)}]
        module = None
        if backend == "gloo" and self.a.module:
            module = {"kind": "module", "model": self.a.model, "seq": self.a.seq, "dtype": self.a.comm_dtype,
                      "kernel": self.a.kernel, "form": self.a.form, "iters": self.a.iters,
                      "warmup": self.a.warmup, "seed": self.a.seed}
            items = items + [module] if r % 2 == 0 else [module] + items
        if self.a.collectives:
            items.append({"kind": "cli", "args": self.comm_args(comm_json)})
        results = self.launch(backend, items, tag)
        for item, res in zip(items, results):
            if item["kind"] == "cli":
                cli_status(res["status"], res["message"], f"{backend}: laga {' '.join(item['args'])}")
            else:
                self.add_module(res)
        self.add_bench(backend, load_json(bench_json, f"{backend}: laga bench"), r)
        if self.a.collectives:
            self.add_comm(backend, load_json(comm_json, f"{backend}: laga bench-comm"))

    def launch(self, backend, items, tag):
        """Runs the items on the backend; per item {"status", "message"} or the module's results."""
        env = self.env()
        if backend in ("threads", "mpi"):
            prefix = [self.a.laga] if backend == "threads" else self.mpirun() + [self.a.laga]
            out = []
            for item in items:
                args = item["args"] + ["--comm", backend]
                p = subprocess.run(prefix + args, env=env, capture_output=True, text=True,
                                   timeout=self.a.subprocess_timeout)
                check_run(p, f"{' '.join(prefix)} {' '.join(args)}")
                out.append({"status": p.returncode, "message": p.stderr.strip()[-2000:]})
            return out
        spec_path = os.path.join(self.tmp, f"spec_{tag}.json")
        out_path = os.path.join(self.tmp, f"out_{tag}.json")
        spec = {"items": items, "out": out_path, "threads": self.per,
                "bind": "none" if self.oversubscribed else self.a.bind}
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        if backend == "threads-py":
            cmd = [sys.executable, SELF, "--worker", "cli", spec_path]
            what = "the threads-py worker"
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(self.P), "-r", "1",
                   "-t", "1", "--log_dir", os.path.join(self.tmp, f"torchrun_{tag}"),
                   "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
                   SELF, "--worker", "dist", spec_path]
            what = "the gloo job (torch.distributed.run)"
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=self.a.subprocess_timeout)
        if p.returncode != 0:
            raise Failed(f"{what} exited {p.returncode}:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
        return load_json(out_path, what)["results"]

    def add_bench(self, backend, j, r):
        m = self.meta.setdefault(backend, {"threads": j.get("threads_per_rank"), "link": j.get("link"),
                                           "backend": j.get("backend"), "wrong": 0, "pass": True,
                                           "machine": j.get("machine"), "commit": j.get("commit")})
        if r == 0:
            m["wrong"] += int(j.get("wrong", 0))
            m["pass"] = m["pass"] and bool(j.get("pass"))
            m["validation"] = j.get("validation", {}).get("summary")
        for row in j["rows"]:
            s = self.bench.setdefault((backend, row["label"]), {k: [] for k in
                                                                 ("fwd", "bwd", "total", "comm", "skew", "min", "max")})
            s["fwd"].append(row["fwd_s"])
            s["bwd"].append(row["bwd_s"])
            s["total"].append(row["total_s"])
            s["comm"].append(row["comm_s"])
            s["skew"].append(row.get("comm_skew_s", 0.0))
            s["min"].append(row["total_s_min"])
            s["max"].append(row["total_s_max"])
            if r == 0:
                s["wrong"] = int(row.get("wrong", 0))

    def add_module(self, res):
        m = self.module
        tot = [f + b for f, b in zip(res["fwd"], res["bwd"])]
        m["fwd"].append(statistics.median(res["fwd"]))
        m["bwd"].append(statistics.median(res["bwd"]))
        m["total"].append(statistics.median(tot))
        m["comm"].append(statistics.median(res["comm"]))
        m["min"].append(min(tot))
        m["max"].append(max(tot))
        m["finite"] = m["finite"] and res["finite"]
        m["threads"] = res["threads"]

    def add_comm(self, backend, j):
        for row in j["rows"]:
            s = self.comm.setdefault((backend, row["op"], row["dtype"], row["bytes"]),
                                     {"time": [], "wrong": 0, "count": row["count"]})
            s["time"].append(row["time_s"])
            s["wrong"] += int(row["wrong"])


def run_backends(a, cores, tmp):
    B = Backends(a, cores, tmp)
    backends = a.backends
    for r in range(a.rounds):
        order = backends[r % len(backends):] + backends[:r % len(backends)]
        for b in order:
            t0 = time.perf_counter()
            B.run_round(b, r)
            progress(f"part 3 round {r + 1}/{a.rounds} {b}: {time.perf_counter() - t0:.1f} s")
    return B


# ---- tables


def fmt_span(s):
    return f"{s['median']:9.4f} [{s['min']:8.4f}, {s['max']:8.4f}]"


def report_local(local, parts, a):
    rows1, rows2 = [], []
    for d, L in local.items():
        mod = L.side("module")
        if 1 in parts:
            b = L.side("bench")
            ratio = mod["total"]["median"] / b["total"]["median"]
            rows1.append({"dtype": d, "module": mod, "bench": b, "ratio": ratio,
                          "ratio_fwd": mod["fwd"] / b["fwd"], "ratio_bwd": mod["bwd"] / b["bwd"],
                          "module_finite": L.finite["module"], "bench_wrong": L.bench_wrong,
                          "bench_pass": L.bench_pass, "target": TARGET_BINDING,
                          "target_met": ratio <= TARGET_BINDING,
                          "bench_validation": (L.bench_json or {}).get("validation", {}).get("summary")})
        if 2 in parts:
            p = L.side("plain")
            ratio = p["total"]["median"] / mod["total"]["median"]
            target = TARGET_PLAIN.get(d)
            rows2.append({"dtype": d, "module": mod, "plain": p, "ratio": ratio,
                          "ratio_fwd": p["fwd"] / mod["fwd"], "ratio_bwd": p["bwd"] / mod["bwd"],
                          "plain_iters": L.plain_iters, "plain_warmup": L.plain_warmup,
                          "module_finite": L.finite["module"], "plain_finite": L.finite["plain"],
                          "agreement": L.agree, "plain_process": L.plain_info, "target": target,
                          "target_met": None if target is None else ratio >= target})
    ok = True
    if rows1:
        print(f"# part 1: the binding's overhead at P 1: laga.torch.MLABlock (form {a.form}, grad_reduction none) "
              f"forward + backward in this process vs laga bench --sp 1 --forms {a.form} (its row's total_s; "
              f"in this process through laga._C.cli); target module/bench <= {TARGET_BINDING}")
        print(f"# {'dtype':>5} {'module':>9} {'[min, max]':>20} {'bench':>9} {'[min, max]':>20} {'ratio':>6} "
              f"{'fwd':>6} {'bwd':>6} {'finite':>6} {'#wrong':>6}  target")
        print(f"# {'':>5} {'s':>9} {'s':>20} {'s':>9} {'s':>20} {'m/b':>6} {'m/b':>6} {'m/b':>6} "
              f"{'module':>6} {'bench':>6}")
        for r in rows1:
            good = r["module_finite"] and r["bench_pass"] and r["bench_wrong"] == 0
            ok &= good
            print(f"  {r['dtype']:>5} {fmt_span(r['module']['total'])} {fmt_span(r['bench']['total'])} "
                  f"{r['ratio']:6.3f} {r['ratio_fwd']:6.3f} {r['ratio_bwd']:6.3f} "
                  f"{'yes' if r['module_finite'] else 'NO':>6} {r['bench_wrong']:>6}  "
                  f"<= {TARGET_BINDING} {'met' if r['target_met'] else 'NOT met'}"
                  f"{'' if good else '  FAIL: not validated'}")
    if rows2:
        pp = rows2[0]["plain_process"]
        print(f"# part 2: against plain PyTorch: laga.plain.MLABlock (autograd, torch {pp['torch']}, "
              f"BLAS {pp['blas_mapped']} mapped, {pp['threads']} "
              f"threads, its own process) vs laga.torch.MLABlock (this process) on the same state dict and inputs; "
              f"target plain/module >= {TARGET_PLAIN['fp32']} in fp32")
        print(f"# {'dtype':>5} {'plain':>9} {'[min, max]':>20} {'module':>9} {'[min, max]':>20} {'ratio':>6} "
              f"{'fwd':>6} {'bwd':>6} {'agree':>9} {'finite':>6} {'iters':>5}  target")
        print(f"# {'':>5} {'s':>9} {'s':>20} {'s':>9} {'s':>20} {'p/m':>6} {'p/m':>6} {'p/m':>6} "
              f"{'max rel':>9} {'both':>6} {'plain':>5}")
        for r in rows2:
            ag = r["agreement"] or {"worst": float("nan"), "pass": False}
            good = r["module_finite"] and r["plain_finite"] and ag["pass"]
            ok &= good
            tgt = "-" if r["target"] is None else f">= {r['target']} {'met' if r['target_met'] else 'NOT met'}"
            print(f"  {r['dtype']:>5} {fmt_span(r['plain']['total'])} {fmt_span(r['module']['total'])} "
                  f"{r['ratio']:6.2f} {r['ratio_fwd']:6.2f} {r['ratio_bwd']:6.2f} {ag['worst']:9.2e} "
                  f"{'yes' if r['module_finite'] and r['plain_finite'] else 'NO':>6} "
                  f"{r['plain_iters']:>5}  {tgt}{'' if good else '  FAIL: not validated'}")
        for r in rows2:
            ag = r["agreement"]
            if ag and "plain_vs_reference" in ag:
                print(f"# {r['dtype']}: agree = the module against the plain block in fp32 on the same {r['dtype']} "
                      f"values (bound {ag['bound']:g} of its max per tensor); plain {r['dtype']}'s own: "
                      f"{ag['plain_vs_reference']:.2e}")
            if ag and not ag["pass"]:
                bad = {k: v for k, v in ag["per_tensor"].items() if not v <= ag["bound"]}
                unmatched = f"; unmatched tensors {ag['unmatched']}" if ag["unmatched"] else ""
                print(f"# FAIL {r['dtype']}: the module differs from the plain block (fp32) by more than "
                      f"{ag['bound']:g} of the plain's max: {bad}{unmatched}")
    return rows1, rows2, ok


def report_backends(B, a):
    backends = a.backends
    labels = []
    for (b, label) in B.bench:
        if label not in labels:
            labels.append(label)
    rows, ok = [], True

    def side(s):
        return {"fwd": statistics.median(s["fwd"]), "bwd": statistics.median(s["bwd"]),
                "total": summary(s["total"], min(s["min"]), max(s["max"])),
                "comm": statistics.median(s["comm"])}

    for label in labels:
        for b in backends:
            s = B.bench.get((b, label))
            if s is None:
                continue
            x = side(s)
            rows.append({"form": label, "backend": b, "kind": "laga bench", **x,
                         "skew": statistics.median(s["skew"]), "threads": B.meta[b]["threads"],
                         "wrong": s.get("wrong", 0)})
    if B.module["total"]:
        x = side(B.module)
        rows.append({"form": f"module {a.form}", "backend": "gloo", "kind": "laga.torch.MLABlock", **x,
                     "skew": None, "threads": B.module.get("threads"), "finite": B.module["finite"], "wrong": None})
    total = {(r["form"], r["backend"]): r["total"]["median"] for r in rows}
    for r in rows:
        form = a.form if r["kind"] != "laga bench" else r["form"]
        for ref in ("threads", "mpi"):
            t = total.get((form, ref))
            r[f"vs_{ref}"] = r["total"]["median"] / t if t else None
        if r["kind"] != "laga bench":
            t = total.get((a.form, "gloo"))
            r["vs_bench_gloo"] = r["total"]["median"] / t if t else None

    over = "oversubscribed: more ranks than cores; " if B.oversubscribed else ""
    print(f"# part 3: P {B.P} ranks x {B.per} thread(s) ({over}"
          f"mpirun --bind-to {'none' if B.oversubscribed else a.bind}, gloo ranks bound the same, threads unbound): "
          f"laga bench --sp {B.P} --forms {a.forms}, dtype {a.comm_dtype}, per backend; module = laga.torch.MLABlock "
          f"(form {a.form}, grad_reduction none) over the gloo group, each iteration the slowest rank's")
    for b in backends:
        m = B.meta.get(b, {})
        print(f"#   {b}: {TRANSPORT[b]}; threads per rank {m.get('threads')} (bench's); validation (round 1): "
              f"{m.get('validation')}")
    print(f"# {'form':<18} {'backend':<10} {'fwd':>8} {'bwd':>8} {'total':>9} {'[min, max]':>20} {'comm':>8} "
          f"{'skew':>8} {'thr':>4} {'#wrong':>6} {'/threads':>8} {'/mpi':>6}")
    print(f"# {'':<18} {'':<10} {'s':>8} {'s':>8} {'s':>9} {'s':>20} {'s':>8} {'s':>8} {'':>4} {'':>6} "
          f"{'x':>8} {'x':>6}")
    for r in rows:
        vt = "-" if r["vs_threads"] is None else f"{r['vs_threads']:.3f}"
        vm = "-" if r["vs_mpi"] is None else f"{r['vs_mpi']:.3f}"
        skew = "-" if r["skew"] is None else f"{r['skew']:.4f}"
        if r["kind"] == "laga bench":
            wrong = str(r["wrong"])
            good = r["wrong"] == 0
        else:
            wrong = "finite" if r["finite"] else "NaN"
            good = r["finite"]
        ok &= good
        print(f"  {r['form']:<18} {r['backend']:<10} {r['fwd']:8.4f} {r['bwd']:8.4f} {fmt_span(r['total'])} "
              f"{r['comm']:8.4f} {skew:>8} {str(r['threads']):>4} {wrong:>6} {vt:>8} {vm:>6}"
              f"{'' if good else '  FAIL'}")
    for r in rows:
        if r["kind"] != "laga bench" and r.get("vs_bench_gloo"):
            print(f"# module/bench over gloo ({a.form}): {r['vs_bench_gloo']:.3f}")
    for b in backends:
        m = B.meta.get(b, {})
        if not m.get("pass", True):
            ok = False
            print(f"# FAIL {b}: laga bench reported wrong values (see its JSON's rows[].validation)")

    comm_rows = []
    if B.comm:
        keys = []
        for (b, op, dt, nbytes) in B.comm:
            if (op, dt, nbytes) not in keys:
                keys.append((op, dt, nbytes))
        for op, dt, nbytes in keys:
            row = {"op": op, "dtype": dt, "bytes": nbytes, "wrong": 0}
            for b in backends:
                s = B.comm.get((b, op, dt, nbytes))
                if s is None:
                    continue
                t = statistics.median(s["time"])
                row[b] = {"time_s": t, "time_s_rounds": s["time"], "algbw_GBps": nbytes / t / 1e9,
                          "wrong": s["wrong"], "count": s["count"]}
                row["wrong"] += s["wrong"]
            for ref in ("threads", "mpi"):
                row[f"gloo_vs_{ref}"] = (row["gloo"]["algbw_GBps"] / row[ref]["algbw_GBps"]
                                         if "gloo" in row and ref in row else None)
            comm_rows.append(row)
        print(f"# part 3, collectives: laga bench-comm --sp {B.P} -b {a.minbytes} -e {a.maxbytes} -f {a.stepfactor} "
              f"--dtype {a.comm_dtype}, {a.comm_iters} iterations after {a.comm_warmup} warm-up per round; "
              f"time: median over rounds of each round's median (each iteration the slowest rank's); "
              f"algbw = size / time (nccl-tests' convention, docs/throughput.md); "
              f"gloo/x: algbw ratio (< 1: gloo slower)")
        cols = "".join(f" {b + ' algbw':>17}" for b in backends)
        print(f"# {'op':<15} {'dtype':<5} {'size':>10}{cols} {'gloo/threads':>12} {'gloo/mpi':>9} {'#wrong':>6}")
        units = "".join(f" {'GB/s':>17}" for _ in backends)
        print(f"# {'':<15} {'':<5} {'B':>10}{units} {'x':>12} {'x':>9} {'':>6}")
        for row in comm_rows:
            vals = "".join(f" {row[b]['algbw_GBps']:17.4g}" if b in row else f" {'-':>17}" for b in backends)
            gt = "-" if row["gloo_vs_threads"] is None else f"{row['gloo_vs_threads']:.3f}"
            gm = "-" if row["gloo_vs_mpi"] is None else f"{row['gloo_vs_mpi']:.3f}"
            ok &= row["wrong"] == 0
            print(f"  {row['op']:<15} {row['dtype']:<5} {row['bytes']:>10}{vals} {gt:>12} {gm:>9} {row['wrong']:>6}"
                  f"{'' if row['wrong'] == 0 else '  FAIL'}")
    return rows, comm_rows, ok


# ---- main


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    ap.add_argument("--parts", default="1,2,3", help="which measurements: 1 binding, 2 plain, 3 backends")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (every side once per round)")
    ap.add_argument("--model", default="small")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--kernel", default="fused", choices=["fused", "eager"])
    ap.add_argument("--form", default="laga", help="the module's form (and parts 1's bench form)")
    ap.add_argument("--dtypes", default="fp32,bf16", help="parts 1 and 2")
    ap.add_argument("--iters", type=int, default=3, help="timed iterations per side and round")
    ap.add_argument("--warmup", type=int, default=1, help="untimed iterations before them")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--torch-blas", default="system", choices=["system", "openblas"],
                    help="openblas: preload Debian's OpenBLAS into the plain PyTorch worker alone")
    ap.add_argument("--plain-fp32-iters", type=int, default=None,
                    help="plain fp32 iterations per round (default: --iters with openblas, else 1)")
    ap.add_argument("--plain-fp32-warmup", type=int, default=None,
                    help="plain fp32 warm-up per round (default: --warmup with openblas, else 0)")
    ap.add_argument("--sp", type=int, default=2, help="part 3's ranks P")
    ap.add_argument("--forms", default="explicit,laga,ring-kv", help="part 3's laga bench forms")
    ap.add_argument("--comm-dtype", default="bf16", choices=["fp32", "bf16"], help="part 3's dtype")
    ap.add_argument("--backends", default="threads,mpi,gloo",
                    help="part 3's: threads (the laga binary), mpi (mpirun of it), gloo (torch.distributed.run), "
                         "threads-py (threads in a Python process)")
    ap.add_argument("--bind", default="core", choices=["core", "none"],
                    help="mpirun's --bind-to, and the gloo ranks' binding alike")
    ap.add_argument("--no-module", dest="module", action="store_false", help="part 3 without the module row")
    ap.add_argument("--no-collectives", dest="collectives", action="store_false", help="part 3 without bench-comm")
    ap.add_argument("-b", "--minbytes", default="64K")
    ap.add_argument("-e", "--maxbytes", default="16M")
    ap.add_argument("-f", "--stepfactor", type=int, default=4)
    ap.add_argument("--ops", default="all_gather,reduce_scatter,all_to_all,all_reduce")
    ap.add_argument("--comm-iters", type=int, default=20)
    ap.add_argument("--comm-warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600, help="seconds a laga collective may wait")
    ap.add_argument("--subprocess-timeout", type=float, default=3600, help="seconds a launched job may run")
    ap.add_argument("--laga", default=None, help="the laga binary (default: the one beside the package)")
    ap.add_argument("--json", help="write every table and sample here")
    return ap, ap.parse_args(argv)


def main(argv):
    ap, a = parse(argv)
    if a.worker:
        return worker_main(*a.worker)
    try:
        parts = {int(p) for p in a.parts.split(",") if p}
    except ValueError:
        parts = set()
    if not parts or not parts <= {1, 2, 3}:
        ap.error(f"--parts {a.parts}: give a comma-separated subset of 1, 2, 3")
    dtypes = [d for d in a.dtypes.split(",") if d]
    if not dtypes or any(d not in ("fp32", "bf16") for d in dtypes):
        ap.error(f"--dtypes {a.dtypes}: valid values are fp32, bf16 (comma-separated)")
    a.backends = [b for b in a.backends.split(",") if b]
    if not a.backends or any(b not in ("threads", "mpi", "gloo", "threads-py") for b in a.backends) \
            or len(set(a.backends)) != len(a.backends):
        ap.error(f"--backends {','.join(a.backends)}: give distinct values of threads, mpi, gloo, threads-py")
    if min(a.rounds, a.iters, a.seq, a.sp, a.comm_iters) < 1 or min(a.warmup, a.comm_warmup) < 0:
        ap.error("--rounds, --iters, --seq, --sp and --comm-iters must be positive, warm-ups non-negative")
    if (a.plain_fp32_iters is not None and a.plain_fp32_iters < 1) or \
            (a.plain_fp32_warmup is not None and a.plain_fp32_warmup < 0):
        ap.error("--plain-fp32-iters must be positive, --plain-fp32-warmup non-negative")
    if 2 in parts and a.torch_blas == "openblas" and not os.path.exists(OPENBLAS):
        ap.error(f"--torch-blas openblas needs {OPENBLAS}, which is not installed: apt-get install "
                 "libopenblas0-pthread, then set the system's alternatives back to the reference BLAS as "
                 "bench/block_vs_torch.py's docstring says, so that only the preload decides")
    if "openblas" in os.environ.get("LD_PRELOAD", ""):
        ap.error("LD_PRELOAD names OpenBLAS: run the driver without it (--torch-blas openblas preloads it "
                 "into the plain PyTorch worker alone)")
    if 3 in parts and "mpi" in a.backends and not shutil.which("mpirun"):
        ap.error("--backends mpi needs mpirun on the PATH (apt-get install openmpi-bin), or leave mpi out")

    cores = len(os.sched_getaffinity(0))
    os.environ["OMP_NUM_THREADS"] = str(cores)  # this process's module and torch: every usable core
    try:
        import torch
        import laga
        import laga.torch  # noqa: F401
    except ImportError as e:
        ap.error(f"cannot import torch and laga ({e}): run under /usr/bin/python3 with PYTHONPATH=build/python")
    torch.set_num_threads(cores)
    if a.laga is None:
        a.laga = laga._binary()
    if 3 in parts and not os.access(a.laga, os.X_OK):
        ap.error(f"--laga {a.laga} is not an executable")
    try:
        config = laga.Config.preset(a.model)
        config.to_dict(seq=a.seq, form=a.form, sp=1, kernel=a.kernel)
        if 3 in parts:
            config.to_dict(seq=a.seq, form=a.form, sp=a.sp, kernel=a.kernel)
    except ValueError as e:
        ap.error(str(e))

    info = machine()
    plain_env = dict(os.environ, OMP_NUM_THREADS=str(cores), OPENBLAS_NUM_THREADS=str(cores))
    if a.torch_blas == "openblas":
        plain_env["LD_PRELOAD"] = OPENBLAS + (":" + plain_env["LD_PRELOAD"] if plain_env.get("LD_PRELOAD") else "")
    loads = [os.getloadavg()[0]]
    status = 0
    local, B = {}, None
    with tempfile.TemporaryDirectory(prefix="torch_module.") as tmp:
        try:
            laga_isa, laga_commit = laga_machine(tmp)
            if parts & {1, 2}:
                local = run_local(a, dtypes, parts, cores, tmp, plain_env)
            loads.append(os.getloadavg()[0])
            if 3 in parts:
                B = run_backends(a, cores, tmp)
            loads.append(os.getloadavg()[0])
        except Failed as e:
            sys.stderr.write(f"torch_module: {e}\n")
            return e.status
        except subprocess.TimeoutExpired as e:
            sys.stderr.write(f"torch_module: {' '.join(e.cmd)} ran past --subprocess-timeout "
                             f"{a.subprocess_timeout} s\n")
            return 1
    module_blas = mapped_blas()

    flags = " ".join(("" if on else "-") + f for f, on in info["flags"].items())
    isa = ", ".join(f"{k} {v}" for k, v in (laga_isa or {}).items())
    plain_info = next((L.plain_info for L in local.values() if L.plain_info), None)
    print(f"# torch_module: laga.torch.MLABlock against laga bench, plain PyTorch and across communicators "
          f"(torch {torch.__version__})")
    print(f"# machine: {info['host']}, {info['cpu']}, {info['cores']} usable of {info['online_cores']} cores; "
          f"ISA: LAGA_MAX_ISA {info['laga_max_isa']}, cpu flags {flags}; laga: {isa or 'unknown'}")
    print(f"# commit {info['commit']} (laga build {laga_commit or 'unknown'}); torch BLAS built {torch_blas_built()}, "
          f"mapped: module process {module_blas}"
          + (f", plain process {plain_info['blas_mapped']} (--torch-blas {a.torch_blas})" if plain_info else ""))
    print(f"# model {a.model}, T {a.seq}, B 1, 1 layer, kernel {a.kernel}, form {a.form}"
          + (f"; parts 1, 2: P 1, dtypes {','.join(dtypes)}, {cores} threads (torch.set_num_threads, "
             f"OMP_NUM_THREADS; bench: its rank's)" if parts & {1, 2} else "")
          + (f"; part 3: P {a.sp}, dtype {a.comm_dtype}" if 3 in parts else ""))
    print(f"# {a.rounds} alternating rounds (the first side rotates), {a.iters} timed iterations after "
          f"{a.warmup} warm-up per side and round; a side's time: the median over rounds of each round's median "
          f"fwd + bwd, [min, max] over every iteration")
    print(f"# OpenMP: OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'unset')}, GOMP_SPINCOUNT "
          f"{os.environ.get('GOMP_SPINCOUNT', 'unset')} (with another process busy on a core, spinning "
          f"waits can slow one side far more than another: compare only runs on a quiet machine)")
    print(f"# noise: 1-minute load average {min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} cores")
    out = {"benchmark": "torch_module", "machine": info, "laga_isa": laga_isa, "laga_commit": laga_commit,
           "torch": {"version": torch.__version__, "blas_built": torch_blas_built(), "module_process": module_blas,
                     "plain_process": plain_info},
           "config": {k: v for k, v in vars(a).items() if k != "worker"}, "threads": cores, "load_average": loads}
    ok = True
    if local:
        rows1, rows2, good = report_local(local, parts, a)
        ok &= good
        out["binding"], out["plain"] = rows1, rows2
        out["samples"] = {d: L.samples for d, L in local.items()}
    if B is not None:
        rows, comm_rows, good = report_backends(B, a)
        ok &= good
        out["backends"] = rows
        out["collectives"] = comm_rows
        out["backend_meta"] = B.meta
        out["module_p"] = B.module
    out["pass"] = ok
    print(f"# validation: {'pass' if ok else 'FAIL'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return status if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
