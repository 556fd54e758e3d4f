"""What report.py and its section modules share: reading the steps' JSON, markdown tables and plots, the
registered forms and the kernel each runs, and the FLOP conventions of the throughput figures."""
import json
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# arXiv 2607.17644's figures, quoted beside the measurements (docs/design.md §5).
PAPER = {
    "comm_ratio_h128": 1.98, "comm_ratio_h16": 1.88,
    "absorbed_memory": "+20–34 %", "laga_memory": "within 0.5 % (< 27 MB)",
    "single_node": {4096: 1.05, 8192: 1.06, 16384: 1.04},
    "two_nodes": {4096: 1.07, 8192: 1.15, 16384: 1.24},
}

# The targets report.md opens with; the model's, as fractions.
MODEL_ROW_TARGET, MODEL_MEAN_TARGET = 0.10, 0.05


def load(d, name):
    """The JSON a step wrote, or None when it wrote none or an unreadable one (a failed step may leave an
    empty file); the step's own failure is listed in the Steps section."""
    p = os.path.join(d, name)
    if not os.path.exists(p):
        return None
    with open(p) as f:
        try:
            return json.load(f)
        except ValueError:
            return None


def mb(b):
    return f"{b / 1e6:,.1f}"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def bench_rows(j):
    return list(j["rows"]) if j and "rows" in j else []


def steps_of(d):
    return (load(d, "steps.json") or {}).get("steps", [])


def base_form(label):
    """The registered form of a row's label: "laga (ulysses 4)" is laga with --ulysses."""
    return re.sub(r" \(.*\)$", "", label)


class Forms:
    """The registered forms as `laga report` recorded them (forms.json: each form's declared properties,
    which step ran which); without that file, what the rows themselves say. A form's kernel is its
    declared own kernel (Form::own_kernel: laga-fused's latent, the ring forms' fused), never its name."""

    def __init__(self, d):
        j = load(d, "forms.json") or {}
        self.entries = j.get("forms", [])
        self.names = [f["name"] for f in self.entries]
        self.own = {f["name"]: f["own_kernel"] for f in self.entries if f.get("own_kernel")}
        self.not_run = {f["name"]: f["not_run_at_bench"] for f in self.entries if f.get("not_run_at_bench")}
        # the sparse forms (DeepSeek Sparse Attention) train another function than the dense ones: they race
        # each other alone
        self.sparse = {f["name"] for f in self.entries if f.get("sparse")} or \
            {n for n in self.names if n.startswith("dsa-")}
        self.steps = j.get("steps", {})
        # A row that ran another kernel than the one asked for names its form's own (bench rows, plan).
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            if not name.endswith(".json") or not name.startswith(("bench.", "plan.")):
                continue
            f = load(d, name) or {}
            asked = (f.get("config") or {}).get("kernel") or f.get("kernel")
            entries = [(x.get("variant"), x) for x in bench_rows(f)] + \
                [(k, v) for k, v in (f.get("forms") or {}).items() if isinstance(v, dict)]
            for form, x in entries:
                ran = x.get("attention_kernel")
                if form and ran and asked and ran != asked:
                    self.own.setdefault(form, ran)

    def kernel(self, form, asked, row=None):
        """The kernel `form` ran where `asked` was --kernel: the row's attention_kernel, else the form's own,
        else the one asked."""
        if row and row.get("attention_kernel"):
            return row["attention_kernel"]
        return self.own.get(base_form(form), asked)

    def runs(self, form, asked, row=None):
        """Whether the row of `form` ran the kernel asked for (a form with its own kernel does not: its rows
        belong under that kernel)."""
        return self.kernel(form, asked, row) == asked

    def order(self, labels):
        """labels in registry order, each variant after its form (laga's --ulysses rows), unknown ones last."""
        rank = {n: i for i, n in enumerate(self.names)}
        return sorted(set(labels), key=lambda x: (rank.get(base_form(x), len(rank)), x != base_form(x), _natural(x)))

    def colors(self, labels):
        """A colour per label: a form its own (tab10's, in registry order), a variant of one (laga's --ulysses
        rows) the next of tab20b's, a palette apart."""
        labels = list(labels)
        strong = plt.get_cmap("tab10").colors
        light = plt.get_cmap("tab20b").colors[0::4] + plt.get_cmap("tab20b").colors[2::4]
        bases = self.names or list(dict.fromkeys(base_form(x) for x in self.order(labels)))
        out, extra = {}, 0
        for lab in self.order(labels):
            if lab in bases:
                out[lab] = strong[bases.index(lab) % len(strong)]
            else:
                out[lab], extra = light[extra % len(light)], extra + 1
        return out


