"""laga's forms as torch modules over a torch.distributed group.

What this module holds:
  MLABlock                  laga's block, y = x + MLA(RMSNorm(x)): a Hugging Face DeepSeek decoder
                            layer's attention half (input_layernorm.weight, self_attn.*)
  MultiheadLatentAttention  Hugging Face's self_attn alone: normed input, output before the residual
  local_positions, shard, unshard
                            which global tokens a rank holds under a form's layout, and the cutting
Both modules run laga's engine (stack_forward / stack_backward of one layer) through one
torch.autograd.Function; the caller's process group carries laga's collectives (laga._C's c10d
communicator: gloo on the CPU), bitwise the same as the CLI's threads and MPI backends. Not here:
the engine (laga._C), the plain PyTorch MLA to check against (laga.plain). docs/python.md has the API.

Activations: x is this rank's tokens in the form's layout, [B, N, D] (batch first, as Hugging Face)
or [N, B, D] with sequence_first=True (as Megatron), N = T / group size. laga works sequence first,
so [N, B, D] enters without a copy (as does [B, N, D] with B = 1). Parameters are float32 or
bfloat16 and the computation runs in their dtype.

Gradients: dx and every parameter's .grad through autograd. grad_reduction="sum" sums the weight
gradients over the group (every rank then holds the whole gradient); "none" leaves this rank's
partials for the caller's own data x context-parallel reduction. The sparse forms (dsa-*) add the
lightning indexer's gradient of indexer_loss_scale * L_I in backward; the last forward's L_I over
this rank's queries is `module.indexer_loss` (one float per layer, detached).
"""

import itertools
import math

import torch
import torch.distributed as dist
from torch import nn

from . import _C, Config

__all__ = ["MLABlock", "MultiheadLatentAttention", "local_positions", "shard", "unshard"]

_GRAD_REDUCTIONS = ("sum", "none")
_groups = {}  # torch process group -> its laga._C.Group
_counter = itertools.count()


def _laga_group(group, timeout_s):
    """laga's communicator on a torch.distributed group (None: this process alone), made once per
    group: every module on the group shares it, its ledger and its memory tracker. Every rank of
    the group makes its first module on it at the same point, as for any collective."""
    if group is None:
        return _C.one_rank_group()
    if not dist.is_initialized():
        raise ValueError("group is given but torch.distributed is not initialized; call "
                         "torch.distributed.init_process_group first, or pass group=None")
    if group in _groups:
        return _groups[group]
    pg_map = dist.distributed_c10d._pg_map
    if group not in pg_map:
        raise ValueError(f"group {group!r} is not a torch.distributed process group of this "
                         "process; pass torch.distributed.group.WORLD or one new_group made")
    backend, store = pg_map[group]
    if store is None:
        raise ValueError(f"group of backend {backend} has no store; laga runs over gloo groups")
    _groups[group] = _C.c10d_group(group, store, f"laga/{next(_counter)}", timeout_s)
    return _groups[group]


def _tree(module, key, param):
    """Registers param under the dotted Hugging Face key (self_attn.q_a_proj.weight)."""
    *path, leaf = key.split(".")
    for name in path:
        child = getattr(module, name, None)
        if child is None:
            child = nn.Module()
            module.add_module(name, child)
        module = child
    module.register_parameter(leaf, param)


class _Engine(torch.autograd.Function):
    """One block on this rank: forward keeps the engine's saved state (a laga._C.Step), backward
    returns dx and every weight's gradient."""

    @staticmethod
    def forward(ctx, owner, flags, x, *params):
        weights = {name: p.detach() for name, p in zip(owner._names, params)}
        y, step = _C.forward(flags, owner._group, weights, x.detach())
        owner.indexer_loss = list(step.indexer_loss)
        ctx.step = step
        ctx.owner = owner
        return y

    @staticmethod
    def backward(ctx, dy):
        owner = ctx.owner
        dx, grads = _C.backward(ctx.step, dy.contiguous(), owner.grad_reduction == "sum")
        ctx.step = None
        return (None, None, dx) + tuple(grads[name] for name in owner._names)


