#!/usr/bin/python3
"""A byte-level language model trained with laga's Multi-head Latent Attention, sequence parallel.

The model: a 256-byte vocabulary, an embedding E [256, D], L layers of
    h = MLABlock(h)                                  h + MLA(RMSNorm(h)), the attention half
    h = h + SwiGLU(RMSNorm(h))                       down(silu(gate(·)) · up(·)), hidden F
a final RMSNorm and a tied head, logits = h · Eᵀ. The attention is laga.torch.MLABlock
(--attention laga) or laga.plain.MLABlock (--attention torch: plain PyTorch, the whole sequence);
both carry the same parameter names and start from the same seeded weights, so their runs compare
step by step and a checkpoint of one resumes in the other. D and the attention's dims are laga's
preset (--model tiny|small).

The data: the license texts Debian ships in /usr/share/common-licenses/ on every system, English
prose: Apache-2.0, Artistic, BSD, CC0-1.0, GFDL-1.2, GFDL-1.3, GPL-1, GPL-2, GPL-3, LGPL-2, LGPL-2.1,
LGPL-3, MPL-1.1, MPL-2.0 (every regular file, in sorted order; the links GFDL, GPL and LGPL name
files already read), concatenated as bytes (about 237 KB). The last 10 % is held out. Step s trains
on --batch windows of T+1 bytes at random offsets drawn from a generator seeded with (--seed, s), so
a resumed run sees the batches it would have seen. Validation: --eval-windows fixed windows evenly
spread over the held-out bytes; bits per byte = mean cross-entropy (nats) / ln 2.

Sequence parallelism (torchrun, gloo): every rank draws the same windows and keeps its own tokens,
at the positions laga.torch.local_positions names; the embedding, the MLPs, the norms and the head
are per token and run on them, laga's attention exchanges what it needs over the group. The loss
is the mean over all B·T tokens: each rank differentiates its tokens' cross-entropy sum divided by
B·T, the report all-reduces it. laga's modules sum their weights' gradients over the group; every
other parameter's gradient is all-reduced (summed) here, since each rank saw different tokens. With
--attention torch every rank runs the whole sequence (the same work, the same gradients).

Usage:
  /usr/bin/python3 examples/train_lm.py --attention torch             one process, plain PyTorch MLA
  /usr/bin/python3 examples/train_lm.py                                laga at sp 1
  /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 -r 1 -t 1 examples/train_lm.py --form laga
(-r 1 -t 1: torchrun's default stream settings do not parse under torch 1.13 with Python 3.11, as on
Debian 12; newer torch runs without them.) The defaults (tiny, 2 layers, T 256, B 4, 300 steps) take
minutes on two CPU cores; `laga report` trains it both ways (docs/report.md). Options: --help.
--json OUT writes the arguments, the configuration, the data, the processes and their threads, per-step
train loss (nats), learning rate and step time, and the validation bits per byte of each evaluation.
--checkpoint PATH saves the model, the optimizer and the step; --resume PATH continues from it, with the
losses of the run that was never stopped, bit for bit (--stop-at STEP ends a run early as an
interruption would, the schedule still that of --steps).
"""
import argparse
import importlib.util
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LICENSES = "/usr/share/common-licenses"


# --------------------------------------------------------------------------------------------
# laga: the configuration and the attention.


def import_plain():
    """laga.plain; loaded from the source tree when the package (with its extension) is not installed."""
    try:
        from laga import plain
        return plain
    except ImportError:
        path = os.path.join(ROOT, "python", "laga", "plain.py")
        if not os.path.isfile(path):
            raise SystemExit("train_lm.py: --attention torch needs laga.plain: put laga's package on PYTHONPATH "
                             "(build/python, or DIR/lib/python3/dist-packages installed)")
        spec = importlib.util.spec_from_file_location("laga_plain", path)
        plain = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(plain)
        return plain


# laga's presets tiny and small as config.json writes them, for --attention torch where laga is not
# installed; with laga, laga.Config.preset gives them.
PRESETS = {
    "tiny": dict(hidden_size=64, num_attention_heads=8, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
                 qk_rope_head_dim=8, v_head_dim=12, index_n_heads=4, index_head_dim=32, index_topk=16),
    "small": dict(hidden_size=1024, num_attention_heads=16, q_lora_rank=512, kv_lora_rank=512,
                  qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, index_n_heads=8,
                  index_head_dim=64, index_topk=64),
}