def _natural(s):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


class Report:
    def __init__(self, d):
        self.d = d
        self.md = []
        self.plots = []
        self.forms = Forms(d)

    def h(self, text, level=2):
        self.md.append("\n" + "#" * level + " " + text + "\n")

    def p(self, text):
        self.md.append(text + "\n")

    def missing(self, what, step):
        why = next((f"{s['status']}: {s['reason']}" for s in steps_of(self.d) if s["name"] == step), "not run")
        self.p(f"*{what}: no data ({why}).*")

    def plot(self, fig, name, caption, layout=True):
        if layout:  # else the figure is laid out already
            fig.tight_layout()
        fig.savefig(os.path.join(self.d, name), dpi=110)
        plt.close(fig)
        self.plots.append(name)
        self.p(f"![{caption}]({name})")


# Throughput figures count the model's causal attention, whatever a form's kernel computes, two ways.
def head_dims(cfg):
    return cfg["num_attention_heads"], cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"], cfg["v_head_dim"]


def attention_flops(cfg, T, B=1):
    """Causal attention over the whole sequence at the model's head dims: (forward, backward as
    FlashAttention-3 counts it, backward as executed). Forward 2·B·H·T·avg_kv·(Dqk + Dv), avg_kv = (T + 1)/2;
    FA3's backward is 2.5× that; the executed backward (cuDNN-frontend's count: dQ, dK, dV and the
    recomputed scores) is (3·Dqk + 2·Dv)/(Dqk + Dv)× it, 2.6× at Dqk 192, Dv 128."""
    H, dqk, dv = head_dims(cfg)
    fwd = 2.0 * B * H * T * (T + 1) / 2 * (dqk + dv)
    return fwd, 2.5 * fwd, fwd * (3 * dqk + 2 * dv) / (dqk + dv)


def flops_header(cfg):
    """The line that says which convention each TFLOP/s column uses."""
    _, dqk, dv = head_dims(cfg)
    return (f"attn TFLOP/s: per rank, the model's causal attention (forward 2·B·H·T·(T+1)/2·(Dqk + Dv), Dqk {dqk}, "
            f"Dv {dv}) over the rank's attention-kernel seconds (the bench's profile), counted two ways — **FA3**: "
            "FlashAttention-3's convention, backward 2.5× forward; **exec.**: the FLOPs executed, backward "
            f"(3·Dqk + 2·Dv)/(Dqk + Dv) = {(3 * dqk + 2 * dv) / (dqk + dv):.2f}× forward (cuDNN-frontend's count).")


def attention_tflops(row, cfg):
    """A bench row's attention rate per rank, (FA3, executed) in TFLOP/s; None without its profile."""
    prof = row.get("profile") or {}
    secs = sum((prof.get(k) or {}).get("seconds", 0) for k in ("attention_fwd", "attention_bwd"))
    if not cfg or secs <= 0:
        return None
    fwd, bwd_fa3, bwd_exec = attention_flops(cfg, row["seq"], row.get("batch", 1))
    P = row.get("sp", 1)
    return (fwd + bwd_fa3) / P / secs / 1e12, (fwd + bwd_exec) / P / secs / 1e12


def machine(d):
    """The machine the benches ran on, as their JSON recorded it: (CPU and cores, ISA, commit), or None."""
    for name in ("bench.threads.fused.json", "bench.repeat.early.json", "bench_comm.threads.json"):
        j = load(d, name)
        if j and "machine" in j:
            m = j["machine"]
            isa = m.get("isa") or {}
            isa_text = (f"rows {isa.get('rows', '?')}, matmul {isa.get('matmul', '?')} (bf16 {isa.get('bf16_matmul', '?')}), "
                        f"LAGA_MAX_ISA {isa.get('max_isa') or 'unset'}") if isa else "not recorded"
            cpu = f"{m.get('cpu_model', '?')}, {m.get('cores', '?')} cores ({m.get('features', '')}), host {m.get('host', '?')}"
            return cpu, isa_text, m.get("commit", "?")
    return None
