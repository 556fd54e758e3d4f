"""Multi-head Latent Attention in plain PyTorch: the independent implementation laga is checked against.

What it holds:
- `MultiheadLatentAttention`: Hugging Face DeepSeek-V3's `self_attn` (input already normalised, output
  before the residual), with DeepSeek-V3.2's lightning indexer and sparse attention when the config
  has one (`index_n_heads` > 0) and names no dense form.
- `MLABlock`: y = x + self_attn(input_layernorm(x)), the attention half of a DeepSeek decoder layer.
- `RMSNorm` and the RoPE/YaRN tables they use.
Parameters carry the Hugging Face names, so `load_state_dict` takes a checkpoint's layer as it is and
laga.torch's modules (same names) load this one's state dict.

Everything is autograd over torch ops, in any dtype (float64 for checks): the scores [B, H, T, T] are
materialised, RMSNorm statistics and the softmax run in fp32 at least. It does not shard, fuse, cache
keys or pack documents: one process, the whole sequence, causal over token order. The math is
docs/block.md (dense MLA), docs/sparse.md (the indexer and its loss) and docs/design.md §1.1 (RoPE, YaRN);
tests/torch/mla_block_torch.py and dsa_block_torch.py compute the same in sequence-first layout.

Shapes use docs/design.md §1's letters: B batch, T tokens, D hidden, H heads, Lq, Lkv the q and kv
latent ranks, Dn, Dr, Dv the nope, rope and value head dims, Dqk = Dn + Dr, Dl = Lkv + Dr, H_I, D_I the
index heads and their dim. Activations are batch-first [B, T, ...].
"""
import math

import torch
import torch.nn as nn

__all__ = ["MultiheadLatentAttention", "MLABlock", "RMSNorm", "config_dict", "softmax_scale", "rope_tables"]


def config_dict(config):
    """The config as a plain dict: a dict as it is, or `config.to_dict()` (laga.Config, Hugging Face's)."""
    if isinstance(config, dict):
        return config
    if hasattr(config, "to_dict"):
        return config.to_dict()
    raise TypeError(f"config is a {type(config).__name__}; give a dict of config.json keys "
                    "or an object with .to_dict()")


def _wide(dtype):
    """The dtype statistics are computed in: fp32 at least (bf16 widened, fp32 and fp64 kept)."""
    return torch.promote_types(dtype, torch.float32)


def _yarn_mscale(f, m):
    return 1.0 if f <= 1 else 0.1 * m * math.log(f) + 1.0