class _Attention(nn.Module):
    """What MLABlock and MultiheadLatentAttention share: the engine over one layer."""

    _attention_only = False

    def __init__(self, config, form="laga", kernel="fused", group=None, ulysses=None,
                 overlap=False, sequence_first=False, grad_reduction="sum", timeout_s=0.0,
                 dtype=torch.float32):
        super().__init__()
        if not isinstance(config, Config):
            raise TypeError(f"config is a {type(config).__name__}; give a laga.Config "
                            "(laga.Config.preset or laga.Config.from_hf)")
        if grad_reduction not in _GRAD_REDUCTIONS:
            raise ValueError(f"grad_reduction {grad_reduction!r} is not one of {_GRAD_REDUCTIONS}")
        if dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"dtype {dtype} is not float32 or bfloat16")
        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"group is a {type(group).__name__}; give a torch.distributed "
                            "ProcessGroup or None")
        self.config = config
        self.form = form
        self.kernel = kernel
        self.ulysses = ulysses
        self.overlap = overlap
        self.sequence_first = sequence_first
        self.grad_reduction = grad_reduction
        self.indexer_loss = []
        self.process_group = group
        size = 1 if group is None else dist.get_world_size(group)
        # Checked now, with a sequence the group can hold, so that a bad form, kernel, dtype or
        # head count raises here (on every rank alike) rather than inside a collective.
        self._check_flags(size)
        self._hidden = config.to_dict()["hidden_size"]
        self._valid = set()  # the engine flags forward has checked
        self._group = _laga_group(group, timeout_s)
        self._names, self._keys = [], []
        for name, hf_key, shape in _C.weights(self._flags(seq=1, batch=1, sp=1)):
            if self._attention_only and hf_key.startswith("self_attn."):
                hf_key = hf_key[len("self_attn."):]
            self._names.append(name)
            self._keys.append(hf_key)
            _tree(self, hf_key, nn.Parameter(torch.empty(shape, dtype=dtype)))
        self.reset_parameters()

    def reset_parameters(self):
        """Matrices as torch.nn.Linear initialises them (uniform in +-1/sqrt(in)), norm weights 1,
        biases 0."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    bound = 1 / math.sqrt(p.shape[1])
                    p.uniform_(-bound, bound)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    p.fill_(1)

    def _flags(self, seq, batch, sp, dtype=None):
        options = dict(seq=seq, batch=batch, sp=sp, layers=1, form=self.form, kernel=self.kernel,
                       overlap="on" if self.overlap else "off", ulysses=self.ulysses,
                       attention_only=self._attention_only)
        if dtype is not None:
            options["dtype"] = dtype
        return self.config.flags(**options)

    def _check_flags(self, size):
        # The smallest sequence every layout of size ranks can cut: 2 * size tokens per chunk pair.
        _C.config_json(self._flags(seq=2 * size * max(1, self.ulysses or 1), batch=1, sp=size),
                       validate=True)

    def _ordered_params(self):
        by_key = dict(self.named_parameters())
        return [by_key[k] for k in self._keys]

    def forward(self, x):
        try:
            xs, flags, params = self._inputs(x)
        except (TypeError, ValueError) as e:
            # Every other rank is, or soon will be, in this forward's collectives: bring the group
            # down so that they raise too instead of waiting.
            if self._group.size > 1:
                self._group.abort(f"rank {self._group.rank}: {e}")
            raise
        y = _Engine.apply(self, flags, xs, *params)
        return y if self.sequence_first else y.transpose(0, 1)

    def _inputs(self, x):
        """x in laga's layout [N, B, D], the engine's flags for it, the parameters in the engine's
        order; TypeError or ValueError for bad input."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x is a {type(x).__name__}; give a torch.Tensor")
        params = self._ordered_params()
        dtype = params[0].dtype
        if any(p.dtype != dtype for p in params):
            raise TypeError("the parameters have dtypes "
                            f"{sorted({str(p.dtype) for p in params})}; give them one "
                            "(module.to(torch.float32) or module.to(torch.bfloat16))")
        if dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"the parameters are {dtype}; laga runs float32 or bfloat16")
        if x.dtype != dtype:
            raise TypeError(f"x is {x.dtype} but the parameters are {dtype}; give x in their "
                            "dtype (module.to(dtype) casts the parameters)")
        if x.dim() != 3:
            layout = "[N, B, D]" if self.sequence_first else "[B, N, D]"
            raise ValueError(f"x has shape {list(x.shape)}; expected {layout} (this rank's "
                             "tokens)")
        xs = x if self.sequence_first else x.transpose(0, 1)
        xs = xs.contiguous()
        n, b, _ = xs.shape
        size = self._group.size
        d = self._hidden
        if xs.shape[2] != d:
            raise ValueError(f"x has shape {list(x.shape)}: its last dimension is not hidden_size "
                             f"{d}")
        flags = self._flags(seq=n * size, batch=b, sp=size,
                            dtype="fp32" if dtype == torch.float32 else "bf16")
        if tuple(flags) not in self._valid:  # T = N * size must suit the form and layout
            _C.config_json(flags, validate=True)
            self._valid.add(tuple(flags))
        return xs, flags, params

    def ledger(self):
        """Every collective laga ran on this rank's group (every laga module on it) since the
        last clear_ledger(): op, tensor, dtype, tensor_bytes, wire_bytes, seconds, wait_s."""
        return self._group.ledger()

    def clear_ledger(self):
        self._group.clear_ledger()

    def local_positions(self, seq):
        """The global positions this rank's tokens hold under this module's form at length seq."""
        return local_positions(self.form, seq, self._group.rank, self._group.size,
                               config=self.config, ulysses=self.ulysses)


