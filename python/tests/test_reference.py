"""laga.torch's modules against a plain PyTorch MLA (laga.plain, autograd) in fp64 on the same
state dict, at P 1 and 2: per tensor (y, dx, every weight gradient), a form's fp32 error against
the fp64 result is within verify's rule, twice the error of the plain MLA run in fp32 plus a few
fp32 ulps of the tensor's scale."""

import pytest
import torch
import torch.distributed as dist

import laga
import laga.plain
import laga.torch as lt
from ranks import run_ranks, values

SEQ, BATCH = 32, 2
FORMS = ["explicit", "absorbed-shared", "laga", "laga-fused", "ring-kv", "dsa-gather"]


def _errors(rank, size, form, attention_only):
    torch.manual_seed(0)
    config = laga.Config.preset("tiny")
    kind = lt.MultiheadLatentAttention if attention_only else lt.MLABlock
    module = kind(config, form=form, group=dist.group.WORLD if size > 1 else None)
    sparse = any(f["sparse"] for f in laga.forms() if f["name"] == form)
    cfg = config.to_dict(seq=SEQ, form=form)
    plain_kind = laga.plain.MultiheadLatentAttention if attention_only else laga.plain.MLABlock
    plain = {dt: plain_kind(cfg, sparse=sparse).to(dt) for dt in (torch.float64, torch.float32)}
    for p in plain.values():
        p.load_state_dict(module.state_dict())
    x = torch.randn(BATCH, SEQ, 64, dtype=torch.float64)
    g = torch.randn(BATCH, SEQ, 64, dtype=torch.float64)

    def run(m, dtype, local):
        xi = (lt.shard(x, form, rank, size, config=config) if local else x).to(dtype)
        xi = xi.detach().clone().requires_grad_(True)
        y = m(xi)
        y.backward(lt.shard(g, form, rank, size, config=config).to(dtype) if local else g.to(dtype))
        out = {"y": y.detach(), "dx": xi.grad}
        for name, p in m.named_parameters():  # a dense form leaves the indexer's alone: zero
            out[name] = p.grad if p.grad is not None else torch.zeros_like(p)
        return {k: v.double() for k, v in out.items()}

    got = run(module, torch.float32, True)
    ref = {dt: run(m, dt, False) for dt, m in plain.items()}
    for k in ("y", "dx"):  # the plain results on this rank's tokens
        for dt in ref:
            ref[dt][k] = lt.shard(ref[dt][k], form, rank, size, config=config)
    out = {}
    for k, want in ref[torch.float64].items():
        scale = want.abs().max().item()
        out[k] = ((got[k] - want).abs().max().item(),
                  (ref[torch.float32][k] - want).abs().max().item(), scale)
    return out


def _all_errors(rank, size):
    return {(form, attention_only): _errors(rank, size, form, attention_only)
            for form in FORMS for attention_only in (False, True)}


@pytest.mark.parametrize("size", [1, 2])
def test_every_form_within_the_rule_of_the_plain_fp64_mla(size):
    bad = []
    for rank, cases in enumerate(values(run_ranks(size, _all_errors, timeout=300))):
        for (form, attention_only), errors in cases.items():
            for k, (err, base, scale) in errors.items():
                bound = 2 * base + 8 * torch.finfo(torch.float32).eps * scale
                if not err <= bound:
                    bad.append(f"rank {rank} {form} attention_only={attention_only} {k}: error "
                               f"{err:.3g} > {bound:.3g} (plain fp32 {base:.3g})")
    assert not bad, "\n".join(bad)