def softmax_scale(cfg):
    """cfg's softmax_scale, else Dqk^-0.5 · yarn_mscale(f, mscale_all_dim)² (docs/design.md §1.1)."""
    if cfg.get("softmax_scale") is not None:
        return float(cfg["softmax_scale"])
    rs = cfg.get("rope_scaling")
    m = _yarn_mscale(rs["factor"], rs.get("mscale_all_dim", 0)) if rs else 1.0
    return (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5 * m * m


def _rope_frequencies(cfg):
    """inv_freq [Dr/2] float64 and the attention factor α, YaRN applied when rope_scaling is set."""
    Dr, theta = cfg["qk_rope_head_dim"], float(cfg.get("rope_theta", 10000.0))
    inv = theta ** (-2.0 * torch.arange(Dr // 2, dtype=torch.float64) / Dr)  # [Dr/2]
    rs = cfg.get("rope_scaling")
    if not rs:
        return inv, 1.0
    kind = rs.get("type", rs.get("rope_type", "yarn"))
    if kind != "yarn":
        raise ValueError(f"rope_scaling type {kind!r} is not supported; valid: yarn, or rope_scaling null")
    f, L0 = float(rs["factor"]), rs.get("original_max_position_embeddings", 4096)
    bf, bs = rs.get("beta_fast", 32), rs.get("beta_slow", 1)

    def corr(n):
        return Dr * math.log(L0 / (2 * math.pi * n)) / (2 * math.log(theta))

    low, high = max(math.floor(corr(bf)), 0), min(math.ceil(corr(bs)), Dr - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(Dr // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)  # [Dr/2]
    inv = inv / f * ramp + inv * (1 - ramp)
    return inv, _yarn_mscale(f, rs.get("mscale", 1)) / _yarn_mscale(f, rs.get("mscale_all_dim", 0))


def rope_tables(cfg, positions, dtype=torch.float64):
    """cos, sin [B or 1, T, Dr/2] for positions [T] or [B, T], α included; built in float64 and
    rounded through fp32 to dtype below fp64."""
    inv, alpha = _rope_frequencies(cfg)
    pos = positions.to(torch.float64)
    angle = (pos if pos.dim() == 2 else pos[None])[..., None] * inv.to(pos.device)  # [B|1, T, Dr/2]
    cos, sin = torch.cos(angle) * alpha, torch.sin(angle) * alpha
    if dtype != torch.float64:
        cos, sin = cos.float(), sin.float()
    return cos.to(dtype), sin.to(dtype)


def rope(x, cos, sin, interleaved):
    """x [B, T, ..., Dr] rotated by cos, sin [B|1, T, Dr/2] (broadcast over the middle dims):
    pairs (x[2i], x[2i+1]) when interleaved (DeepSeek's layout), else (x[i], x[i + Dr/2])."""
    shape = list(cos.shape[:2]) + [1] * (x.dim() - 3) + [cos.shape[-1]]
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    if interleaved:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)
    h = x.shape[-1] // 2
    x0, x1 = x[..., :h], x[..., h:]
    return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)


class RMSNorm(nn.Module):
    """y = x · (mean(x²) + eps)^-½ · weight over the last dim; statistics in fp32 at least (HF's DeepSeek)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))  # [dim]
        self.eps = eps

    def forward(self, x):
        xw = x.to(_wide(x.dtype))
        return self.weight * (xw * torch.rsqrt(xw.pow(2).mean(dim=-1, keepdim=True) + self.eps)).to(x.dtype)


class _AddLoss(torch.autograd.Function):
    """Returns y unchanged; backward also gives the scalar loss a gradient of 1, so y.backward(dy)
    differentiates ⟨dy, y⟩ + loss (DeepSeek's AddAuxiliaryLoss)."""

    @staticmethod
    def forward(ctx, y, loss):
        ctx.loss_dtype, ctx.loss_grad = loss.dtype, loss.requires_grad
        return y

    @staticmethod
    def backward(ctx, dy):
        return dy, torch.ones((), dtype=ctx.loss_dtype, device=dy.device) if ctx.loss_grad else None


class Indexer(nn.Module):
    """DeepSeek-V3.2's lightning indexer: index scores I [B, T, T] from xn and c^Q (docs/sparse.md S3–S4)."""

    def __init__(self, cfg):
        super().__init__()
        D, Lq = cfg["hidden_size"], cfg["q_lora_rank"] or 0
        self.HI, self.DI, self.Dr = cfg["index_n_heads"], cfg["index_head_dim"], cfg["qk_rope_head_dim"]
        self.wq_b = nn.Linear(Lq, self.HI * self.DI, bias=False)  # W^{I,Q} [H_I·D_I, Lq]
        self.wk = nn.Linear(D, self.DI, bias=False)  # W^{I,K} [D_I, D]
        self.k_norm = nn.LayerNorm(self.DI, eps=1e-6)  # weight, bias [D_I]
        self.weights_proj = nn.Linear(D, self.HI, bias=False)  # w^I [H_I, D]

    def forward(self, xn, cqn, cos, sin):
        """xn [B, T, D], cqn [B, T, Lq], cos/sin [B|1, T, Dr/2] -> I [B, T, T] (all s; the caller masks s > t)."""
        B, T, _ = xn.shape
        Dr = self.Dr
        q = self.wq_b(cqn).view(B, T, self.HI, self.DI)  # [B, T, H_I, D_I]
        q = torch.cat([rope(q[..., :Dr], cos, sin, False), q[..., Dr:]], dim=-1)  # q^I, rotate-half on the first Dr
        k = self.k_norm(self.wk(xn))  # [B, T, D_I]
        k = torch.cat([rope(k[..., :Dr], cos, sin, False), k[..., Dr:]], dim=-1)  # k^I, one key per token
        w = self.weights_proj(xn)  # w^I [B, T, H_I]
        dots = torch.relu(torch.einsum("btjd,bsd->btjs", q, k))  # [B, T, H_I, T]
        return torch.einsum("btjs,btj->bts", dots, w) * (self.HI * self.DI) ** -0.5  # I [B, T, T]


def _topk_mask(I, k):
    """C [B, T, T] bool: per query t the k largest I[t, s] over s ≤ t (all of them when t < k), ties to
    the lower position."""
    T = I.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=I.device).tril()  # [T, T]
    order = torch.sort(I.masked_fill(~causal, -math.inf), dim=-1, descending=True, stable=True).indices[..., :k]
    return torch.zeros(I.shape, dtype=torch.bool, device=I.device).scatter(-1, order, True) & causal  # [B, T, T]


class MultiheadLatentAttention(nn.Module):
    """Hugging Face DeepSeek-V3's `self_attn`: x̂ [B, T, D] (normalised) -> [B, T, D] (before the residual).

    config: a dict of laga's config.json keys (Hugging Face's names), or an object with .to_dict().
    init_std: None keeps torch's default Linear init; a number draws every Linear weight from N(0, std)
      (norm weights are ones either way).
    sparse: DeepSeek Sparse Attention (absorbed MQA over the indexer's top-k, docs/sparse.md). None: when
      the config has an indexer (index_n_heads > 0) and its `form`, if any, is a sparse one (dsa-*); a
      dense form keeps the indexer's weights, unused, as laga's dense forms do.
    In sparse mode the indexer loss L_I (unscaled, summed over B and T) is left in `self.indexer_loss`, and
    y's backward also differentiates indexer_loss_scale · L_I, so the indexer learns as in laga.
    """

    def __init__(self, config, init_std=None, sparse=None):
        super().__init__()
        cfg = dict(config_dict(config))
        self.cfg = cfg
        D, H = cfg["hidden_size"], cfg["num_attention_heads"]
        self.H, self.Lq, self.Lkv = H, cfg["q_lora_rank"] or 0, cfg["kv_lora_rank"]
        self.Dn, self.Dr, self.Dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        if self.Dr % 2:
            raise ValueError(f"qk_rope_head_dim {self.Dr} must be even (RoPE rotates pairs); try {self.Dr + 1}")
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.interleaved = cfg.get("rope_interleaved", cfg.get("rope_interleave", True))
        self.scale = softmax_scale(cfg)
        Dqk = self.Dn + self.Dr
        if self.Lq > 0:
            self.q_a_proj = nn.Linear(D, self.Lq, bias=False)  # wq_a [Lq, D]
            self.q_a_layernorm = RMSNorm(self.Lq, eps)  # q_norm [Lq]
            self.q_b_proj = nn.Linear(self.Lq, H * Dqk, bias=False)  # wq_b [H·Dqk, Lq]
        else:
            self.q_proj = nn.Linear(D, H * Dqk, bias=False)  # wq [H·Dqk, D]
        self.kv_a_proj_with_mqa = nn.Linear(D, self.Lkv + self.Dr, bias=False)  # wkv_a [Lkv+Dr, D]
        self.kv_a_layernorm = RMSNorm(self.Lkv, eps)  # kv_norm [Lkv]
        self.kv_b_proj = nn.Linear(self.Lkv, H * (self.Dn + self.Dv), bias=False)  # wkv_b [H·(Dn+Dv), Lkv]
        self.o_proj = nn.Linear(H * self.Dv, D, bias=False)  # wo [D, H·Dv]
        has_indexer = (cfg.get("index_n_heads") or 0) > 0
        if has_indexer:
            if self.Lq <= 0:
                raise ValueError("index_n_heads > 0 with q_lora_rank 0: the indexer's queries read c^Q; "
                                 "give q_lora_rank > 0 or index_n_heads 0")
            self.indexer = Indexer(cfg)
        self.sparse = (has_indexer and str(cfg.get("form") or "dsa-").startswith("dsa")) if sparse is None else sparse
        if self.sparse and not has_indexer:
            raise ValueError("sparse=True needs an indexer: set index_n_heads, index_head_dim, index_topk")
        self.topk, self.stage = cfg.get("index_topk", 0), cfg.get("indexer_stage", "sparse")
        self.loss_scale = float(cfg.get("indexer_loss_scale", 1.0))
        self.indexer_loss = None
        if init_std is not None:
            _init(self, init_std)

    def forward(self, x, positions=None):
        """x [B, T, D] normalised; positions [T] or [B, T] (RoPE's, default 0..T-1) -> [B, T, D]."""
        D = self.o_proj.out_features
        if x.dim() != 3 or x.shape[-1] != D:
            raise ValueError(f"x has shape {list(x.shape)}; expected [B, T, {D}] (batch first, hidden_size {D})")
        B, T, _ = x.shape
        H, Dn, Dr, Lkv = self.H, self.Dn, self.Dr, self.Lkv
        if positions is None:
            positions = torch.arange(T, device=x.device)
        if positions.shape not in (torch.Size([T]), torch.Size([B, T])):
            raise ValueError(f"positions has shape {list(positions.shape)}; expected [{T}] or [{B}, {T}]")
        cos, sin = rope_tables(self.cfg, positions, x.dtype)  # [B|1, T, Dr/2]

        cqn = None
        if self.Lq > 0:
            cqn = self.q_a_layernorm(self.q_a_proj(x))  # L1, L2: c^Q [B, T, Lq]
            q = self.q_b_proj(cqn)  # L3 [B, T, H·Dqk]
        else:
            q = self.q_proj(x)  # L3' [B, T, H·Dqk]
        q = q.view(B, T, H, Dn + Dr)
        q_nope, q_pe = q[..., :Dn], rope(q[..., Dn:], cos, sin, self.interleaved)  # [B, T, H, Dn], [B, T, H, Dr]
        kv = self.kv_a_proj_with_mqa(x)  # L4 [B, T, Lkv+Dr]
        ckv = self.kv_a_layernorm(kv[..., :Lkv])  # L5 c^KV [B, T, Lkv]
        kpe = rope(kv[..., Lkv:], cos, sin, self.interleaved)  # L6 k_pe [B, T, Dr], one head, no norm

        if self.sparse:
            o, loss = self._sparse(x, cqn, q_nope, q_pe, ckv, kpe, cos, sin)
            self.indexer_loss = loss.detach()
            return _AddLoss.apply(self.o_proj(o), self.loss_scale * loss)
        return self.o_proj(self._dense(q_nope, q_pe, ckv, kpe))  # E4 [B, T, D]

    def _dense(self, q_nope, q_pe, ckv, kpe):
        """The explicit form (docs/block.md E1–E3): per-head K/V from c^KV, causal attention -> o [B, T, H·Dv]."""
        B, T, H, Dn = q_nope.shape
        kvb = self.kv_b_proj(ckv).view(B, T, H, Dn + self.Dv)  # E1 [B, T, H, Dn+Dv], per head k-rows then v-rows
        q = torch.cat([q_nope, q_pe], dim=-1)  # [B, T, H, Dqk]
        k = torch.cat([kvb[..., :Dn], kpe[:, :, None, :].expand(B, T, H, self.Dr)], dim=-1)  # [B, T, H, Dqk]
        v = kvb[..., Dn:]  # [B, T, H, Dv]
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, .]
        s = torch.matmul(qh, kh.transpose(-1, -2)) * self.scale  # E3 scores [B, H, T, T]
        future = torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1)  # [T, T]
        p = torch.softmax(s.masked_fill(future, -math.inf), dim=-1, dtype=_wide(s.dtype)).to(qh.dtype)
        return torch.matmul(p, vh).transpose(1, 2).reshape(B, T, H * self.Dv)  # o [B, T, H·Dv]

    def _sparse(self, x, cqn, q_nope, q_pe, ckv, kpe, cos, sin):
        """DSA (docs/sparse.md S2–S7): the indexer on detached inputs picks C_t, the absorbed MQA attends
        over it -> o [B, T, H·Dv] and L_I (a scalar)."""
        B, T, H, Dn = q_nope.shape
        Lkv, Dv = self.Lkv, self.Dv
        I = self.indexer(x.detach(), cqn.detach(), cos, sin)  # S3, S4 [B, T, T]
        if self.stage == "warmup":  # dense main attention: every s ≤ t a candidate
            C = torch.ones(T, T, dtype=torch.bool, device=x.device).tril().expand(B, T, T)
        else:
            C = _topk_mask(I.detach(), min(self.topk, T))  # S_t [B, T, T]
        wkv_b = self.kv_b_proj.weight.view(H, Dn + Dv, Lkv)
        w_uk, w_uv = wkv_b[:, :Dn], wkv_b[:, Dn:]  # W_UK [H, Dn, Lkv], W_UV [H, Dv, Lkv]
        q_abs = torch.cat([torch.einsum("bthn,hnl->bthl", q_nope, w_uk), q_pe], dim=-1)  # S2 [B, T, H, Dl]
        k_lat = torch.cat([ckv, kpe], dim=-1)  # ℓ [B, T, Dl]
        s = torch.einsum("bthc,bsc->bhts", q_abs, k_lat) * self.scale  # [B, H, T, T]
        P = torch.softmax(s.masked_fill(~C[:, None], -math.inf), dim=-1, dtype=_wide(s.dtype)).to(s.dtype)
        o_lat = torch.einsum("bhts,bsl->bthl", P, ckv)  # S5 [B, T, H, Lkv]
        o = torch.einsum("bthl,hvl->bthv", o_lat, w_uv).reshape(B, T, H * Dv)  # S6 [B, T, H·Dv]
        # S7: L_I = Σ KL(p ‖ softmax_C I), p the heads' mean attention (detached), 0·log 0 = 0
        p = (P.detach().sum(dim=1) / H).masked_fill(~C, 0.0)  # [B, T, T]
        p = p / p.sum(dim=-1, keepdim=True)
        logq = torch.log_softmax(I.masked_fill(~C, -math.inf), dim=-1).masked_fill(~C, 0.0)  # [B, T, T]
        return o, (torch.xlogy(p, p) - p * logq).sum()


class MLABlock(nn.Module):
    """y = x + self_attn(input_layernorm(x)), x [B, T, D]: the attention half of a DeepSeek decoder layer,
    with parameters `input_layernorm.weight` and `self_attn.*`. Arguments as MultiheadLatentAttention's."""

    def __init__(self, config, init_std=None, sparse=None):
        super().__init__()
        cfg = config_dict(config)
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6))  # attn_norm [D]
        self.self_attn = MultiheadLatentAttention(cfg, init_std=init_std, sparse=sparse)

    def forward(self, x, positions=None):
        """x [B, T, D], positions [T] or [B, T] (default 0..T-1) -> [B, T, D]."""
        return x + self.self_attn(self.input_layernorm(x), positions)

    @property
    def indexer_loss(self):
        """self_attn's L_I of the last forward (sparse mode; None otherwise)."""
        return self.self_attn.indexer_loss


def _init(module, std):
    """Every Linear weight from N(0, std), norm weights ones, LayerNorm biases zeros."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
        elif isinstance(m, (RMSNorm, nn.LayerNorm)):
            nn.init.ones_(m.weight)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
