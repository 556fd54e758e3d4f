"""The MLA block stack in PyTorch eager, as a PyTorch user writes it: the baseline of the block benchmark.

Holds: y = x + MLA(RMSNorm(x)) per layer (docs/design.md §1–§2, explicit form, one rank), sequence-first
[T, B, D], in fp32 or bf16, with torch ops and autograd: torch.nn.functional.linear for every
projection, RMSNorm by hand (Hugging Face's DeepSeek style: the statistics in fp32, the result cast
back), RoPE with YaRN per docs/design.md §1.1 over global positions 0..T-1 (interleaved pairs or rotate-half),
and causal attention in PyTorch's math style with the scores materialised: scores = q @ k^T * scale,
masked_fill(-inf), softmax (in fp32, cast back, as Hugging Face does), @ v. It times forward and
backward, and checks against a laga dump that it computes the same function.

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
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

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


def yarn_mscale(f, m):
    return 1.0 if f <= 1 else 0.1 * m * math.log(f) + 1.0


def softmax_scale(cfg):
    s = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    rs = cfg.get("rope_scaling")
    if rs:
        s *= yarn_mscale(rs["factor"], rs["mscale_all_dim"]) ** 2
    return s


def rope_tables(cfg, T):
    """cos, sin [T, Dr/2] in fp32 for positions 0..T-1, YaRN-corrected, attention factor folded in."""
    Dr, theta = cfg["qk_rope_head_dim"], float(cfg["rope_theta"])
    inv = [theta ** (-2.0 * i / Dr) for i in range(Dr // 2)]
    attn = 1.0
    rs = cfg.get("rope_scaling")
    if rs:
        f, L0 = rs["factor"], rs["original_max_position_embeddings"]
        corr = lambda n: Dr * math.log(L0 / (n * 2 * math.pi)) / (2 * math.log(theta))
        low = max(math.floor(corr(rs["beta_fast"])), 0)
        high = min(math.ceil(corr(rs["beta_slow"])), Dr - 1)
        if low == high:
            high += 0.001
        for i in range(Dr // 2):
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)
            inv[i] = inv[i] / f * ramp + inv[i] * (1 - ramp)
        attn = yarn_mscale(f, rs["mscale"]) / yarn_mscale(f, rs["mscale_all_dim"])
    angle = torch.arange(T, dtype=torch.float64)[:, None] * torch.tensor(inv, dtype=torch.float64)[None, :]
    return (torch.cos(angle) * attn).float(), (torch.sin(angle) * attn).float()


def layer_shapes(cfg):
    D, H, Lq, Lkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    Dn, Dr, Dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    s = {"attn_norm": [D]}
    if Lq > 0:
        s.update({"wq_a": [Lq, D], "q_norm": [Lq], "wq_b": [H * (Dn + Dr), Lq]})
    else:
        s["wq"] = [H * (Dn + Dr), D]
    s.update({"wkv_a": [Lkv + Dr, D], "kv_norm": [Lkv], "wkv_b": [H * (Dn + Dv), Lkv], "wo": [D, H * Dv]})
    return s


# --------------------------------------------------------------------------------------------
# The block.


def rmsnorm(x, w, eps):
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rope(x, cos, sin, interleaved):
    """x [T, ..., Dr]; cos, sin [T, Dr/2] (broadcast over the middle dims)."""
    shape = [cos.shape[0]] + [1] * (x.dim() - 2) + [cos.shape[1]]
    c, s = cos.view(shape), sin.view(shape)
    if interleaved:  # pairs (x[2i], x[2i+1]), DeepSeek's layout
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)
    h = x.shape[-1] // 2  # pairs (x[i], x[i + Dr/2])
    a, b = x[..., :h], x[..., h:]
    return torch.cat((a * c - b * s, a * s + b * c), dim=-1)


class Block:
    """Constant per-run state (RoPE tables, causal mask, scale), built once like a module's buffers."""

    def __init__(self, cfg, T, dtype):
        self.cfg, self.dtype = cfg, dtype
        cos, sin = rope_tables(cfg, T)
        self.cos, self.sin = cos.to(dtype), sin.to(dtype)
        self.mask = torch.ones(T, T, dtype=torch.bool).triu(1)  # True above the diagonal: future keys
        self.scale = softmax_scale(cfg)

    def layer(self, x, w):
        cfg = self.cfg
        T, B, _ = x.shape
        H, Lkv = cfg["num_attention_heads"], cfg["kv_lora_rank"]
        Dn, Dr, Dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        eps, inter = cfg["rms_norm_eps"], cfg["rope_interleaved"]

        xn = rmsnorm(x, w["attn_norm"], eps)
        if cfg["q_lora_rank"] > 0:
            q = F.linear(rmsnorm(F.linear(xn, w["wq_a"]), w["q_norm"], eps), w["wq_b"])  # L1-L3
        else:
            q = F.linear(xn, w["wq"])  # L3'
        q = q.view(T, B, H, Dn + Dr)
        q = torch.cat((q[..., :Dn], rope(q[..., Dn:], self.cos, self.sin, inter)), dim=-1)
        kv = F.linear(xn, w["wkv_a"])  # L4
        ckv = rmsnorm(kv[..., :Lkv], w["kv_norm"], eps)  # L5
        kpe = rope(kv[..., Lkv:], self.cos, self.sin, inter)  # L6
        kvb = F.linear(ckv, w["wkv_b"]).view(T, B, H, Dn + Dv)  # E1
        k = torch.cat((kvb[..., :Dn], kpe[:, :, None, :].expand(T, B, H, Dr)), dim=-1)
        v = kvb[..., Dn:]

        # E3, PyTorch's math style: [B, H, T, ·], scores materialised.
        qh, kh, vh = (t.permute(1, 2, 0, 3) for t in (q, k, v))
        scores = torch.matmul(qh, kh.transpose(-1, -2)) * self.scale
        scores = scores.masked_fill(self.mask, float("-inf"))
        p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(qh.dtype)
        o = torch.matmul(p, vh)  # [B, H, T, Dv]
        o = o.permute(2, 0, 1, 3).reshape(T, B, H * Dv)
        return x + F.linear(o, w["wo"])  # E4, residual

    def forward(self, x, weights):
        for w in weights:
            x = self.layer(x, w)
        return x


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


def read_safetensors(path):
    """name -> float32 numpy array; F32 and BF16 (the two dtypes laga writes)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[b:end]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name} has dtype {e['dtype']}; laga dumps F32 or BF16")
        out[name] = a.reshape(e["shape"]).astype(np.float32)
    return out


def check(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    t = read_safetensors(os.path.join(d, "tensors.safetensors"))
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
