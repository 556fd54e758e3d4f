"""laga.plain, the plain PyTorch MLA, against the repository's PyTorch block models in float64.

tests/torch/mla_block_torch.py (dense) and dsa_block_torch.py (sparse) are the models laga's dumps are
checked with, sequence-first with laga's weight names; laga.plain is batch-first with Hugging Face's.
Each claim maps one set of random weights into both and compares y, dx and every weight gradient of
⟨dy, y⟩ (plus the scaled indexer loss for the sparse model) within 1e-12 of the largest value.
plain.py is loaded from its file: it needs no compiled extension.
"""
import importlib.util
import math
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))

import dsa_block_torch as dsa  # noqa: E402
import mla_block_torch as ref  # noqa: E402

_spec = importlib.util.spec_from_file_location("laga_plain", os.path.join(ROOT, "python", "laga", "plain.py"))
plain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plain)

TOL = 1e-12
F64 = torch.float64

# laga's weight names (the reference models') -> Hugging Face's (plain's), per layer
HF_NAME = {"attn_norm": "input_layernorm.weight", "wq_a": "self_attn.q_a_proj.weight",
           "q_norm": "self_attn.q_a_layernorm.weight", "wq_b": "self_attn.q_b_proj.weight",
           "wq": "self_attn.q_proj.weight", "wkv_a": "self_attn.kv_a_proj_with_mqa.weight",
           "kv_norm": "self_attn.kv_a_layernorm.weight", "wkv_b": "self_attn.kv_b_proj.weight",
           "wo": "self_attn.o_proj.weight", "indexer.wq_b": "self_attn.indexer.wq_b.weight",
           "indexer.wk": "self_attn.indexer.wk.weight", "indexer.k_norm": "self_attn.indexer.k_norm.weight",
           "indexer.k_norm_bias": "self_attn.indexer.k_norm.bias",
           "indexer.weights_proj": "self_attn.indexer.weights_proj.weight"}


def tiny(**over):
    """laga's tiny preset as config.json writes it (one layer), with overrides."""
    cfg = dsa._config(T=12, B=2, L=1, k=16, stage="sparse")
    cfg.update({"form": "explicit", **over})
    cfg["softmax_scale"] = ref.softmax_scale(cfg)
    return cfg


def weights(cfg, seed, sparse=False):
    """laga name -> float64 leaf (norms 1 + N(0, 0.1), biases N(0, 0.1), projections N(0, 1/fan_in))."""
    g = torch.Generator().manual_seed(seed)
    shapes = {**ref.layer_shapes(cfg), **ref.indexer_shapes(cfg)}
    out = {}
    for n, s in shapes.items():
        if n.endswith("_bias"):
            t = torch.randn(s, generator=g, dtype=F64) * 0.1
        elif len(s) == 1:
            t = 1 + torch.randn(s, generator=g, dtype=F64) * 0.1
        else:
            t = torch.randn(s, generator=g, dtype=F64) * s[1] ** -0.5
        out[n] = t.requires_grad_(True)
    return out


def plain_block(cfg, w, sparse=None):
    blk = plain.MLABlock(cfg, sparse=sparse).to(F64)
    blk.load_state_dict({HF_NAME[n]: t.detach() for n, t in w.items()}, strict=True)
    return blk


def rel_diff(a, b):
    return float((a - b).abs().max() / b.abs().max())


def compare(pairs):
    """Worst relative difference over (name, plain, reference) pairs; fails naming the tensor."""
    worst = 0.0
    for name, a, b in pairs:
        assert a is not None, f"{name}: plain has no gradient"
        d = rel_diff(a, b)
        assert d <= TOL, f"{name}: max |plain - reference| / max |reference| = {d:.3e} > {TOL:g}"
        worst = max(worst, d)
    return worst


