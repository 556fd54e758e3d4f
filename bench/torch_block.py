"""The MLA block stack in PyTorch eager, as a PyTorch user writes it: the baseline of the block benchmark.

Holds: the timing of y = x + MLA(RMSNorm(x)) per layer (docs/design.md §1–§2, explicit form, one
rank), sequence-first [T, B, D], in fp32 or bf16, with torch ops and autograd. The block is the
repository's one PyTorch block, tests/torch/mla_block_torch.py's Block (the reference of the dump
check): every projection torch.nn.functional.linear, RMSNorm by hand (Hugging Face's DeepSeek style:
the statistics in fp32, the result cast back), RoPE with YaRN per docs/design.md §1.1 over global
positions 0..T-1 (interleaved pairs or rotate-half), and causal attention in PyTorch's math style with
the scores materialised: scores = q @ k^T * scale, masked_fill(-inf), softmax (in fp32, cast back, as
Hugging Face does), @ v. It times forward and backward, and checks against a laga dump that it
computes the same function.

Not here: torch.nn.functional.scaled_dot_product_attention (PyTorch 2.0+; Debian's torch is 1.13,
which does not have it), torch.compile, any fused or hand-written kernel: the baseline is eager.
The math is derived in docs/block.md; how the benchmark is run and read: docs/benchmarks.md.

Usage (Debian's torch imports only under /usr/bin/python3):
  torch_block.py --model small --seq 2048 --dtype bf16 --threads 2 --iters 3 --warmup 1 [--json F]
  torch_block.py --check DIR     the laga dump DIR (laga run ... --dump DIR) gives the same y, dx
                                 and weight gradients; exit 1 if not
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "torch"))
from mla_block_torch import Block, layer_shapes, read_safetensors, softmax_scale  # noqa: E402

# --------------------------------------------------------------------------------------------
# Configuration: the presets of src/mla/config.cpp, or a laga config.json (docs/design.md §1.1 keys).

PRESETS = {
    #                  D     H    Lq    Lkv  Dn   Dr  Dv
    "deepseek-v3": (7168, 128, 1536, 512, 128, 64, 128),
    "deepseek-v2-lite": (2048, 16, 0, 512, 128, 64, 128),
    "small": (1024, 16, 512, 512, 128, 64, 128),
    "tiny": (64, 8, 48, 32, 16, 8, 12),
}


def preset_config(model, seq, batch, layers, dtype):
    D, H, Lq, Lkv, Dn, Dr, Dv = PRESETS[model]
    mscale = 0.707 if model == "deepseek-v2-lite" else 1.0
    return {
        "model": model, "hidden_size": D, "num_attention_heads": H, "q_lora_rank": Lq,
        "kv_lora_rank": Lkv, "qk_nope_head_dim": Dn, "qk_rope_head_dim": Dr, "v_head_dim": Dv,
        "num_layers": layers, "seq_len": seq, "batch": batch, "dtype": dtype,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_interleaved": True,
        "rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": mscale, "mscale_all_dim": mscale},
    }


# --------------------------------------------------------------------------------------------
# Benchmark.


def random_weights(cfg, dtype, gen):
    """Norms 1 + N(0, 0.1), projections N(0, 1/fan_in), as laga's init_weights (not its values)."""
    out = []
    for _ in range(cfg["num_layers"]):
        w = {}
        for n, s in layer_shapes(cfg).items():
            if len(s) == 1:
                t = 1.0 + 0.1 * torch.randn(s, generator=gen)
            else:
                t = torch.randn(s, generator=gen) / math.sqrt(s[1])
            w[n] = t.to(dtype).requires_grad_(True)
        out.append(w)
    return out


def bench(cfg, threads, warmup, iters):
    torch.set_num_threads(threads)
    dtype = torch.bfloat16 if cfg["dtype"] == "bf16" else torch.float32
    T, B, D = cfg["seq_len"], cfg["batch"], cfg["hidden_size"]
    gen = torch.Generator().manual_seed(1234)
    weights = random_weights(cfg, dtype, gen)
    x = torch.randn(T, B, D, generator=gen).to(dtype).requires_grad_(True)
    dy = torch.randn(T, B, D, generator=gen).to(dtype)
    block = Block(cfg, T, dtype)
    params = [p for w in weights for p in w.values()]
    fwd, bwd = [], []
    for it in range(warmup + iters):
        x.grad = None
        for p in params:
            p.grad = None
        t0 = time.perf_counter()
        y = block.forward(x, weights)
        t1 = time.perf_counter()
        y.backward(dy)
        t2 = time.perf_counter()
        for name, t in [("y", y), ("dx", x.grad)] + [(f"grad {i}", p.grad) for i, p in enumerate(params)]:
            if t is None or not bool(torch.isfinite(t).all()):
                raise SystemExit(f"torch_block: {name} is missing or not finite")
        del y
        if it >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return fwd, bwd


