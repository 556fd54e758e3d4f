#!/usr/bin/python3
"""The MLA block stack in PyTorch, and an independent check of a laga dump (laga run ... --dump DIR).

The block (Block) is written from docs/design.md §1–§2 alone, not from laga's C++, as a PyTorch user
writes it: the L-block MLA stack y = x + MLA(RMSNorm(x)) per layer (with config attention_only, the
attention alone, Hugging Face's self_attn: y = MLA(x), no attn_norm), sequence-first [T, B, D],
torch.nn.functional.linear for every projection, RMSNorm with its statistics in fp32 at least (Hugging
Face's DeepSeek style), RoPE with YaRN as in docs/design.md §1.1 over global positions 0..T-1, and
explicit causal attention with the scores materialised and the softmax in fp32 at least. It is the one
PyTorch block of the repository: this check runs it in float64 as the reference, and the block
benchmark (bench/torch_block.py) times it as its PyTorch eager baseline.

The check reads DIR/config.json and DIR/tensors.safetensors (parsed here with json + struct + numpy:
Debian has no safetensors package), runs forward and autograd backward in float64 from the dumped x,
dy and weights, and compares y, dx and every weight gradient with laga's.

Tolerance, per tensor, derived rather than picked: the same torch model is run again in the dump's
precision (float32 for fp32 dumps; for bf16 dumps, fp32 arithmetic with every stored tensor --
op outputs, activation gradients, weight gradients -- rounded to bf16, the dtype model of
docs/design.md), and laga's max abs error against float64 must be at most FACTOR (4) times that
model's error plus a floor of one machine epsilon of the precision times the tensor's max abs value.

A model with a lightning indexer (config index_n_heads > 0) has its weights in every dump. The dense
forms ignore it: their dumps' indexer gradients must be exactly zero. The sparse forms (DeepSeek
Sparse Attention, form dsa-*) are modelled in the sibling module dsa_block_torch.py, imported only
for their dumps: the same bound rule over y, dx and every gradient, the indexer's included, plus the
dumped selection (layers.{l}.topk) against float64 index scores and, with --json, the run's indexer
loss against float64's.

Usage:
  mla_block_torch.py DIR [--factor F] [--json FILE]   check a dump (FILE: the run's laga run --json)
  mla_block_torch.py --same DIR1 DIR2                 every tensor of two dumps bit-identical
  mla_block_torch.py --self-test                      the sparse model against finite differences,
                                                      the dense model, and a synthetic dump
Exit status: 0 pass, 1 a check failed (or torch is missing), 2 bad usage (missing files).
"""
import json
import math
import os
import struct
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # a missing checker is a failure, never a silent skip
    print(f"mla_block_torch.py: cannot import torch/numpy under {sys.executable}: {e}", file=sys.stderr)
    sys.exit(1)


class CheckFailed(Exception):
    pass


class Usage(Exception):
    pass


# --------------------------------------------------------------------------------------------
# .safetensors, from the format: u64 little-endian header length, JSON header, raw data.

_NP_DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I32": "<i4"}