class MLABlock(_Attention):
    """laga's block, y = x + MLA(RMSNorm(x)): parameters named as a Hugging Face DeepSeek decoder
    layer's attention half (input_layernorm.weight, self_attn.q_a_proj.weight, ...), so
    load_state_dict takes a checkpoint's model.layers.{l}. entries as they are."""


class MultiheadLatentAttention(_Attention):
    """Hugging Face's self_attn: the input already normalised, the output before the residual.
    The same parameter names as MLABlock's without the self_attn. prefix."""

    _attention_only = True


def local_positions(form, seq, rank, size, config=None, ulysses=None, cp_layout=None):
    """The global token positions rank holds, in local order, when form runs a sequence of seq
    tokens over size ranks (a list of ints). The model (config, deepseek-v3 by default) matters
    only for what the form can run (a head-scatter form needs size | heads)."""
    config = config if config is not None else Config.preset("deepseek-v3")
    flags = config.flags(seq=seq, sp=size, form=form, ulysses=ulysses, cp_layout=cp_layout,
                         batch=1, layers=1)
    out = []
    for pos0, length in _C.segments(flags, rank):
        out.extend(range(pos0, pos0 + length))
    return out


def shard(x_full, form, rank, size, config=None, ulysses=None, cp_layout=None,
          sequence_first=False):
    """This rank's tokens of a whole sequence x_full ([B, T, D], or [T, B, D] with
    sequence_first) under form's layout: the input a module takes on rank."""
    dim = 0 if sequence_first else 1
    idx = local_positions(form, x_full.shape[dim], rank, size, config, ulysses, cp_layout)
    return x_full.index_select(dim, torch.tensor(idx, dtype=torch.long))


def unshard(y_local, form, group=None, config=None, ulysses=None, cp_layout=None,
            sequence_first=False):
    """The whole sequence from every rank's y_local (a collective over group; None: one rank):
    the inverse of shard, on every rank."""
    dim = 0 if sequence_first else 1
    size = 1 if group is None else dist.get_world_size(group)
    n = y_local.shape[dim]
    if size == 1:
        parts = [y_local]
    else:
        # gloo moves no bfloat16 (nor int16): the bits travel as bytes
        send = y_local.contiguous()
        wire = send.view(torch.uint8) if send.dtype == torch.bfloat16 else send
        bufs = [torch.empty_like(wire) for _ in range(size)]
        dist.all_gather(bufs, wire, group=group)
        parts = [b.view(send.dtype) for b in bufs]
    shape = list(y_local.shape)
    shape[dim] = n * size
    out = y_local.new_empty(shape)
    for r, part in enumerate(parts):
        idx = torch.tensor(local_positions(form, n * size, r, size, config, ulysses, cp_layout),
                           dtype=torch.long)
        out.index_copy_(dim, idx, part)
    return out
