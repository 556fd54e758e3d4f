"""laga: Multi-head Latent Attention training under sequence parallelism, from Python.

What this module holds: the engine's configuration (`Config`), its registry of forms (`forms`), and
its planning and performance model (`plan`, `model`), run in this process by the same code as the
CLI's commands (no subprocess): the dicts they return are what `laga plan --json` and
`laga model --json` write. The torch modules are in `laga.torch`; a plain PyTorch MLA to check them
against is `laga.plain`. docs/python.md has the API and a complete example.

Bad input raises ValueError carrying the CLI's message, which names the value and valid ones.
"""

import json
import os
import tempfile

import torch  # noqa: F401  (loads libtorch before the extension, which links it)

from . import _C

__all__ = ["Config", "forms", "plan", "model", "resource_dir"]


def _binary():
    """The laga binary beside this package: build/bin/laga in the build tree (the package is
    build/python/laga), DIR/bin/laga when installed (the package is
    DIR/lib/python3/dist-packages/laga)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for up in (2, 4):
        root = os.path.normpath(os.path.join(here, *[".."] * up))
        exe = os.path.join(root, "bin", "laga")
        if os.path.isfile(exe) and os.path.isdir(os.path.join(root, "share", "laga")):
            return exe
    raise ImportError(
        f"laga: no bin/laga with share/laga two or four levels above {here}: build laga "
        "(cmake --build build) or install it (cmake --install build --prefix DIR)")


_C.set_binary(_binary())


def resource_dir():
    """Where the CLI's resources (hardware files docs/hw/*.json, scripts) are: share/laga."""
    return os.path.join(os.path.dirname(os.path.dirname(_binary())), "share", "laga")


def _flag(key, value):
    """One CLI option from a snake_case keyword: seq=2048 -> ["--seq", "2048"]."""
    name = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return [name] if value else []
    if isinstance(value, (list, tuple)):
        return [name, ",".join(str(v) for v in value)]
    return [name, str(value)]


def _flags(options):
    out = []
    for key, value in options.items():
        if value is not None:
            out += _flag(key, value)
    return out


class Config:
    """A laga configuration: a preset or a Hugging Face config.json, with the CLI's options as
    snake_case keywords (seq=, sp=, batch=, form=, kernel=, dtype=, layers=, ulysses=, overlap=,
    index_topk=, ...). Resolved and validated by the engine when used; to_dict() is what a dump's
    config.json holds."""

    def __init__(self, model=None, hf=None, options=None):
        self._model = model
        self._hf = hf  # a Hugging Face config dict, or None
        self._options = dict(options or {})
        self._hf_file = None
        self.to_dict()  # the options are checked now: a bad one raises here

    @classmethod
    def preset(cls, name, **overrides):
        """A preset (deepseek-v3, deepseek-v3.2, deepseek-v2-lite, small, tiny) with overrides."""
        return cls(model=name, options=overrides)

    @classmethod
    def from_hf(cls, path_or_dict, **overrides):
        """A Hugging Face DeepSeek config.json (a path, or the dict it holds); extra keys ignored."""
        if isinstance(path_or_dict, dict):
            hf = dict(path_or_dict)
        else:
            with open(path_or_dict) as f:
                hf = json.load(f)
        return cls(hf=hf, options=overrides)

    def replace(self, **overrides):
        """This configuration with more options set (None removes one)."""
        options = dict(self._options)
        options.update(overrides)
        return Config(model=self._model, hf=self._hf, options=options)

    def get(self, key, default=None):
        return self._options.get(key, default)

    def flags(self, **overrides):
        """The CLI flags of this configuration with overrides (None removes one)."""
        options = dict(self._options)
        options.update(overrides)
        out = []
        if self._hf is not None:
            if self._hf_file is None:
                fd, self._hf_file = tempfile.mkstemp(prefix="laga-config-", suffix=".json")
                with os.fdopen(fd, "w") as f:
                    json.dump(self._hf, f)
            out += ["--config", self._hf_file]
        elif self._model is not None:
            out += ["--model", self._model]
        return out + _flags(options)

    def to_dict(self, **overrides):
        """The resolved configuration: the keys of a dump's config.json. Validated when it names
        a sequence length (seq=); without one it has no seq_len and is checked key by key only."""
        options = dict(self._options)
        options.update(overrides)
        if options.get("seq") is None:
            d = json.loads(_C.config_json(self.flags(**dict(overrides, seq=1)), validate=False))
            d.pop("seq_len", None)
            return d
        return json.loads(_C.config_json(self.flags(**overrides), validate=True))

    def __repr__(self):
        source = self._model if self._hf is None else "hf"
        return f"laga.Config({source!r}, {self._options!r})"

    def __del__(self):
        if self._hf_file is not None and os.path.exists(self._hf_file):
            os.unlink(self._hf_file)


def forms():
    """The registered forms, in registry order (explicit first), each a dict: name, family,
    summary, sparse, layout (its token layout by default), output (heads or tokens), takes_ulysses,
    own_kernel (the attention kernel it runs whatever the config's kernel says; "" if none),
    exact_at_one_rank."""
    return _C.forms()


def _command(command, config, extra, options):
    if not isinstance(config, Config):
        config = Config.preset(config)
    # plan and model run every form: a config's own form is not theirs to take
    flags = config.flags(**dict(options, form=None))
    fd, path = tempfile.mkstemp(prefix=f"laga-{command}-", suffix=".json")
    os.close(fd)
    try:
        status, message = _C.cli([command] + flags + extra + ["--json", path], quiet=True)
        if status == 2:
            raise ValueError(message)
        if status != 0:
            raise RuntimeError(f"laga {command} failed (exit {status}): {message}")
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def plan(config, **options):
    """`laga plan` in this process: every form's memory and traffic for the configuration with
    options (seq=, sp=, batch=, kernel=, dtype=, layers=, ...); the dict `laga plan --json` writes."""
    return _command("plan", config, [], options)


def model(config, hw, **options):
    """`laga model` in this process: every form's predicted step time on the hardware file `hw` (a
    path, or the name of one in share/laga/docs/hw without .json); the dict `laga model --json`
    writes."""
    if not os.path.sep in hw and not hw.endswith(".json"):
        named = os.path.join(resource_dir(), "docs", "hw", hw + ".json")
        if not os.path.exists(named):
            known = sorted(f[:-5] for f in os.listdir(os.path.dirname(named)))
            raise ValueError(f"hw {hw!r} is no hardware file; try a path or one of {known}")
        hw = named
    return _command("model", config, ["--hw", hw], options)