def attention_config(args, sp):
    """(laga.Config or None, its config.json dict). A dense form runs without the preset's indexer."""
    sparse = args.form.startswith("dsa")
    no_indexer = {} if sparse else dict(index_heads=0, index_dim=0, index_topk=0)
    try:
        import laga
    except ImportError as e:
        if args.attention == "laga":
            raise SystemExit(f"train_lm.py: --attention laga needs the laga package ({e}); put its build "
                             "tree's python/ on PYTHONPATH, or run --attention torch")
        cfg = dict(PRESETS[args.model], model=args.model, form=args.form, seq_len=args.seq, batch=args.batch,
                   sp=1, dtype=args.dtype, rms_norm_eps=1e-6, rope_theta=10000.0, rope_interleaved=True,
                   rope_scaling=dict(type="yarn", factor=40.0, original_max_position_embeddings=4096,
                                     beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0))
        if not sparse:
            cfg.update(index_n_heads=0, index_head_dim=0, index_topk=0)
        return None, cfg
    config = laga.Config.preset(args.model, seq=args.seq, batch=args.batch, dtype=args.dtype, form=args.form,
                                kernel=args.kernel, sp=sp, **no_indexer)
    return config, config.to_dict()


# --------------------------------------------------------------------------------------------
# The model.


class SwiGLU(nn.Module):
    def __init__(self, D, Fh):
        super().__init__()
        self.gate_proj = nn.Linear(D, Fh, bias=False)  # [F, D]
        self.up_proj = nn.Linear(D, Fh, bias=False)  # [F, D]
        self.down_proj = nn.Linear(Fh, D, bias=False)  # [D, F]

    def forward(self, x):  # x [B, N, D] -> [B, N, D]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, attn, D, Fh, eps, RMSNorm):
        super().__init__()
        self.attn = attn  # h + MLA(RMSNorm(h))
        self.post_attention_layernorm = RMSNorm(D, eps)  # [D]
        self.mlp = SwiGLU(D, Fh)

    def forward(self, h):  # h [B, N, D] -> [B, N, D]
        h = self.attn(h)
        return h + self.mlp(self.post_attention_layernorm(h))


class ByteLM(nn.Module):
    def __init__(self, attns, D, Fh, eps, RMSNorm):
        super().__init__()
        self.embed_tokens = nn.Embedding(256, D)  # E [256, D], also the head
        self.layers = nn.ModuleList(Layer(a, D, Fh, eps, RMSNorm) for a in attns)
        self.norm = RMSNorm(D, eps)  # [D]

    def forward(self, idx):  # idx [B, N] bytes -> logits [B, N, 256]
        h = self.embed_tokens(idx)  # [B, N, D]
        for layer in self.layers:
            h = layer(h)
        return self.norm(h) @ self.embed_tokens.weight.t()  # tied head