def inputs(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    T, B, D = cfg["seq_len"], cfg["batch"], cfg["hidden_size"]
    return torch.randn(T, B, D, generator=g, dtype=F64), torch.randn(T, B, D, generator=g, dtype=F64)


VARIANTS = {
    "tiny": {},
    "rotate-half": {"rope_interleaved": False},
    "q_lora_rank-0": {"q_lora_rank": 0, "index_n_heads": 0, "index_head_dim": 0, "index_topk": 0},
    "no-yarn": {"rope_scaling": None},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_block_equals_mla_block_torch_fp64(variant):
    cfg = tiny(**VARIANTS[variant])
    w = weights(cfg, 1)
    x_tb, dy_tb = inputs(cfg, 2)  # [T, B, D]

    x_ref = x_tb.clone().requires_grad_(True)
    layer_w = {n: t for n, t in w.items() if n in ref.layer_shapes(cfg)}
    y_ref = ref.Block(cfg, cfg["seq_len"], F64).layer(x_ref, layer_w)
    y_ref.backward(dy_tb)

    blk = plain_block(cfg, w)
    x = x_tb.transpose(0, 1).clone().requires_grad_(True)  # [B, T, D]
    y = blk(x)
    y.backward(dy_tb.transpose(0, 1))

    params = dict(blk.named_parameters())
    pairs = [("y", y.transpose(0, 1), y_ref), ("dx", x.grad.transpose(0, 1), x_ref.grad)]
    pairs += [(HF_NAME[n] + ".grad", params[HF_NAME[n]].grad, t.grad) for n, t in layer_w.items()]
    worst = compare(pairs)
    print(f"{variant}: y, dx and {len(pairs) - 2} gradients, worst rel {worst:.2e} <= {TOL:g}")


def test_attention_plus_residual_equals_block():
    cfg = tiny()
    blk = plain_block(cfg, weights(cfg, 3))
    attn = plain.MultiheadLatentAttention(cfg).to(F64)
    attn.load_state_dict(blk.self_attn.state_dict())
    norm = plain.RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"]).to(F64)
    norm.load_state_dict(blk.input_layernorm.state_dict())
    x = torch.randn(2, cfg["seq_len"], cfg["hidden_size"], dtype=F64)
    assert torch.equal(attn(norm(x)) + x, blk(x))


@pytest.mark.parametrize("stage", dsa.STAGES)
def test_sparse_block_equals_dsa_block_torch_fp64(stage):
    cfg = tiny(form="dsa-gather", seq_len=24, index_topk=8, indexer_stage=stage, indexer_loss_scale=0.5)
    T = cfg["seq_len"]
    w = weights(cfg, 4)
    x_tb, dy_tb = inputs(cfg, 5)

    x_ref = x_tb.clone().requires_grad_(True)
    model = dsa.SparseBlock(cfg, T, F64, [None])  # selects from its own float64 scores
    y_ref, losses, _ = model.forward(x_ref, [w])
    torch.autograd.backward([y_ref, sum(losses)], [dy_tb, torch.tensor(cfg["indexer_loss_scale"], dtype=F64)])

    blk = plain_block(cfg, w)
    assert blk.self_attn.sparse
    x = x_tb.transpose(0, 1).clone().requires_grad_(True)
    y = blk(x)
    y.backward(dy_tb.transpose(0, 1))

    d = abs(float(blk.self_attn.indexer_loss) - float(losses[0])) / abs(float(losses[0]))
    assert d <= TOL, f"indexer loss: plain {float(blk.self_attn.indexer_loss)!r}, reference {float(losses[0])!r}"
    params = dict(blk.named_parameters())
    pairs = [("y", y.transpose(0, 1), y_ref), ("dx", x.grad.transpose(0, 1), x_ref.grad)]
    pairs += [(HF_NAME[n] + ".grad", params[HF_NAME[n]].grad, t.grad) for n, t in w.items()]
    compare(pairs)
    if stage == "sparse":  # the selection is a real one: some query leaves keys out
        assert T > cfg["index_topk"]


def test_warmup_main_attention_equals_the_dense_block():
    """At warmup every s ≤ t is a candidate: the absorbed MQA equals the explicit form's attention."""
    cfg = tiny(form="dsa-gather", indexer_stage="warmup")
    w = weights(cfg, 6)
    x = torch.randn(2, cfg["seq_len"], cfg["hidden_size"], dtype=F64)
    assert rel_diff(plain_block(cfg, w)(x), plain_block(cfg, w, sparse=False)(x)) <= TOL


def test_dense_form_keeps_the_indexer_unused():
    cfg = tiny()  # the tiny preset has an indexer; form explicit is dense
    blk = plain.MLABlock(cfg)
    assert not blk.self_attn.sparse
    blk(torch.randn(1, 8, cfg["hidden_size"])).sum().backward()
    assert all(p.grad is None for n, p in blk.named_parameters() if ".indexer." in n)


def test_parameters_carry_hugging_face_names():
    cfg = tiny()
    names = [n for n, _ in plain.MLABlock(cfg).named_parameters()]
    assert names == ["input_layernorm.weight", "self_attn.q_a_proj.weight", "self_attn.q_a_layernorm.weight",
                     "self_attn.q_b_proj.weight", "self_attn.kv_a_proj_with_mqa.weight",
                     "self_attn.kv_a_layernorm.weight", "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight",
                     "self_attn.indexer.wq_b.weight", "self_attn.indexer.wk.weight",
                     "self_attn.indexer.k_norm.weight", "self_attn.indexer.k_norm.bias",
                     "self_attn.indexer.weights_proj.weight"]
    cfg0 = tiny(**VARIANTS["q_lora_rank-0"])
    names0 = [n for n, _ in plain.MultiheadLatentAttention(cfg0).named_parameters()]
    assert names0 == ["q_proj.weight", "kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight",
                      "o_proj.weight"]
    assert not any(n for n, _ in plain.MLABlock(cfg0).named_buffers())


def test_shifted_positions_give_the_same_attention():
    """RoPE's dot products depend on relative positions only, so shifting every position changes nothing."""
    cfg = tiny()
    attn = plain.MultiheadLatentAttention(cfg).to(F64)
    B, T = 2, cfg["seq_len"]
    x = torch.randn(B, T, cfg["hidden_size"], dtype=F64)
    y0 = attn(x)
    shifted = torch.arange(T) + 1000
    assert rel_diff(attn(x, shifted), y0) <= 1e-10
    assert torch.equal(attn(x, shifted[None].expand(B, T)), attn(x, shifted))


def test_causal():
    cfg = tiny()
    blk = plain.MLABlock(cfg).to(F64)
    x = torch.randn(2, 10, cfg["hidden_size"], dtype=F64)
    x2 = x.clone()
    x2[:, 6:] = torch.randn(2, 4, cfg["hidden_size"], dtype=F64)
    assert torch.equal(blk(x)[:, :6], blk(x2)[:, :6])


def test_config_object_and_init_std():
    cfg = tiny()

    class Config:
        def to_dict(self):
            return cfg

    blk = plain.MLABlock(Config(), init_std=0.02)
    w = blk.self_attn.kv_b_proj.weight
    assert abs(float(w.std()) - 0.02) < 0.005
    assert torch.equal(blk.self_attn.kv_a_layernorm.weight, torch.ones(cfg["kv_lora_rank"]))
    assert blk.self_attn.scale == cfg["softmax_scale"]
    del cfg["softmax_scale"]
    assert math.isclose(plain.MultiheadLatentAttention(cfg).scale, ref.softmax_scale(cfg), rel_tol=1e-15)


def test_bad_inputs_raise_value_error():
    cfg = tiny()
    attn = plain.MultiheadLatentAttention(cfg)
    with pytest.raises(ValueError, match=r"expected \[B, T, 64\]"):
        attn(torch.randn(4, cfg["hidden_size"]))
    with pytest.raises(ValueError, match="positions"):
        attn(torch.randn(1, 4, cfg["hidden_size"]), torch.arange(5))
    with pytest.raises(TypeError):
        plain.MLABlock([1, 2])
