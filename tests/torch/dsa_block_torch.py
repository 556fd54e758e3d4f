"""DeepSeek Sparse Attention's block in PyTorch, for mla_block_torch.py's check of the sparse forms'
dumps (dsa-gather, dsa-regather), and that model's own self-test.

Written from the math of DeepSeek-V3.2's DSA as laga defines it (docs/sparse.md), not from laga's
C++, on top of mla_block_torch's dense pieces (RMSNorm, RoPE tables with YaRN, the bf16 storage
model). Per layer, on the MLA's xn = RMSNorm(x) (x itself with config attention_only, which also
drops the residual), cqn = RMSNorm(cq), q, c^KV, k_pe:
- the main attention in its absorbed (MQA) form over one shared latent head: q_abs[t, h] =
  [q_nope[t, h]·W_UK[h] ‖ q_pe[t, h]], K_s = [c^KV_s ‖ k_pe_s], V_s = c^KV_s, softmax over the
  candidates C_t, o[t, h] = o_lat[t, h]·W_UV[h]ᵀ, y = x + o·W_Oᵀ;
- the lightning indexer on DETACHED xn and cqn: index queries q^I = cqn·W^{I,Q}ᵀ per index head and
  one index key k^I = LayerNorm(xn·W^{I,K}ᵀ), both with rotate-half RoPE on their first Dr dims,
  head weights w^I = xn·w^{I}ᵀ, and I[t, s] = Σ_j w^I[t, j]·(H_I·D_I)^-1/2·ReLU(q^I[t, j]·k^I[s]);
- its loss L_I = Σ_{t, b} KL(p[t, ·] ‖ softmax_{C_t} I[t, ·]), p the main attention's probabilities
  (detached) averaged over heads and L1-normalised over C_t.
C_t is the dumped selection (stage sparse) or every s ≤ t (stage warmup). The loss differentiated
is ⟨dy, y⟩ + indexer_loss_scale·Σ_l L_I,l: the main path learns from dy alone, the indexer from L_I.

It does not choose the selection a dump is checked with: the models attend over the dumped one, and
report_selection checks it against float64 index scores (near-ties may fall either way in the run's
precision, hence a bound of 16 machine epsilons of the largest score of the row). It selects only in
the self-test, where no dump gives one. Everything [T, T] is materialised: a checker's sizes.
"""
import json
import math
import os
import struct
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

from mla_block_torch import (Block, CheckFailed, _keep, _StoreBf16, attention_only, check_dump, indexer_shapes,
                             layer_shapes, load_run_json, rmsnorm, rope, softmax_scale)

STAGES = ("sparse", "warmup")


# --------------------------------------------------------------------------------------------
# What a sparse dump must hold before a model runs over it.


def check_sparse_dump(cfg, t):
    """The configuration a sparse form needs, and every dumped selection's structure: row t holds
    min(k, t+1) distinct positions ≤ t in ascending order, then −1."""
    if (cfg["q_lora_rank"] or 0) <= 0:
        raise CheckFailed(f"form {cfg['form']} with q_lora_rank 0: the indexer's queries read c^Q; "
                          "the sparse forms need a model with q_lora_rank > 0")
    if cfg.get("indexer_stage") not in STAGES:
        raise CheckFailed(f"indexer_stage {cfg.get('indexer_stage')!r}; valid: {', '.join(STAGES)}")
    if not indexer_shapes(cfg) or cfg["index_head_dim"] < cfg["qk_rope_head_dim"] or cfg["index_topk"] < 1:
        raise CheckFailed(f"form {cfg['form']} needs an indexer: index_n_heads {cfg.get('index_n_heads')}, "
                          f"index_head_dim {cfg.get('index_head_dim')} (≥ qk_rope_head_dim "
                          f"{cfg['qk_rope_head_dim']}), index_topk {cfg.get('index_topk')} (≥ 1)")
    k = min(cfg["index_topk"], cfg["seq_len"])  # a query has at most T keys: laga runs top-k as T
    for l in range(cfg["num_layers"]):
        idx = t.get(f"layers.{l}.topk")
        if idx is None:
            continue
        for tt in range(idx.shape[0]):
            n = min(k, tt + 1)
            head, tail = idx[tt, :, :n], idx[tt, :, n:]
            good = (head >= 0).all(1) & (head <= tt).all(1) & (np.diff(head, axis=1) > 0).all(1) & (tail == -1).all(1)
            if not good.all():
                b = int(np.argmin(good))
                raise CheckFailed(f"layers.{l}.topk[{tt}, {b}] = {idx[tt, b].tolist()}: expected min(k, t+1) = "
                                  f"{n} distinct positions ≤ {tt} in ascending order, then -1")