def build_model(args, cfg, plain, L):
    """The seeded model with plain attention, identical on every rank: every Linear weight from
    N(0, 1/fan_in), the residual branches' outputs (o_proj, down_proj) also scaled by 1/√(2L), the
    embedding N(0, 0.02), norms ones."""
    torch.manual_seed(args.seed)
    D, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
    Fh = -(-8 * D // 3 // 64) * 64  # SwiGLU's 8D/3, rounded up to a multiple of 64
    model = ByteLM([plain.MLABlock(cfg) for _ in range(L)], D, Fh, eps, plain.RMSNorm)
    for name, p in model.named_parameters():
        if name == "embed_tokens.weight":
            nn.init.normal_(p, 0.0, 0.02)
        elif p.dim() == 2:
            residual = name.endswith("o_proj.weight") or name.endswith("down_proj.weight")
            nn.init.normal_(p, 0.0, p.shape[1] ** -0.5 / (math.sqrt(2 * L) if residual else 1.0))
    return model


def use_laga_attention(model, config, args, group):
    """Each layer's plain attention replaced by laga.torch.MLABlock with the same weights; -> this
    rank's token positions [N] (the form's layout)."""
    import laga.torch

    for layer in model.layers:
        block = laga.torch.MLABlock(config, form=args.form, kernel=args.kernel, group=group)
        block.load_state_dict(layer.attn.state_dict())
        layer.attn = block
    return torch.tensor(model.layers[0].attn.local_positions(args.seq), dtype=torch.long)


def indexer_loss(model):
    """The sparse attention's indexer loss L_I of the last forward, summed over the layers (this
    rank's queries with laga, every query with plain attention)."""
    return sum(float(sum(layer.attn.indexer_loss)) if isinstance(layer.attn.indexer_loss, list)
               else float(layer.attn.indexer_loss) for layer in model.layers)


# --------------------------------------------------------------------------------------------
# Data.


def load_text():
    """(bytes as uint8 tensor, file names): the regular files of LICENSES in sorted order."""
    names = sorted(n for n in os.listdir(LICENSES)
                   if os.path.isfile(os.path.join(LICENSES, n)) and not os.path.islink(os.path.join(LICENSES, n)))
    if not names:
        raise SystemExit(f"train_lm.py: {LICENSES} holds no text files (Debian's base-files ships them)")
    data = b"".join(open(os.path.join(LICENSES, n), "rb").read() for n in names)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long(), names


def train_batch(train, step, args):
    """Step `step`'s windows: inputs, targets [B, T], the same on every rank."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    starts = torch.randint(0, len(train) - args.seq - 1, (args.batch,), generator=g)
    w = torch.stack([train[s:s + args.seq + 1] for s in starts.tolist()])  # [B, T+1]
    return w[:, :-1], w[:, 1:]


# --------------------------------------------------------------------------------------------
# Training.


def lr_at(step, args):
    """Linear warm-up over the first 5 % of the steps, then cosine decay to lr/10."""
    warm = max(1, args.steps // 20)
    if step < warm:
        return args.lr * (step + 1) / warm
    t = (step - warm) / max(1, args.steps - warm)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


class Trainer:
    def __init__(self, args, model, laga_blocks, group, size, positions):
        self.args, self.model, self.group = args, model, group
        self.size, self.positions = size, positions  # this rank's token positions [N]
        self.sparse = args.form.startswith("dsa")
        owned = {id(p) for b in laga_blocks for p in b.parameters()}  # their gradients arrive summed
        self.shared = [p for p in model.parameters() if id(p) not in owned]
        # by name: the optimiser's state lines up whichever attention registered its parameters first
        params = [p for _, p in sorted(model.named_parameters(), key=lambda item: item[0]) if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        rest = [p for p in params if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                      {"params": rest, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))

    def loss_sum(self, inp, tgt):
        """Cross-entropy (nats) summed over this rank's tokens of inp, tgt [B, T]."""
        inp, tgt = inp[:, self.positions], tgt[:, self.positions]  # [B, N]
        logits = self.model(inp)  # [B, N, 256]
        return F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten(), reduction="sum")

    def all_reduce(self, t):
        if self.size > 1:
            dist.all_reduce(t, group=self.group)
        return t

    def step(self, inp, tgt, lr):
        """One optimiser step; -> (the mean loss (nats) over all B·T tokens, the indexer loss or None)."""
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_sum(inp, tgt) / inp.numel()
        loss.backward()
        if self.size > 1:  # per-token parameters: each rank holds the gradient of its own tokens
            grads = [p.grad for p in self.shared if p.grad is not None]
            flat = self.all_reduce(torch.cat([g.reshape(-1).float() for g in grads]))  # gloo sums no bf16
            for g, v in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(v.view_as(g))
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.clip)
        self.opt.step()
        il = float(self.all_reduce(torch.tensor(indexer_loss(self.model)))) if self.sparse else None
        return float(self.all_reduce(loss.detach().float())), il

    @torch.no_grad()
    def val_bpb(self, val):
        """Bits per byte over the fixed held-out windows."""
        T, n = self.args.seq, self.args.eval_windows
        starts = torch.linspace(0, len(val) - T - 1, n).long().tolist()
        total = torch.zeros((), dtype=torch.float64)
        for i in range(0, n, self.args.batch):
            w = torch.stack([val[s:s + T + 1] for s in starts[i:i + self.args.batch]])  # [b, T+1]
            total += self.loss_sum(w[:, :-1], w[:, 1:]).double()
        return float(self.all_reduce(total)) / (n * T) / math.log(2)


def save_checkpoint(path, model, opt, step, args):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "args": vars(args)}, tmp)
    os.replace(tmp, path)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--attention", choices=["laga", "torch"], default="laga",
                   help="laga.torch.MLABlock, or laga.plain's PyTorch MLA on the whole sequence")
    p.add_argument("--model", choices=sorted(PRESETS), default="tiny", help="laga preset: hidden size and MLA dims")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=256, help="T, bytes per sequence")
    p.add_argument("--batch", type=int, default=4, help="B, sequences per step")
    p.add_argument("--steps", type=int, default=300, help="the schedule's length")
    p.add_argument("--stop-at", type=int, metavar="STEP",
                   help="end after this step, as an interrupted run would (the schedule still spans --steps)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    p.add_argument("--weight-decay", type=float, default=0.1, help="on matrices and the embedding")
    p.add_argument("--clip", type=float, default=1.0, help="gradient norm clip")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="every parameter and activation (bf16: AdamW on bf16 weights, no fp32 copy)")
    p.add_argument("--form", default="laga", help="laga's form (explicit, absorbed, laga, dsa-gather, ...)")
    p.add_argument("--kernel", default="fused", help="laga's attention kernel")
    p.add_argument("--seed", type=int, default=0, help="weights and data windows")
    p.add_argument("--eval-every", type=int, default=50, help="steps between validations (0: at the end only)")
    p.add_argument("--eval-windows", type=int, default=32, help="held-out windows of T+1 bytes")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--checkpoint", metavar="PATH", help="save model, optimizer and step here")
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--resume", metavar="PATH", help="continue from a --checkpoint file")
    p.add_argument("--json", metavar="OUT", help="per-step loss and time, validation bits per byte")
    args = p.parse_args(argv)
    for name in ("layers", "seq", "batch", "steps", "eval_windows", "log_every", "checkpoint_every"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)} must be positive")
    if args.stop_at is not None and not 0 < args.stop_at <= args.steps:
        p.error(f"--stop-at {args.stop_at} must be in 1 .. --steps {args.steps}")
    return args


