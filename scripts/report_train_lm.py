"""report.py's section on the byte-level language model (examples/train_lm.py): the same model, weights and
data trained with laga's attention (P processes under torchrun, train_lm.laga.json) and with the plain PyTorch
MLA in one process (train_lm.torch.json); their validation and training curves on one plot, each run's
median step time, and how far apart their per-step losses are. Judges nothing: in fp32 the two differ only by
the order of floating-point sums, in bf16 also by rounding (docs/report.md)."""
import math
import statistics

import matplotlib.pyplot as plt

from report_common import load, table

# (the attention, its step and JSON, its label)
RUNS = (("laga", "train_lm.laga", "laga"), ("torch", "train_lm.torch", "PyTorch"))


def _runs(r):
    return [(label, step, j) for _, step, label in RUNS if (j := load(r.d, step + ".json")) and j.get("steps")]


def _median_ms(j):
    return statistics.median(s["time_s"] for s in j["steps"]) * 1e3


def _max_delta(a, b):
    """(max |Δloss| over the steps both ran, at which step, |Δloss| at the last of them); None when none."""
    la, lb = ({s["step"]: s["loss"] for s in j["steps"]} for j in (a, b))
    common = sorted(set(la) & set(lb))
    if not common:
        return None
    worst = max(common, key=lambda s: abs(la[s] - lb[s]))
    return abs(la[worst] - lb[worst]), worst, abs(la[common[-1]] - lb[common[-1]])


def _run_line(label, j):
    n = j.get("processes", 1)
    where = f"form {j.get('args', {}).get('form')}, each its share of the tokens" if label == "laga" \
        else "the whole sequence"
    return f"{label}: {n} process{'' if n == 1 else 'es'} × {j.get('threads', '?')} thread(s), {where}"


def train_lm_headline(r):
    """The summary's row: the two runs' loss gap and step times; None unless both ran."""
    runs = {label: j for label, _, j in _runs(r)}
    if len(runs) < 2:
        return None
    a, b = runs["laga"], runs["PyTorch"]
    d = _max_delta(a, b)
    if not d:
        return None
    return (f"a byte-level LM (section 9), laga (P {a.get('processes', 1)}) / PyTorch from the same weights and "
            "data", f"train losses within {d[0]:.1e} nats over {len(a['steps'])} steps; median step "
            f"{_median_ms(a):.0f} / {_median_ms(b):.0f} ms", "—")


def section_train_lm(r):
    r.h("A byte-level language model: laga against PyTorch", level=3)
    runs = _runs(r)
    if not runs:
        return r.missing("the language model", "train_lm.laga")
    for _, step, label in RUNS:
        if label not in [x[0] for x in runs]:
            r.missing(f"train_lm with {label}'s attention", step)
    j0 = runs[0][2]
    a, cfg, data = j0.get("args", {}), j0.get("config", {}), j0.get("data", {})
    r.p(f"examples/train_lm.py: model {a.get('model')} (D {cfg.get('hidden_size')}, H "
        f"{cfg.get('num_attention_heads')}), {a.get('layers')} layers, {j0.get('parameters')} parameters, T "
        f"{a.get('seq')}, B {a.get('batch')}, {a.get('dtype')}, {a.get('steps')} AdamW steps over "
        f"{data.get('bytes')} bytes of {data.get('dir')} ({data.get('val_bytes')} held out); both runs from "
        "the same seeded weights and the same batches. " + "; ".join(_run_line(label, j) for label, _, j in runs)
        + ". A step's time is the whole model's (embedding, attention, MLPs, head, optimizer), each run on this "
        "machine's cores.")
    rows = []
    for label, _, j in runs:
        ev = j.get("evals", [])
        last = j["steps"][-1]
        rows.append((f"{label} (P {j.get('processes', 1)})", f"{ev[0]['val_bpb']:.4f}" if ev else "-", f"{ev[-1]['val_bpb']:.4f}" if ev else "-",
                     f"{last['loss'] / math.log(2):.4f}", len(j["steps"]), f"{_median_ms(j):.0f}"))
    r.p(table(["attention", "validation bits/byte, start", "at the end", "last train loss, bits/byte", "steps",
               "median step, ms"], rows))
    if len(runs) == 2:
        (_, _, x), (_, _, y) = runs
        d = _max_delta(x, y)
        if d:
            ex, ey = x.get("evals", []), y.get("evals", [])
            gap = f"; the final validation differs by {abs(ex[-1]['val_bpb'] - ey[-1]['val_bpb']):.1e} bits/byte" \
                if ex and ey else ""
            r.p(f"\nTrain loss (nats) between the two: max |Δ| {d[0]:.2e} (step {d[1]}), {d[2]:.2e} at the last "
                f"step{gap}.")
    # Left: both runs' curves (they lie on each other where they agree); right: how far apart they are.
    fig, (ax, dx) = plt.subplots(1, 2, figsize=(10, 4))
    for (label, _, j), color, style, mark in zip(runs, ("tab:blue", "tab:orange"), ("-", "--"), ("o", "x")):
        ax.plot([s["step"] for s in j["steps"]], [s["loss"] / math.log(2) for s in j["steps"]], style, lw=0.8,
                alpha=0.7, color=color, label=f"{label}, train")
        ev = j.get("evals", [])
        ax.plot([e["step"] for e in ev], [e["val_bpb"] for e in ev], mark + style, ms=6, lw=1.2, color=color,
                label=f"{label}, validation")
    ax.set_xlabel("step")
    ax.set_ylabel("bits per byte")
    ax.legend(fontsize=7)
    if len(runs) == 2:
        la, lb = ({s["step"]: s["loss"] for s in j["steps"]} for _, _, j in runs)
        common = sorted(set(la) & set(lb))
        dx.semilogy(common, [max(abs(la[s] - lb[s]), 1e-9) for s in common], lw=0.8, color="tab:gray")
        dx.set_title("|train loss, laga − PyTorch| (nats; 1e-9: equal)", fontsize=9)
        dx.set_xlabel("step")
    else:
        dx.set_axis_off()
    r.plot(fig, "train_lm.png", "the language model's training and validation curves, laga and PyTorch")