def selection_mask(idx, T):
    """idx [T, B, k] positions (−1 none) -> C [B, T, T] bool, C[b, t, s] = s selected by row t."""
    idx = np.asarray(idx)
    C = np.zeros((idx.shape[1], T, T), dtype=bool)
    tt, bb, jj = np.nonzero(idx >= 0)
    C[bb, tt, idx[tt, bb, jj]] = True
    return torch.from_numpy(C)


def select_topk(I, k):
    """The indexer's selection from scores I [B, T, T]: per row the k largest over s ≤ t, ties to the
    lower position, ascending, −1 padded; [T, B, k] int64 numpy."""
    B, T, _ = I.shape
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    order = torch.sort(I.masked_fill(~causal, -math.inf), dim=-1, descending=True, stable=True).indices[..., :k]
    valid = torch.arange(k)[None, :] <= torch.arange(T)[:, None]  # [T, k]: j < t + 1
    big = T + k
    order = torch.sort(torch.where(valid, order, torch.full_like(order, big)), dim=-1).values
    order = torch.where(valid, order, torch.full_like(order, -1))
    return order.permute(1, 0, 2).numpy().astype(np.int64)


# --------------------------------------------------------------------------------------------
# The model.


class SparseBlock(Block):
    """The L-layer stack of a sparse form in one dtype. topk: per layer the dumped selection
    [T, B, k] (stage sparse), or None: the layer selects from its own index scores (the self-test),
    or attends to every s ≤ t (stage warmup)."""

    def __init__(self, cfg, T, dtype, topk):
        super().__init__(cfg, T, dtype)
        self.topk = list(topk)
        self.selected = []  # per layer, the selection attended over ([T, B, k]; None at warmup)
        self.w_scale = (cfg["index_n_heads"] * cfg["index_head_dim"]) ** -0.5

    def indexer(self, xn, cqn, w, st):
        """Index scores I [B, T, T] from the detached xn [T, B, D] and cqn [T, B, Lq]."""
        T, B, _ = xn.shape
        HI, DI, Dr = self.cfg["index_n_heads"], self.cfg["index_head_dim"], self.cfg["qk_rope_head_dim"]
        xd, cd = xn.detach(), cqn.detach()
        qi = st(F.linear(cd, w["indexer.wq_b"])).reshape(T, B, HI, DI)
        qi = torch.cat([st(rope(qi[..., :Dr], self.cos, self.sin, False)), qi[..., Dr:]], dim=-1)  # q^I
        ki = st(F.linear(xd, w["indexer.wk"]))  # [T, B, D_I]
        ki = st(F.layer_norm(ki, (DI,), w["indexer.k_norm"], w["indexer.k_norm_bias"], 1e-6))
        ki = torch.cat([st(rope(ki[..., :Dr], self.cos, self.sin, False)), ki[..., Dr:]], dim=-1)  # k^I
        wi = st(F.linear(xd, w["indexer.weights_proj"]))  # w^I [T, B, H_I]
        dots = torch.relu(torch.einsum("tbjd,sbd->btjs", qi, ki))  # [B, T, H_I, T]
        return torch.einsum("btjs,tbj->bts", dots, wi) * self.w_scale

    def layer(self, x, w, st, l):
        """One layer: x [T, B, D] -> (x + sparse MLA(RMSNorm(x)), or sparse MLA(x) with attention_only,
        L_I, I [B, T, T])."""
        cfg = self.cfg
        T, B, _ = x.shape
        H, Lkv = cfg["num_attention_heads"], cfg["kv_lora_rank"]
        Dn, Dr, Dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        eps, inter = cfg["rms_norm_eps"], cfg["rope_interleaved"]

        alone = attention_only(cfg)
        xn = x if alone else st(rmsnorm(x, w["attn_norm"], eps))
        cq = st(F.linear(xn, w["wq_a"]))  # L1
        cqn = st(rmsnorm(cq, w["q_norm"], eps))  # L2
        q = st(F.linear(cqn, w["wq_b"])).reshape(T, B, H, Dn + Dr)  # L3
        q_nope, q_pe = q[..., :Dn], st(rope(q[..., Dn:], self.cos, self.sin, inter))
        kv = st(F.linear(xn, w["wkv_a"]))  # L4 [T, B, Lkv+Dr]
        ckv = st(rmsnorm(kv[..., :Lkv], w["kv_norm"], eps))  # L5
        kpe = st(rope(kv[..., Lkv:], self.cos, self.sin, inter))  # L6

        I = self.indexer(xn, cqn, w, st)
        if cfg["indexer_stage"] == "warmup":
            C = ~self.mask[None].expand(B, T, T)
            self.selected.append(None)
        else:
            idx = self.topk[l] if self.topk[l] is not None else select_topk(I.detach(), min(cfg["index_topk"], T))
            C = selection_mask(idx, T)
            self.selected.append(idx)

        # The absorbed main path: W_UK into the query, W_UV after the attention; one latent head.
        wkv_b = w["wkv_b"].reshape(H, Dn + Dv, Lkv)
        w_uk, w_uv = wkv_b[:, :Dn], wkv_b[:, Dn:]  # [H, Dn, Lkv], [H, Dv, Lkv]
        q_abs = torch.cat([st(torch.einsum("tbhn,hnl->tbhl", q_nope, w_uk)), q_pe], dim=-1)  # [T, B, H, Lkv+Dr]
        k_lat = torch.cat([ckv, kpe], dim=-1)  # [T, B, Lkv+Dr]
        s = torch.einsum("tbhc,sbc->bhts", q_abs, k_lat) * self.scale
        P = torch.softmax(s.masked_fill(~C[:, None], -math.inf), dim=-1)  # [B, H, T, T]
        o_lat = st(torch.einsum("bhts,sbl->tbhl", P, ckv))  # [T, B, H, Lkv]
        o = st(torch.einsum("tbhl,hvl->tbhv", o_lat, w_uv)).reshape(T, B, H * Dv)
        y = st(F.linear(o, w["wo"]))  # E4
        y = y if alone else st(x + y)  # residual

        # L_I: KL(p ‖ softmax_{C_t} I) summed over rows, the target detached; 0·log 0 = 0.
        p = (P.detach().sum(dim=1) / H).masked_fill(~C, 0.0)
        p = p / p.sum(dim=-1, keepdim=True)
        logq = torch.log_softmax(I.masked_fill(~C, -math.inf), dim=-1).masked_fill(~C, 0.0)
        loss = (torch.xlogy(p, p) - p * logq).sum()
        return y, loss, I.detach().to(torch.float64).numpy()

    def forward(self, x, weights, st=_keep):
        """-> (y [T, B, D], [L_I per layer] (tensors), [I per layer] (float64 numpy [B, T, T]))."""
        losses, scores = [], []
        self.selected = []
        for l, w in enumerate(weights):
            x, loss, I = self.layer(x, w, st, l)
            losses.append(loss)
            scores.append(I)
        return x, losses, scores