def read_safetensors(path):
    """name -> numpy array: float64 for float32, bfloat16, float16 and float64 entries; int64 for
    int32 ones (a sparse form's selections), kept integral so positions compare exactly."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise CheckFailed(f"{path}: {len(blob)} bytes, too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise CheckFailed(f"{path}: header length {n} exceeds the file")
    try:
        header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckFailed(f"{path}: header is not JSON: {e}")
    data = memoryview(blob)[8 + n :]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = e["dtype"], list(e["shape"]), e["data_offsets"]
        size = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "I32": 4}.get(dtype)
        if size is None:
            raise CheckFailed(f"{path}: tensor {name} has dtype {dtype}, not one this checker reads")
        if not (0 <= begin <= end <= len(data)) or end - begin != size * math.prod(shape):
            raise CheckFailed(f"{path}: tensor {name} has bad data_offsets [{begin}, {end}] for {dtype} {shape}")
        raw = data[begin:end]
        if dtype == "BF16":
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, _NP_DTYPES[dtype])
        out[name] = a.astype(np.int64 if dtype == "I32" else np.float64).reshape(shape)
    return out


# --------------------------------------------------------------------------------------------
# The model, docs/design.md §1–§2.


def attention_only(cfg):
    """The attention alone: no input RMSNorm (no attn_norm weight) and no residual. Absent: off."""
    return bool(cfg.get("attention_only", False))


def layer_shapes(cfg):
    """Weight names and [out, in] shapes of one layer (docs/design.md §1's table)."""
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    Lq, Lkv = cfg["q_lora_rank"] or 0, cfg["kv_lora_rank"]
    Dn, Dr, Dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    s = {} if attention_only(cfg) else {"attn_norm": [D]}
    if Lq > 0:
        s.update(wq_a=[Lq, D], q_norm=[Lq], wq_b=[H * (Dn + Dr), Lq])
    else:
        s["wq"] = [H * (Dn + Dr), D]
    s.update(wkv_a=[Lkv + Dr, D], kv_norm=[Lkv], wkv_b=[H * (Dn + Dv), Lkv], wo=[D, H * Dv])
    return s


def indexer_shapes(cfg):
    """The lightning indexer's weight names and shapes (none without index_n_heads): its index
    queries read c^Q after q_norm, its key and head weights read RMSNorm(x)."""
    HI, DI = cfg.get("index_n_heads", 0) or 0, cfg.get("index_head_dim", 0) or 0
    if HI <= 0:
        return {}
    D, Lq = cfg["hidden_size"], cfg["q_lora_rank"] or 0
    return {"indexer.wq_b": [HI * DI, Lq], "indexer.wk": [DI, D], "indexer.k_norm": [DI],
            "indexer.k_norm_bias": [DI], "indexer.weights_proj": [HI, D]}


def is_sparse(cfg):
    """DeepSeek Sparse Attention's forms (dsa-gather, dsa-regather) run the indexer; others ignore it."""
    return str(cfg.get("form", "")).startswith("dsa-")


def yarn_mscale(f, m):
    return 1.0 if f <= 1 else 0.1 * m * math.log(f) + 1.0


def softmax_scale(cfg):
    Dqk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    rs = cfg.get("rope_scaling")
    m = yarn_mscale(rs["factor"], rs["mscale_all_dim"]) if rs else 1.0
    return Dqk**-0.5 * m * m


def rope_tables(cfg, T):
    """cos, sin [T, Dr/2] in float64 (docs/design.md §1.1), attention factor included."""
    Dr, theta = cfg["qk_rope_head_dim"], cfg["rope_theta"]
    inv = [theta ** (-2.0 * i / Dr) for i in range(Dr // 2)]
    rs = cfg.get("rope_scaling")
    factor = 1.0
    if rs:
        f, L0, bf, bs = rs["factor"], rs["original_max_position_embeddings"], rs["beta_fast"], rs["beta_slow"]

        def corr(n):
            return Dr * math.log(L0 / (2 * math.pi * n)) / (2 * math.log(theta))

        low, high = max(math.floor(corr(bf)), 0), min(math.ceil(corr(bs)), Dr - 1)
        if low == high:
            high += 0.001
        ramp = [min(max((i - low) / (high - low), 0.0), 1.0) for i in range(Dr // 2)]
        inv = [v / f * r + v * (1 - r) for v, r in zip(inv, ramp)]
        factor = yarn_mscale(f, rs["mscale"]) / yarn_mscale(f, rs["mscale_all_dim"])
    angle = torch.arange(T, dtype=torch.float64)[:, None] * torch.tensor(inv, dtype=torch.float64)[None, :]
    return torch.cos(angle) * factor, torch.sin(angle) * factor


def rope(x, cos, sin, interleaved):
    """x [T, ..., Dr]; cos, sin [T, Dr/2] broadcast over the middle dimensions."""
    shape = [cos.shape[0]] + [1] * (x.dim() - 2) + [cos.shape[1]]
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    if interleaved:  # pairs (x[2i], x[2i+1]), DeepSeek's layout
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)
    h = x.shape[-1] // 2  # pairs (x[i], x[i + Dr/2])
    x0, x1 = x[..., :h], x[..., h:]
    return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)


def _wide(dtype):
    """The dtype statistics are computed in: fp32 at least (bf16 widened, fp32 and fp64 kept)."""
    return torch.promote_types(dtype, torch.float32)


def rmsnorm(v, w, eps):
    """Hugging Face's DeepSeek style: the statistics in fp32 at least, the result cast back, times w."""
    vw = v.to(_wide(v.dtype))
    return w * (vw * torch.rsqrt(vw.pow(2).mean(dim=-1, keepdim=True) + eps)).to(v.dtype)


class _StoreBf16(torch.autograd.Function):
    """A tensor stored in bf16: rounded on the way forward, and its gradient on the way back."""

    @staticmethod
    def forward(ctx, x):
        return x.to(torch.bfloat16).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g.to(torch.bfloat16).to(g.dtype)


def _keep(x):
    return x


class Block:
    """The L-layer stack in one dtype, with its constant per-run state (RoPE tables, causal mask,
    softmax scale) built once, like a module's buffers."""

    def __init__(self, cfg, T, dtype):
        self.cfg, self.dtype = cfg, dtype
        cos, sin = rope_tables(cfg, T)  # float64; below fp64, through fp32 as a PyTorch user builds them
        self.cos, self.sin = ((c if dtype == torch.float64 else c.float()).to(dtype) for c in (cos, sin))
        self.mask = torch.ones(T, T, dtype=torch.bool).triu(1)  # True above the diagonal: future keys
        self.scale = softmax_scale(cfg)

    def layer(self, x, w, st=_keep):
        """One layer: x [T, B, D] -> x + MLA(RMSNorm(x)), or MLA(x) with attention_only; st(t) models
        storing t (identity, or bf16)."""
        cfg = self.cfg
        T, B, _ = x.shape
        H, Lkv = cfg["num_attention_heads"], cfg["kv_lora_rank"]
        Dn, Dr, Dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        eps, inter = cfg["rms_norm_eps"], cfg["rope_interleaved"]

        alone = attention_only(cfg)
        xn = x if alone else st(rmsnorm(x, w["attn_norm"], eps))
        if (cfg["q_lora_rank"] or 0) > 0:
            cq = st(F.linear(xn, w["wq_a"]))  # L1
            q = st(F.linear(st(rmsnorm(cq, w["q_norm"], eps)), w["wq_b"]))  # L2, L3
        else:
            q = st(F.linear(xn, w["wq"]))  # L3'
        q = q.reshape(T, B, H, Dn + Dr)
        q = torch.cat([q[..., :Dn], st(rope(q[..., Dn:], self.cos, self.sin, inter))], dim=-1)

        kv = st(F.linear(xn, w["wkv_a"]))  # L4 [T, B, Lkv+Dr]
        ckv = st(rmsnorm(kv[..., :Lkv], w["kv_norm"], eps))  # L5
        kpe = st(rope(kv[..., Lkv:], self.cos, self.sin, inter))  # L6, a single head
        kvb = st(F.linear(ckv, w["wkv_b"])).reshape(T, B, H, Dn + Dv)  # E1, per head k-rows then v-rows
        k = torch.cat([kvb[..., :Dn], kpe[:, :, None, :].expand(T, B, H, Dr)], dim=-1)
        v = kvb[..., Dn:]

        # E3, PyTorch's math style: [B, H, T, .], the scores materialised, the softmax in fp32 at least.
        qh, kh, vh = (t.permute(1, 2, 0, 3) for t in (q, k, v))
        s = torch.matmul(qh, kh.transpose(-1, -2)) * self.scale
        s = s.masked_fill(self.mask, float("-inf"))
        p = torch.softmax(s, dim=-1, dtype=_wide(s.dtype)).to(qh.dtype)
        o = st(torch.matmul(p, vh).permute(2, 0, 1, 3).reshape(T, B, H * Dv))
        y = st(F.linear(o, w["wo"]))  # E4
        return y if alone else st(x + y)  # residual

    def forward(self, x, weights, st=_keep):
        for w in weights:
            x = self.layer(x, w, st)
        return x


def run_model(cfg, t, precision):
    """Forward and backward from the dumped tensors; returns (name -> float64 array, aux).

    precision: "float64" (the reference), "float32", or "bf16-storage": fp32 arithmetic with every
    tensor an implementation stores (op outputs, activation gradients, weight gradients) rounded
    to bf16 -- the dtype model of docs/design.md, bf16 storage with fp32 accumulation.
    A sparse form's dump runs dsa_block_torch's block over the dumped selections; aux then holds
    its indexer loss per layer ("indexer_loss") and index scores ("index_scores", [B, T, T] per
    layer); empty for a dense form.
    """
    L, T = cfg["num_layers"], cfg["seq_len"]
    sparse = is_sparse(cfg)
    dtype = torch.float64 if precision == "float64" else torch.float32
    st = _StoreBf16.apply if precision == "bf16-storage" else _keep
    leaf = lambda a: torch.tensor(a, dtype=torch.float64).to(dtype).requires_grad_(True)
    x = leaf(t["x"])
    names = {**layer_shapes(cfg), **(indexer_shapes(cfg) if sparse else {})}
    weights = [{n: leaf(t[f"layers.{l}.{n}"]) for n in names} for l in range(L)]
    dy = torch.tensor(t["dy"], dtype=torch.float64).to(dtype)
    aux = {}
    if sparse:
        dsa = _dsa()
        topk = [t.get(f"layers.{l}.topk") for l in range(L)]
        h, losses, scores = dsa.SparseBlock(cfg, T, dtype, topk).forward(x, weights, st)
        # <dy, y> + indexer_loss_scale * sum_l L_I,l; the indexer's inputs and target are detached
        torch.autograd.backward([h, sum(losses)], [dy, torch.tensor(float(cfg["indexer_loss_scale"]), dtype=dtype)])
        aux = {"indexer_loss": [float(v.detach()) for v in losses], "index_scores": scores}
    else:
        h = Block(cfg, T, dtype).forward(x, weights, st)
        torch.autograd.backward(h, dy)
    out = {"y": h, "dx": x.grad}
    for l in range(L):
        for n, p in weights[l].items():
            out[f"layers.{l}.{n}.grad"] = p.grad if p.grad is not None else torch.zeros_like(p)
    final = (lambda v: v.to(torch.bfloat16)) if precision == "bf16-storage" else _keep
    return {k: final(v.detach()).to(torch.float64).numpy() for k, v in out.items()}, aux


def _dsa():
    """The sparse forms' model, imported only for their dumps (it imports this module back)."""
    import dsa_block_torch

    return dsa_block_torch


# --------------------------------------------------------------------------------------------
# Checks.


def load_dump(d):
    cfg_path, st_path = os.path.join(d, "config.json"), os.path.join(d, "tensors.safetensors")
    for p in (cfg_path, st_path):
        if not os.path.isfile(p):
            raise Usage(f"{p}: no such file; give a directory written by laga run --dump DIR")
    with open(cfg_path) as f:
        try:
            cfg = json.load(f)
        except json.JSONDecodeError as e:
            raise CheckFailed(f"{cfg_path}: not JSON: {e}")
    return cfg, read_safetensors(st_path)


def expected_names(cfg):
    """Every dumped tensor this checker needs, with its shape: the indexer's weights and gradients
    whenever the model has one, a sparse form's selections at the sparse stage (at warmup the
    main attention is dense and a dump may leave them out)."""
    T, B = cfg["seq_len"], cfg["batch"]
    act = [T, B, cfg["hidden_size"]]
    names = {n: act for n in ("x", "dy", "y", "dx")}
    for l in range(cfg["num_layers"]):
        for n, s in {**layer_shapes(cfg), **indexer_shapes(cfg)}.items():
            names[f"layers.{l}.{n}"] = s
            names[f"layers.{l}.{n}.grad"] = s
        if is_sparse(cfg) and cfg.get("indexer_stage") == "sparse":
            names[f"layers.{l}.topk"] = [T, B, min(cfg["index_topk"], T)]  # top-k above T runs as T
    return names


def check_dump(d, factor, json_path=None):
    cfg, t = load_dump(d)
    for n, s in expected_names(cfg).items():
        if n not in t:
            raise CheckFailed(f"{d}: the dump has no tensor {n}")
        if list(t[n].shape) != s:
            raise CheckFailed(f"{d}: {n} has shape {list(t[n].shape)}; expected {s} from config.json")
    scale = softmax_scale(cfg)
    if not math.isclose(scale, cfg["softmax_scale"], rel_tol=1e-12):
        raise CheckFailed(f"{d}: config softmax_scale {cfg['softmax_scale']!r} differs from the formula's {scale!r}")
    sparse = is_sparse(cfg)
    if sparse:
        # the selections index the models' attention: their structure is checked before they run
        _dsa().check_sparse_dump(cfg, t)

    bf16 = cfg["dtype"] in ("bf16", "bfloat16")
    precision = "bf16-storage" if bf16 else "float32"
    eps = 2.0**-7 if bf16 else 2.0**-23
    ref, ref_aux = run_model(cfg, t, "float64")
    base, base_aux = run_model(cfg, t, precision)

    rows, wrong = [], 0
    if not sparse:
        # a dense form ignores the indexer: its gradients are exact zeros, whatever the precision
        for l in range(cfg["num_layers"]):
            for n in indexer_shapes(cfg):
                g = t[f"layers.{l}.{n}.grad"]
                diff = float(np.max(np.abs(g))) if np.all(np.isfinite(g)) else float("inf")
                wrong += diff != 0
                rows.append((f"layers.{l}.{n}.grad", diff, 0.0, 0.0, 0.0, 0.0 if diff == 0 else float("inf"), diff == 0))
    for n in ["y", "dx"] + sorted(k for k in ref if k.startswith("layers.")):
        got = t[n]
        diff = float(np.max(np.abs(got - ref[n]))) if got.size else 0.0
        if not np.all(np.isfinite(got)):
            diff = float("inf")
        mref = float(np.max(np.abs(ref[n]))) if got.size else 0.0
        bdiff = float(np.max(np.abs(base[n] - ref[n]))) if got.size else 0.0
        bound = factor * bdiff + eps * mref
        ok = diff <= bound
        wrong += not ok
        rows.append((n, diff, mref, bdiff, bound, diff / bound if bound > 0 else 0.0, ok))

    print(f"# laga dump {d}: model {cfg.get('model')}, form {cfg.get('form')}, sp {cfg.get('sp')}, "
          f"dtype {cfg['dtype']}, T {cfg['seq_len']}, B {cfg['batch']}, layers {cfg['num_layers']}, "
          f"rope_interleaved {cfg['rope_interleaved']}, attention_only {attention_only(cfg)}")
    print(f"# reference: torch {torch.__version__} float64 autograd; baseline: the same model in {precision}; "
          f"bound = {factor:g} * baseline_diff + {eps:.3g} * max_abs_ref")
    if cfg.get("index_n_heads"):
        print(f"# indexer: heads {cfg['index_n_heads']}, dim {cfg['index_head_dim']}, top-k {cfg['index_topk']}"
              + (f", stage {cfg['indexer_stage']}, loss scale {cfg['indexer_loss_scale']:g}" if sparse
                 else "; a dense form ignores it: its gradients must be exactly 0"))
    print(f"# {'tensor':<34} {'max_abs_diff':>12} {'max_abs_ref':>12} {'baseline_diff':>13} "
          f"{'bound':>11} {'ratio':>7}  ok")
    for n, diff, mref, bdiff, bound, ratio, ok in rows:
        print(f"  {n:<34} {diff:12.4e} {mref:12.4e} {bdiff:13.4e} {bound:11.4e} {ratio:7.3f}  {'yes' if ok else 'NO'}")
    checks = len(rows)
    if sparse:
        dsa = _dsa()
        bad, n = dsa.report_selection(cfg, t, ref_aux["index_scores"], eps)
        wrong, checks = wrong + bad, checks + n
        if json_path is not None:
            bad, n = dsa.report_indexer_loss(json_path, cfg, ref_aux["indexer_loss"], base_aux["indexer_loss"], bf16)
            wrong, checks = wrong + bad, checks + n
    elif json_path is not None:
        wrong += _dense_json_has_no_indexer_loss(json_path)
        checks += 1
    print(f"# wrong: {wrong} of {checks}")
    if wrong:
        raise CheckFailed(f"{wrong} check(s) outside the bound")


def load_run_json(path):
    """The JSON a run wrote with --json FILE."""
    if not os.path.isfile(path):
        raise Usage(f"{path}: no such file; give the file of laga run --json FILE")
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise CheckFailed(f"{path}: not JSON: {e}")


def _dense_json_has_no_indexer_loss(path):
    """A dense form runs no indexer: its run reports no indexer loss (null, empty or absent)."""
    got = load_run_json(path).get("indexer_loss")
    ok = got is None or got == []
    print(f"  indexer_loss in {path}: {got!r}, expected none from a dense form  {'yes' if ok else 'NO'}")
    return 0 if ok else 1


def check_same(d1, d2):
    """Every tensor of the first dump (inputs, weights, outputs, gradients) bit-identical in the second."""
    _, a = load_dump(d1)
    _, b = load_dump(d2)
    differ = [n for n in sorted(a) if n not in b or a[n].shape != b[n].shape or not np.array_equal(a[n], b[n])]
    print(f"# {d1} vs {d2}: {len(a) - len(differ)} of {len(a)} tensors identical")
    if differ:
        raise CheckFailed(f"{len(differ)} tensor(s) differ between {d1} and {d2}: {', '.join(differ[:8])}")


def main(argv):
    try:
        if len(argv) == 3 and argv[0] == "--same":
            check_same(argv[1], argv[2])
        elif argv == ["--self-test"]:
            _dsa().self_test()
        elif len(argv) in (1, 3, 5) and not argv[0].startswith("-"):
            opts = dict(zip(argv[1::2], argv[2::2]))
            for o in opts:
                if o not in ("--factor", "--json"):
                    raise Usage(f"unknown option {o}; valid: --factor F, --json FILE")
            try:
                factor = float(opts.get("--factor", 4.0))
            except ValueError:
                raise Usage(f"--factor {opts['--factor']} is not a number; try 4")
            check_dump(argv[0], factor, opts.get("--json"))
        else:
            raise Usage("usage: mla_block_torch.py DIR [--factor F] [--json FILE] | --same DIR1 DIR2 | --self-test")
    except Usage as e:
        print(f"mla_block_torch.py: {e}", file=sys.stderr)
        return 2
    except CheckFailed as e:
        print(f"mla_block_torch.py: FAIL: {e}", file=sys.stderr)
        return 1
    except KeyError as e:
        print(f"mla_block_torch.py: FAIL: config.json or the dump lacks {e}", file=sys.stderr)
        return 1
    print("mla_block_torch.py: PASS")
    return 0


if __name__ == "__main__":
    # dsa_block_torch imports this module by name: it gets this running one (one CheckFailed class)
    sys.modules.setdefault("mla_block_torch", sys.modules[__name__])
    torch.set_grad_enabled(True)
    sys.exit(main(sys.argv[1:]))
