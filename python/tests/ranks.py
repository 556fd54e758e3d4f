"""Runs a function on P gloo processes (torch.multiprocessing, spawn) and returns what each rank
returned or raised, within a deadline: a rank still running at the deadline is killed and reported
as hung, so a test never waits forever."""

import os
import pickle
import socket
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, fn, size, port, out_dir, args):
    # The ranks share the cores: one thread each, as laga's MPI launcher gives them.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    result = None
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=size)
        result = ("ok", fn(rank, size, *args))
    except BaseException as e:  # reported to the test, never swallowed
        result = ("error", type(e).__name__, str(e), traceback.format_exc())
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    if result[0] == "ok" and dist.is_initialized():
        dist.barrier()  # rank 0 holds the store: it leaves last
        dist.destroy_process_group()
    # A failed rank leaves at once: gloo's teardown may wait on peers that are gone.
    os._exit(0)


def run_ranks(size, fn, *args, timeout=120):
    """[result of rank r]: ("ok", value) | ("error", type name, message, traceback) | ("hung",).
    One rank runs in this process, without torch.distributed."""
    if size == 1:
        try:
            return [("ok", fn(0, 1, *args))]
        except Exception as e:
            return [("error", type(e).__name__, str(e), traceback.format_exc())]
    with tempfile.TemporaryDirectory(prefix="laga-ranks-") as out_dir:
        ctx = mp.start_processes(_worker, args=(fn, size, _free_port(), out_dir, args),
                                 nprocs=size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(not p.is_alive() for p in ctx.processes):
                break
            time.sleep(0.05)
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join()
        results = []
        for r in range(size):
            path = os.path.join(out_dir, f"rank{r}.pkl")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    results.append(pickle.load(f))
            else:
                results.append(("hung",))
        return results


def values(results):
    """Each rank's value; fails naming the first rank that raised or hung."""
    for r, res in enumerate(results):
        assert res[0] == "ok", f"rank {r}: {res[1:] if len(res) > 1 else 'hung'}" + (
            "\n" + res[3] if res[0] == "error" else "")
    return [res[1] for res in results]