# --------------------------------------------------------------------------------------------
# Checks beyond the tensors' bound.


def report_selection(cfg, t, scores, eps):
    """Each dumped selection against float64 index scores: no position left out may score above
    the smallest selected one by more than 16·eps·max|I[t, s ≤ t]|. Prints a row per layer;
    returns (layers failing, layers checked)."""
    k, wrong, checked = min(cfg["index_topk"], cfg["seq_len"]), 0, 0
    print(f"# selection: left-out score - smallest selected score <= 16 * {eps:.3g} * max|I[t, s<=t]| "
          "(float64 scores)")
    for l in range(cfg["num_layers"]):
        idx = t.get(f"layers.{l}.topk")
        if idx is None:
            print(f"  layers.{l}.topk: not dumped (stage {cfg['indexer_stage']}: dense main attention)")
            continue
        I = scores[l]
        rows, over, worst = 0, 0, -math.inf
        for tt in range(idx.shape[0]):
            if tt + 1 <= k:
                continue  # every candidate selected
            for b in range(idx.shape[1]):
                cand = I[b, tt, : tt + 1]
                sel = idx[tt, b, :k]
                out = np.ones(tt + 1, dtype=bool)
                out[sel] = False
                excess = cand[out].max() - cand[sel].min()
                bound = 16 * eps * np.abs(cand).max()
                ratio = excess / bound if bound > 0 else (math.inf if excess > 0 else 0.0)
                worst = max(worst, ratio)
                over += excess > bound
                rows += 1
        checked += 1
        wrong += over > 0
        print(f"  layers.{l}.topk: {rows} rows leave keys out; worst (left-out - smallest selected) / bound "
              f"= {worst:.3f}; {over} rows over  {'yes' if over == 0 else 'NO'}")
    return wrong, checked


