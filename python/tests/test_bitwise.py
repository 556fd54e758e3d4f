"""laga.torch's modules give the engine's bits: for every registered form, fp32 and bf16, fused
and eager where the form runs the config's kernel, at P 1, 2 and 4 (gloo processes), the module's
y, dx and every parameter's gradient equal `laga run --dump`'s bit for bit, given that dump's
weights, x and dy. Batch-first and sequence-first inputs alternate between cases."""

import os

import pytest
import torch
import torch.distributed as dist

import laga
import laga.torch as lt
from dumps import dump
from ranks import run_ranks, values

SEQ, BATCH = 32, 2


def cases(size):
    out = []
    for f in laga.forms():
        for dtype in ("fp32", "bf16"):
            for kernel in (("fused",) if f["own_kernel"] else ("fused", "eager")):
                extra = {"ulysses": 2} if f["takes_ulysses"] and size >= 4 else {}
                out.append(dict(form=f["name"], dtype=dtype, kernel=kernel, **extra))
    return out


def _flags(case, size):
    flags = ["--model", "tiny", "--seq", str(SEQ), "--batch", str(BATCH), "--sp", str(size),
             "--form", case["form"], "--dtype", case["dtype"], "--kernel", case["kernel"]]
    if "ulysses" in case:
        flags += ["--ulysses", str(case["ulysses"])]
    return flags


def _check_rank(rank, size, work):
    mismatches = []
    for i, (case, d) in enumerate(work):
        from dumps import read_safetensors  # noqa: F401  (spawned processes import afresh)
        tensors = torch.load(os.path.join(d, "tensors.pt"))
        dtype = torch.float32 if case["dtype"] == "fp32" else torch.bfloat16
        config = laga.Config.preset("tiny")
        seq_first = i % 2 == 1
        module = lt.MLABlock(config, form=case["form"], kernel=case["kernel"],
                             ulysses=case.get("ulysses"), sequence_first=seq_first,
                             group=dist.group.WORLD if size > 1 else None, dtype=dtype)
        names = {n: k for n, k, _ in laga._C.weights(config.flags(seq=SEQ))}
        # A dump holds every tensor in fp32 (a bf16 run's values widened exactly).
        module.load_state_dict({names[n]: tensors[f"layers.0.{n}"].to(dtype) for n in names})

        def local(name):  # this rank's rows of a whole [T, B, D] tensor, in the module's layout
            t = lt.shard(tensors[name], case["form"], rank, size, config=config,
                         ulysses=case.get("ulysses"), sequence_first=True)
            t = t.to(dtype)
            return t if seq_first else t.transpose(0, 1).contiguous()

        x = local("x").requires_grad_(True)
        y = module(x)
        y.backward(local("dy"))
        got = {"y": y.detach(), "dx": x.grad}
        want = {"y": local("y"), "dx": local("dx")}  # in the module's dtype: exact
        for n, k in names.items():
            got[n + ".grad"] = module.get_parameter(k).grad
            want[n + ".grad"] = tensors[f"layers.0.{n}.grad"].to(dtype)
        for n in want:
            if got[n] is None or got[n].dtype != dtype or not torch.equal(got[n], want[n]):
                diff = (got[n].double() - want[n].double()).abs().max().item() if (
                    got[n] is not None and got[n].shape == want[n].shape) else "shape"
                mismatches.append(f"{case} {n}: max |diff| {diff}")
    return mismatches


@pytest.mark.parametrize("size", [1, 2, 4])
def test_module_equals_the_engines_dump_bit_for_bit(size, tmp_path):
    work = []
    for i, case in enumerate(cases(size)):
        d = str(tmp_path / f"case{i}")
        _, tensors = dump(d, _flags(case, size))
        torch.save(tensors, os.path.join(d, "tensors.pt"))
        work.append((case, d))
    mismatches = values(run_ranks(size, _check_rank, work, timeout=600))
    bad = [m for r, ms in enumerate(mismatches) for m in ms]
    assert not bad, f"{len(bad)} mismatches at P {size}:\n" + "\n".join(bad[:20])