def main(argv):
    args = parse_args(argv)
    group, rank, size = None, 0, 1
    if "WORLD_SIZE" in os.environ:  # started by torchrun
        dist.init_process_group("gloo")
        group, rank, size = dist.group.WORLD, dist.get_rank(), dist.get_world_size()
    log = print if rank == 0 else (lambda *a, **k: None)

    text, files = load_text()
    split = len(text) * 9 // 10
    train, val = text[:split], text[split:]
    log(f"# data: {len(files)} files of {LICENSES}, {len(text)} bytes ({len(train)} train, {len(val)} validation)")

    sp = size if args.attention == "laga" else 1  # torch attention: every rank runs the whole sequence
    config, cfg = attention_config(args, sp)
    plain = import_plain()
    model = build_model(args, cfg, plain, args.layers)
    positions = torch.arange(args.seq)
    if args.attention == "laga":
        positions = use_laga_attention(model, config, args, group if size > 1 else None)
    if args.dtype == "bf16":
        model.to(torch.bfloat16)
    laga_blocks = [layer.attn for layer in model.layers] if args.attention == "laga" else []
    trainer = Trainer(args, model, laga_blocks, group, sp, positions)

    start = 0
    if args.resume:
        ck = torch.load(args.resume, map_location="cpu")
        model.load_state_dict(ck["model"])
        trainer.opt.load_state_dict(ck["optimizer"])
        start = ck["step"]
        log(f"# resumed from {args.resume} at step {start}")

    n_params = sum(p.numel() for p in model.parameters())
    log(f"# model {args.model}: D {cfg['hidden_size']}, H {cfg['num_attention_heads']}, {args.layers} layers, "
        f"{n_params} parameters; attention {args.attention}, form {args.form}, dtype {args.dtype}; "
        f"T {args.seq}, B {args.batch}, {size} process(es), {torch.get_num_threads()} thread(s) each")
    out = {"args": vars(args), "config": cfg, "processes": size, "threads": torch.get_num_threads(),
           "torch": torch.__version__, "parameters": n_params,
           "data": {"dir": LICENSES, "files": files, "bytes": len(text), "train_bytes": len(train),
                    "val_bytes": len(val)},
           "steps": [], "evals": []}

    def write_json():
        if args.json and rank == 0:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)

    def evaluate(step):
        bpb = trainer.val_bpb(val)
        out["evals"].append({"step": step, "val_bpb": bpb})
        log(f"step {step:5d}  validation {bpb:.4f} bits/byte")
        write_json()

    if start == 0 and args.eval_every:
        evaluate(0)
    end = args.stop_at or args.steps
    for step in range(start, end):
        inp, tgt = train_batch(train, step, args)
        lr = lr_at(step, args)
        t0 = time.perf_counter()
        loss, il = trainer.step(inp, tgt, lr)
        dt = time.perf_counter() - t0
        if not math.isfinite(loss):
            raise SystemExit(f"train_lm.py: the loss is {loss} at step {step + 1}; try a smaller --lr")
        out["steps"].append({"step": step + 1, "loss": loss, "lr": lr, "time_s": dt,
                             **({"indexer_loss": il} if il is not None else {})})
        if (step + 1) % args.log_every == 0 or step == start:
            log(f"step {step + 1:5d}  loss {loss:.4f} ({loss / math.log(2):.3f} bits/byte)  lr {lr:.2e}  "
                f"{dt * 1e3:.0f} ms" + (f"  indexer loss {il:.4f}" if il is not None else ""))
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 != end:
            evaluate(step + 1)
        if args.checkpoint and rank == 0 and ((step + 1) % args.checkpoint_every == 0 or step + 1 == end):
            save_checkpoint(args.checkpoint, model, trainer.opt, step + 1, args)
    if start < end or not out["evals"]:
        evaluate(end)
    times = sorted(s["time_s"] for s in out["steps"])
    if times:
        log(f"# median step {times[len(times) // 2] * 1e3:.0f} ms")
    write_json()
    if size > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