def report_indexer_loss(path, cfg, ref, base, bf16):
    """The run's indexer_loss (laga run --json: per layer, summed over ranks) against float64's L_I,
    within 2e-2 relative in bf16, 1e-4 in fp32. Prints a row per layer; returns (wrong, checked)."""
    got = load_run_json(path).get("indexer_loss")
    L = cfg["num_layers"]
    tol = 2e-2 if bf16 else 1e-4
    if not isinstance(got, list) or len(got) != L or not all(isinstance(v, (int, float)) for v in got):
        print(f"  indexer_loss in {path}: {got!r}, expected {L} numbers (one per layer)  NO")
        return 1, 1
    print(f"# indexer loss: |run - float64| / |float64| <= {tol:g} (baseline: the model in the run's precision)")
    wrong = 0
    for l in range(L):
        rel = abs(got[l] - ref[l]) / abs(ref[l]) if ref[l] != 0 else (0.0 if got[l] == 0 else math.inf)
        brel = abs(base[l] - ref[l]) / abs(ref[l]) if ref[l] != 0 else 0.0
        ok = rel <= tol
        wrong += not ok
        print(f"  layers.{l}.indexer_loss: run {got[l]:.8e}, float64 {ref[l]:.8e}, rel {rel:.3e}, "
              f"baseline rel {brel:.3e}  {'yes' if ok else 'NO'}")
    return wrong, L


# --------------------------------------------------------------------------------------------
# Self-test: the sparse model needs no laga to be checked. Finite differences in float64 (the loss
# of each gradient: ⟨dy, y⟩ for x and the MLA's weights, indexer_loss_scale·Σ L_I for the
# indexer's), the dense model's y and gradients where every key is selected or at warmup, and whole
# synthetic dumps (the model in fp32 and in bf16 storage standing for laga) that must pass
# check_dump, with corrupted copies that must fail it.


def _config(T, B, L, k, stage, dtype="fp32", loss_scale=0.5, alone=False):
    """laga's tiny model with its indexer (heads 4, dim 32), as laga run --dump describes it;
    alone: the attention alone (attention_only)."""
    cfg = {"model": "tiny", "form": "dsa-gather", "sp": 1, "dtype": dtype, "hidden_size": 64,
           "num_attention_heads": 8, "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
           "qk_rope_head_dim": 8, "v_head_dim": 12, "index_n_heads": 4, "index_head_dim": 32,
           "index_topk": k, "indexer_stage": stage, "indexer_loss_scale": loss_scale, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "rope_interleaved": True,
           "rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
           "num_layers": L, "seq_len": T, "batch": B, "attention_only": alone}
    cfg["softmax_scale"] = softmax_scale(cfg)
    return cfg


