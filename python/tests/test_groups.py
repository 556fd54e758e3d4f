"""laga.torch over a gloo group: bad input raises a clear error on every rank and leaves no rank
hanging; grad_reduction="none" leaves partials whose sum over ranks (in rank order, fp32) is the
"sum" gradient bit for bit; the ledger records the collectives with the CLI's bytes."""

import pytest
import torch
import torch.distributed as dist

import laga
import laga.torch as lt
from ranks import run_ranks, values

SEQ = 32


def _block(form="laga", **kw):
    torch.manual_seed(0)
    return lt.MLABlock(laga.Config.preset("tiny"), form=form, group=dist.group.WORLD, **kw)


def _bad_shape_on_rank_1(rank, size):
    block = _block()
    x = torch.randn(1, SEQ // size, 64 if rank == 0 else 65)
    block(x)


def _bad_dtype(rank, size):
    _block()(torch.randn(1, SEQ // size, 64, dtype=torch.float64))


def _heads_not_divided(rank, size):
    _block()  # tiny has 8 heads: 3 ranks cannot scatter them


def _unknown_form(rank, size):
    _block(form="laga-turbo")


def _two_dims(rank, size):
    _block()(torch.randn(SEQ // size, 64))


@pytest.mark.parametrize("fn,size,words", [
    (_bad_shape_on_rank_1, 2, ["65", "hidden_size 64"]),
    (_bad_dtype, 2, ["float64", "float32"]),
    (_heads_not_divided, 3, ["--sp 3", "8"]),
    (_unknown_form, 2, ["laga-turbo", "laga-recompute"]),
    (_two_dims, 2, ["[16, 64]", "[B, N, D]"]),
])
def test_bad_input_raises_on_every_rank_and_none_hangs(fn, size, words):
    results = run_ranks(size, fn, timeout=90)
    assert all(r[0] == "error" for r in results), results
    # The rank with the bad input names it; the others say the group went down because of it.
    named = [r for r in results if all(w in r[2] for w in words)]
    assert named, [r[2] for r in results]


def _partials_sum_to_the_whole(rank, size):
    out = {}
    for reduction in ("sum", "none"):
        block = _block(form="laga", grad_reduction=reduction)
        x = lt.shard(torch.randn(2, SEQ, 64, generator=torch.Generator().manual_seed(1)), "laga",
                     rank, size, config=block.config)
        block(x).backward(torch.ones_like(x))
        out[reduction] = {n: p.grad.clone() for n, p in block.named_parameters()}
    mismatched = []
    for n, g in out["none"].items():
        parts = [torch.empty_like(g) for _ in range(size)]
        dist.all_gather(parts, g)
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        if not torch.equal(total, out["sum"][n]):
            mismatched.append(n)
    return mismatched


@pytest.mark.parametrize("size", [2, 4])
def test_partial_gradients_sum_to_the_reduced_ones(size):
    for mismatched in values(run_ranks(size, _partials_sum_to_the_whole)):
        assert not mismatched


def _ledger(rank, size):
    block = _block(form="laga")
    x = torch.randn(1, SEQ // size, 64)
    block(x).sum().backward()
    return block.ledger()


def test_ledger_records_what_the_cli_records(tmp_path):
    import json
    import subprocess
    got = values(run_ranks(2, _ledger))[0]
    path = str(tmp_path / "run.json")
    subprocess.run([laga._binary(), "run", "--model", "tiny", "--seq", str(SEQ), "--sp", "2",
                    "--form", "laga", "--dtype", "fp32", "--json", path], check=True,
                   stdout=subprocess.DEVNULL)
    with open(path) as f:
        want = json.load(f)["ranks"][0]["comm"]
    key = lambda r: (r["op"], r["tensor"], r["dtype"], r["tensor_bytes"], r["wire_bytes"])
    assert [key(r) for r in got if r["tensor"] != "grad_sync"] == [
        key(r) for r in want["collectives"]]
    assert any(r["tensor"] == "grad_sync" and r["op"] == "all_reduce" for r in got)


def _overlap_on_and_off(rank, size):
    differ = []
    for form in ("explicit", "laga", "laga-recompute", "ring-latent", "dsa-gather"):
        got = []
        for overlap in (False, True):
            block = _block(form=form, overlap=overlap)
            x = lt.shard(torch.randn(1, SEQ, 64, generator=torch.Generator().manual_seed(2)),
                         form, rank, size, config=block.config).requires_grad_(True)
            y = block(x)
            y.backward(torch.ones_like(y))
            got.append([y.detach(), x.grad] + [p.grad for p in block.parameters()])
        if not all(torch.equal(a, b) for a, b in zip(*got)):
            differ.append(form)
    return differ


def test_overlap_on_gives_the_same_bits_over_gloo():
    for differ in values(run_ranks(2, _overlap_on_and_off)):
        assert not differ


def test_laga_memory_torch_holds_is_released_when_torch_drops_it():
    import gc
    block = lt.MLABlock(laga.Config.preset("tiny"), form="laga", sequence_first=True)
    group = block._group
    before = group.live_bytes()
    x = torch.randn(SEQ, 2, 64, requires_grad=True)
    y = block(x)  # y and the saved activations are laga's
    assert group.live_bytes() > before
    y.backward(torch.ones_like(y))  # saved state released; dx and the gradients are laga's
    held = group.live_bytes()
    assert held > before
    assert held - before == sum(p.grad.numel() * 4 for p in block.parameters()) + 2 * y.numel() * 4
    del y
    x.grad = None
    block.zero_grad(set_to_none=True)
    gc.collect()
    assert group.live_bytes() == before


def _unshard_of_shard(rank, size):
    wrong = []
    for form in ("laga", "ring-kv", "dsa-gather", "laga-ulysses"):
        for dtype in (torch.float32, torch.bfloat16):
            for seq_first in (False, True):
                x = torch.randn(3, SEQ, 64, generator=torch.Generator().manual_seed(3)).to(dtype)
                if seq_first:
                    x = x.transpose(0, 1).contiguous()
                config = laga.Config.preset("tiny")
                ulysses = 2 if form == "laga-ulysses" else None
                local = lt.shard(x, form, rank, size, config=config, ulysses=ulysses,
                                 sequence_first=seq_first)
                back = lt.unshard(local, form, dist.group.WORLD, config=config, ulysses=ulysses,
                                  sequence_first=seq_first)
                if not torch.equal(back, x):
                    wrong.append((form, dtype, seq_first))
    return wrong


def test_unshard_inverts_shard_for_every_layout():
    for wrong in values(run_ranks(4, _unshard_of_shard)):
        assert not wrong


def test_local_positions_cover_the_sequence_once_in_each_layout():
    for form, size, ulysses in (("laga", 4, None), ("ring-kv", 4, None), ("laga-ulysses", 8, 2)):
        held = [lt.local_positions(form, 64, r, size, ulysses=ulysses) for r in range(size)]
        assert sorted(p for h in held for p in h) == list(range(64))
    assert lt.local_positions("laga", 64, 1, 4) == list(range(16, 32))
    assert lt.local_positions("ring-kv", 64, 1, 4) == list(range(8, 16)) + list(range(48, 56))