# --------------------------------------------------------------------------------------------
# --check DIR: the same function as laga's, on a laga dump.


def check(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    # float32 values: laga dumps F32 or BF16, both exact in float32
    t = read_safetensors(os.path.join(d, "tensors.safetensors"))
    t = {n: a.astype(np.float32) for n, a in t.items()}
    if not math.isclose(softmax_scale(cfg), cfg["softmax_scale"], rel_tol=1e-9):
        raise SystemExit(f"{d}: softmax_scale {cfg['softmax_scale']} differs from the formula's {softmax_scale(cfg)}")
    # The benchmarked code path, in fp32 (a bf16 dump is widened: same values, wider arithmetic).
    leaf = lambda a: torch.from_numpy(a.copy()).requires_grad_(True)
    L, T = cfg["num_layers"], cfg["seq_len"]
    weights = [{n: leaf(t[f"layers.{l}.{n}"]) for n in layer_shapes(cfg)} for l in range(L)]
    x = leaf(t["x"])
    y = Block(cfg, T, torch.float32).forward(x, weights)
    y.backward(torch.from_numpy(t["dy"].copy()))
    got = {"y": y, "dx": x.grad}
    for l in range(L):
        for n, p in weights[l].items():
            got[f"layers.{l}.{n}.grad"] = p.grad
    bf16 = cfg["dtype"] in ("bf16", "bfloat16")
    tol = 3e-2 if bf16 else 1e-4  # relative to the tensor's max |value|; bf16 storage has 8 bits
    wrong = 0
    print(f"# torch_block --check {d}: model {cfg.get('model')}, dtype {cfg['dtype']}, T {T}, "
          f"B {cfg['batch']}, layers {L}; pass: max|torch - laga| <= {tol:g} * max|laga|")
    print(f"# {'tensor':<24} {'max_abs_diff':>12} {'max_abs':>12} {'rel':>10}  ok")
    for n, v in got.items():
        if n not in t:
            if n in ("y", "dx"):
                raise SystemExit(f"{d}: the dump has no tensor {n}")
            continue
        ref = t[n]
        diff = float(np.max(np.abs(v.detach().numpy() - ref)))
        mref = float(np.max(np.abs(ref)))
        rel = diff / mref if mref > 0 else diff
        ok = rel <= tol and np.isfinite(rel)
        wrong += not ok
        print(f"  {n:<24} {diff:12.4e} {mref:12.4e} {rel:10.3e}  {'yes' if ok else 'NO'}")
    print(f"# wrong: {wrong}")
    return 1 if wrong else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="small", choices=sorted(PRESETS))
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--json", help="write the per-iteration times here")
    ap.add_argument("--check", metavar="DIR", help="compare with a laga dump instead of timing")
    a = ap.parse_args()
    if a.check:
        return check(a.check)
    if a.seq <= 0 or a.batch <= 0 or a.layers <= 0 or a.iters <= 0 or a.warmup < 0 or a.threads <= 0:
        ap.error("--seq, --batch, --layers, --iters and --threads must be positive, --warmup non-negative")
    cfg = preset_config(a.model, a.seq, a.batch, a.layers, a.dtype)
    fwd, bwd = bench(cfg, a.threads, a.warmup, a.iters)
    tot = [f + b for f, b in zip(fwd, bwd)]
    res = {"impl": "torch-eager", "torch": torch.__version__, "threads": torch.get_num_threads(),
           "config": cfg, "fwd_s": fwd, "bwd_s": bwd, "total_s": tot,
           "median_fwd_s": statistics.median(fwd), "median_bwd_s": statistics.median(bwd),
           "median_total_s": statistics.median(tot)}
    print(f"# torch {torch.__version__} eager, {res['threads']} threads, {a.model} T {a.seq} B {a.batch} "
          f"L {a.layers} {a.dtype}: {a.iters} iters after {a.warmup} warm-up")
    print(f"# {'fwd_s':>10} {'bwd_s':>10} {'total_s':>10}")
    print(f"  {res['median_fwd_s']:10.4f} {res['median_bwd_s']:10.4f} {res['median_total_s']:10.4f}  (median)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