def _inputs(cfg, seed, dtype):
    """x, dy and the weights (laga's initialisation: norms 1 + N(0, 0.1), biases N(0, 0.1),
    projections N(0, 1/fan_in)) as float64 numpy, rounded to dtype as a dump holds them."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda shape, std, mean=0.0: (torch.randn(shape, generator=g, dtype=torch.float64) * std + mean).to(dtype)
    act = [cfg["seq_len"], cfg["batch"], cfg["hidden_size"]]
    t = {"x": rnd(act, 1.0), "dy": rnd(act, 1.0)}
    for l in range(cfg["num_layers"]):
        for n, s in {**layer_shapes(cfg), **indexer_shapes(cfg)}.items():
            t[f"layers.{l}.{n}"] = (rnd(s, 0.1) if n.endswith("_bias") else rnd(s, 0.1, 1.0) if len(s) == 1
                                    else rnd(s, s[1] ** -0.5))
    return {n: v.to(torch.float64).numpy() for n, v in t.items()}


def _leaves(cfg, t):
    leaf = lambda a: torch.tensor(a, dtype=torch.float64, requires_grad=True)
    names = {**layer_shapes(cfg), **indexer_shapes(cfg)}
    return leaf(t["x"]), [{n: leaf(t[f"layers.{l}.{n}"]) for n in names} for l in range(cfg["num_layers"])]


def _self_test_finite_differences(stage, alone=False):
    cfg = _config(T=10, B=2, L=2, k=4, stage=stage, alone=alone)
    T, L, scale = cfg["seq_len"], cfg["num_layers"], cfg["indexer_loss_scale"]
    t = _inputs(cfg, 1, torch.float64)
    dy = torch.tensor(t["dy"])
    x, w = _leaves(cfg, t)
    blk = SparseBlock(cfg, T, torch.float64, [None] * L)
    y, losses, _ = blk.forward(x, w)
    topk = blk.selected  # held fixed: the loss is smooth in the weights for a fixed selection
    torch.autograd.backward([y, sum(losses)], [dy, torch.tensor(scale, dtype=torch.float64)])

    def losses_at(xx, ww):
        with torch.no_grad():
            yy, ls, _ = SparseBlock(cfg, T, torch.float64, topk).forward(xx, ww)
        return float((dy * yy).sum()), scale * float(sum(ls))

    g = torch.Generator().manual_seed(2)
    worst, h = 0.0, 1e-6
    for l, name in [(None, "x")] + [(l, n) for l in range(L) for n in w[l]]:
        p = x if l is None else w[l][name]
        v = torch.randn(p.shape, generator=g, dtype=torch.float64)
        which = 1 if name.startswith("indexer.") else 0  # the loss this gradient comes from
        with torch.no_grad():
            p += h * v
            plus = losses_at(x, w)[which]
            p -= 2 * h * v
            minus = losses_at(x, w)[which]
            p += h * v
        fd, ad = (plus - minus) / (2 * h), float((p.grad * v).sum())
        rel = abs(fd - ad) / max(abs(fd), 1e-12)
        worst = max(worst, rel)
        if rel > 1e-6:
            raise CheckFailed(f"stage {stage}{', attention only' if alone else ''}: {name} (layer {l}): "
                              f"autograd <grad, v> {ad:.10e}, central difference {fd:.10e}, rel {rel:.2e} > 1e-6")
    print(f"  finite differences, stage {stage}{', attention only' if alone else ''}: x and "
          f"{sum(len(d) for d in w)} weights, worst rel {worst:.2e} <= 1e-6  yes")


def _self_test_dense_equivalence(stage, alone=False):
    cfg = _config(T=12, B=2, L=2, k=12, stage=stage, alone=alone)  # k = T: every earlier key selected
    T, L = cfg["seq_len"], cfg["num_layers"]
    t = _inputs(cfg, 3, torch.float64)
    dy = torch.tensor(t["dy"])
    xs, ws = _leaves(cfg, t)
    blk = SparseBlock(cfg, T, torch.float64, [None] * L)
    ys, losses, _ = blk.forward(xs, ws)
    torch.autograd.backward([ys, sum(losses)], [dy, torch.tensor(cfg["indexer_loss_scale"], dtype=torch.float64)])
    xd, wd = _leaves(cfg, t)
    yd = Block(cfg, T, torch.float64).forward(xd, wd)
    torch.autograd.backward(yd, dy)
    pairs = [("y", ys, yd), ("dx", xs.grad, xd.grad)]
    pairs += [(f"layers.{l}.{n}.grad", ws[l][n].grad, wd[l][n].grad) for l in range(L) for n in layer_shapes(cfg)]
    worst = max(float((a - b).abs().max() / b.abs().max()) for _, a, b in pairs)
    if stage == "sparse":
        full = all((idx[tt, :, : tt + 1] == np.arange(tt + 1)).all() for idx in blk.selected for tt in range(T))
        if not full:
            raise CheckFailed("k = T: the selection is not every earlier key")
    if worst > 1e-12:
        raise CheckFailed(f"stage {stage}{', attention only' if alone else ''}, every key a candidate: the "
                          f"sparse block differs from the dense one by {worst:.2e} relative")
    print(f"  stage {stage}{', attention only' if alone else ''}, every key a candidate: y, dx and "
          f"{len(pairs) - 2} MLA gradients equal the dense block's, worst rel {worst:.2e} <= 1e-12  yes")


def write_safetensors(path, tensors):
    """name -> numpy array, as F32 (floats) or I32 (integers), in the safetensors layout."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for n, a in tensors.items():
        integral = np.issubdtype(a.dtype, np.integer)
        b = a.astype("<i4" if integral else "<f4").tobytes()
        header[n] = {"dtype": "I32" if integral else "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def _write_dump(d, cfg, t, indexer_loss):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_safetensors(os.path.join(d, "tensors.safetensors"), t)
    with open(os.path.join(d, "run.json"), "w") as f:
        json.dump({"command": "run", "indexer_loss": indexer_loss}, f)
    return d, 4.0, os.path.join(d, "run.json")


def _expect_failure(what, fn):
    try:
        fn()
    except CheckFailed as e:
        print(f"  {what}: rejected ({str(e)[:90]})  yes")
        return
    raise CheckFailed(f"{what}: the check accepted it")


def _self_test_synthetic_dump(tmp, dtype):
    """The model in the run's precision, selecting from its own scores, stands for laga."""
    from mla_block_torch import run_model  # the check's own path from dumped tensors

    bf16 = dtype == "bf16"
    precision, tdtype = ("bf16-storage", torch.bfloat16) if bf16 else ("float32", torch.float32)
    cfg = _config(T=24, B=2, L=2, k=8, stage="sparse", dtype=dtype)
    T, L = cfg["seq_len"], cfg["num_layers"]
    t = _inputs(cfg, 4, tdtype)
    x, w = _leaves(cfg, t)
    st = _StoreBf16.apply if bf16 else _keep
    blk = SparseBlock(cfg, T, torch.float32, [None] * L)
    with torch.no_grad():
        blk.forward(x.float(), [{n: v.float() for n, v in d.items()} for d in w], st)
    for l in range(L):
        t[f"layers.{l}.topk"] = blk.selected[l]
    out, aux = run_model(cfg, t, precision)
    t.update(out)
    print(f"  synthetic {dtype} dump (the {precision} model selecting from its own scores):")
    check_dump(*_write_dump(os.path.join(tmp, dtype), cfg, t, aux["indexer_loss"]))

    bad = dict(t)
    bad["layers.1.indexer.wk.grad"] = 2 * t["layers.1.indexer.wk.grad"]
    _expect_failure(f"{dtype}: an indexer gradient doubled (its loss scale applied twice)",
                    lambda: check_dump(*_write_dump(os.path.join(tmp, dtype + "-grad"), cfg, bad, aux["indexer_loss"])))
    loss = list(aux["indexer_loss"])
    loss[0] *= 1 + (0.1 if bf16 else 1e-3)
    _expect_failure(f"{dtype}: an indexer loss off by {'10%' if bf16 else '0.1%'}",
                    lambda: check_dump(*_write_dump(os.path.join(tmp, dtype + "-loss"), cfg, t, loss)))
    bad = dict(t)
    idx = bad["layers.0.topk"] = t["layers.0.topk"].copy()
    idx[T - 1, 0, 0] = T  # a future position
    _expect_failure(f"{dtype}: a selected position after its query",
                    lambda: check_sparse_dump(cfg, bad))
    # The best selected key of the last row of layer 0 traded for its worst left-out key.
    _, ref_aux = run_model(cfg, t, "float64")
    I = ref_aux["index_scores"][0][0, T - 1]
    row = list(t["layers.0.topk"][T - 1, 0])
    left = [s for s in range(T) if s not in row]
    row[int(np.argmax(I[row]))] = left[int(np.argmin(I[left]))]
    idx = bad["layers.0.topk"] = t["layers.0.topk"].copy()
    idx[T - 1, 0] = sorted(row)
    wrong, _ = report_selection(cfg, bad, ref_aux["index_scores"], 2.0**-7 if bf16 else 2.0**-23)
    if wrong == 0:
        raise CheckFailed(f"{dtype}: a selection without its best key passed the selection check")
    print(f"  {dtype}: a selection without its best key: rejected  yes")


def self_test():
    print("# dsa_block_torch self-test: the sparse model (float64) and the check of its dumps")
    for stage in STAGES:
        _self_test_finite_differences(stage)
        _self_test_dense_equivalence(stage)
    _self_test_finite_differences("sparse", alone=True)
    _self_test_dense_equivalence("sparse", alone=True)
    with tempfile.TemporaryDirectory(prefix="laga-dsa-self-test.") as tmp:
        for dtype in ("fp32", "bf16"):
            _self_test_synthetic_dump(tmp, dtype)
