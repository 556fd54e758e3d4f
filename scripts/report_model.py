"""report.py's sections on the performance model: 7, the model against every measured row beside how far the
host alone moved one repeated measurement, and the paper's configurations predicted; 8, which form wins
where, measured here and predicted over `laga model --grid` (one heat map per hardware file; the grid's
rows stay in its JSON)."""
import math
import os
import statistics

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from report_common import MODEL_MEAN_TARGET, MODEL_ROW_TARGET, PAPER, bench_rows, load, mb, steps_of, table

# The model against measurement, in the order the report shows it: (the step's JSON, where it was measured,
# the kernel the bench was asked for).
MODEL_COMPARISONS = (
    ("model.vs_bench.fused.json", "one machine, threads", "fused"),
    ("model.vs_bench.eager.json", "one machine, threads, eager", "eager"),
    ("model.vs_bench.mpi.fused.json", "one machine, MPI", "fused"),
    ("model.vs_bench.link.matched.json", "link, matched", "fused"),
    ("model.vs_bench.link.matched.overlap.json", "link, matched, overlap", "fused"),
    ("model.vs_bench.link.fast.json", "link, 4× faster", "fused"),
    ("model.vs_bench.link.fast.overlap.json", "link, 4× faster, overlap", "fused"),
    ("model.vs_bench.link.slow.json", "link, 4× slower", "fused"),
    ("model.vs_bench.link.slow.overlap.json", "link, 4× slower, overlap", "fused"))

HW_FILES = ("ascend-910b", "h100-class")


def model_rows(r):
    """Every row of the model against measurement in this run: (where, the comparison's row, the kernel it
    ran). An eager comparison's row of a form that runs its own kernel is left out: that form ran the same
    code in the fused bench, where its row is."""
    out = []
    for name, where, asked in MODEL_COMPARISONS:
        j = load(r.d, name)
        if j and "comparison" in j:
            for x in j["comparison"]["rows"]:
                form = x.get("variant") or x["form"]
                if asked == "fused" or r.forms.runs(form, asked):
                    out.append((where, x, r.forms.kernel(form, asked)))
    return out


def model_errors(found):
    """|error of the total| in % of every row model_rows found."""
    return [abs(x["rel_error_total"]) * 100 for _, x, _ in found]


def skew_errors(found):
    """|error against the total less the ranks' skew| in % of the rows that have it (bench's comm_skew_s: the
    time ranks waited for each other, which the model does not predict); not the judged figure."""
    return [abs(x["rel_error_without_skew"]) * 100 for _, x, _ in found if "rel_error_without_skew" in x]


def class_errors(found):
    """Per comparison (where), the median over its rows of the model's error by op class, in %: (where, rows,
    {class: error}); comparisons whose rows have no by_class are left out."""
    out = {}
    for where, x, _ in found:
        for c, v in x.get("by_class", {}).items():
            if v["measured_s"] > 0:
                out.setdefault(where, {}).setdefault(c, []).append((v["predicted_s"] / v["measured_s"] - 1) * 100)
    return [(where, max(len(v) for v in cls.values()), {c: statistics.median(v) for c, v in cls.items()})
            for where, cls in out.items()]


def repeat(d):
    """explicit's one configuration timed early and late in the run (bench.repeat.*), with its row in the
    fused bench between: {seq, readings [(what, total s)], apart_s, spread (max / min − 1)}; None unless
    both repeats ran."""
    got = {}
    for when in ("early", "late"):
        rows = bench_rows(load(d, f"bench.repeat.{when}.json"))
        if rows:
            got[when] = rows[0]
    if len(got) < 2:
        return None
    T, form = got["early"]["seq"], got["early"]["variant"]
    readings = [("early", got["early"]["total_s"])]
    readings += [("in the fused bench", x["total_s"]) for x in bench_rows(load(d, "bench.threads.fused.json"))
                 if x["seq"] == T and x["variant"] == form]
    readings.append(("late", got["late"]["total_s"]))
    steps = steps_of(d)
    names = [s["name"] for s in steps]
    apart = None
    if "bench.repeat.early" in names and "bench.repeat.late" in names:
        i, k = names.index("bench.repeat.early"), names.index("bench.repeat.late")
        apart = sum(s["seconds"] for s in steps[i + 1:k])
    v = [t for _, t in readings]
    return {"seq": T, "form": form, "readings": readings, "apart_s": apart, "spread": max(v) / min(v) - 1}


def repeat_text(rp):
    apart = f", {rp['apart_s'] / 60:.0f} min apart" if rp["apart_s"] is not None else ""
    return (f"{rp['form']}, fused, T {rp['seq']}, P 2 timed {len(rp['readings'])} times{apart} "
            f"({', '.join(f'{t:.3f} s {w}' for w, t in rp['readings'])}): the host alone moved it "
            f"{rp['spread'] * 100:.1f} %")


def model_stats(r):
    """The model against every row: (rows found, |errors| in %, skew errors, the repeat); None without rows."""
    found = model_rows(r)
    return (found, model_errors(found), skew_errors(found), repeat(r.d)) if found else None


def model_line(r):
    """The model's target line: (the numbers, met); None when no comparison ran."""
    st = model_stats(r)
    if not st:
        return None
    found, a, ns, rp = st
    worst = max(found, key=lambda e: abs(e[1]["rel_error_total"]))
    within = sum(v <= MODEL_ROW_TARGET * 100 for v in a)
    mean = sum(a) / len(a)
    met = within == len(a) and mean <= MODEL_MEAN_TARGET * 100
    line = (f"{within} of {len(a)} rows within 10 %; max {max(a):.1f} % ({worst[0]}, T {worst[1]['seq']}, "
            f"{worst[1]['form']}), mean {mean:.1f} %")
    if ns and not met:
        line += (f". Against each total less the time its ranks waited for each other (skew: the same work on "
                 f"every rank, so time the host took from one; not judged): {sum(v <= 10 for v in ns)} of {len(ns)} "
                 f"within 10 %, max {max(ns):.1f} %, mean {sum(ns) / len(ns):.1f} % (section 7)")
    if rp:
        line += f"; {repeat_text(rp)}"
    return line, met


def model_headline(r):
    """The summary's short line on the model: its errors beside the host's spread."""
    st = model_stats(r)
    if not st:
        return None
    _, a, _, rp = st
    host = f"; the host alone moved one step {rp['spread'] * 100:.1f} % between readings" if rp else ""
    return f"error of the total: max {max(a):.1f} %, mean {sum(a) / len(a):.1f} % over {len(a)} rows{host}"


def section_model(r):
    r.h("7. Performance model")
    r.p("The replay of every rank's planned timeline (docs/model.md §1): each recorded op's FLOPs or bytes over the "
        "calibrated rate of its class, each collective latency + bytes / bus bandwidth fitted on bench-comm, issued "
        "and waited where the form's code issues and waits it; against the measured bench rows. The calibrated rates "
        "are in hw.here.json (`laga model --hw hw.here.json` prints them).")
    hw = load(r.d, "hw.here.json")
    again = (hw or {}).get("notes", {}).get("remeasured")
    if again is not None:
        r.p(f"Every rate was read in two rounds; {len(again)} whose readings differed by more than 10 % were read a "
            "third time (each keeps the median of its readings)" + (":" if again else "."))
        if again:
            # Each reading over the median kept: a spread, whatever FLOP convention the rate is in.
            wide = sorted(again, key=lambda x: -max(x["rates"]) / max(min(x["rates"]), 1e-30))[:5]
            r.p(("The widest five" if len(again) > 5 else "They") + ", each reading over the median kept:\n\n" + table(
                ["rate", "readings / median"],
                [(x["what"], ", ".join(f"{v / statistics.median(x['rates']):.2f}" for v in x["rates"])) for x in wide]))
    found = model_rows(r)
    if not found:
        r.missing("model against measurement", "model.vs_bench.fused")
    else:
        errs = model_errors(found)
        r.p(f"\nError of the total over {len(errs)} rows: max {max(errs):.1f} %, mean {sum(errs) / len(errs):.1f} % "
            "(target: every row within 10 %, mean ≤ 5 %).")
        rp = repeat(r.d)
        if rp:
            r.p(f"\nThe host's share: {repeat_text(rp)}. An error within that spread cannot be told from the host's "
                "noise.")
        else:
            r.missing("the repeated measurement", "bench.repeat.late")
        rows, pts = [], []
        for where, x, kernel in found:
            m = x["measured"]
            skew = (f"{m['comm_skew_s']:.3f}", f"{x['rel_error_without_skew'] * 100:+.1f} %") \
                if "rel_error_without_skew" in x else ("-", "-")
            rows.append((where, kernel, x["seq"], x["form"], f"{m['total_s']:.3f}", f"{x['predicted']['total_s']:.3f}",
                         f"{x['rel_error_total'] * 100:+.1f} %") + skew)
            pts.append((m["total_s"], x["predicted"]["total_s"], where))
        r.p(table(["where", "kernel", "T", "form", "measured s", "predicted s", "error", "skew s", "error w/o skew"], rows))
        by_class = class_errors(found)
        if by_class:
            classes = ("matmul", "attention_fwd", "attention_bwd", "other")
            r.p("\nBy op class (the bench's slowest rank's seconds per class against the replay's time in that class; "
                "other: the streams and the rest beside exposed communication), the model's median error over each comparison's rows; "
                "above 0 the calibration read the class slower than the bench ran it:")
            r.p(table(["where", "rows"] + list(classes),
                      [(where, n) + tuple("-" if c not in e else f"{e[c]:+.0f} %" for c in classes)
                       for where, n, e in by_class]))
        ns = skew_errors(found)
        if ns:
            r.p(f"\nskew: of a row's exposed communication, the time its ranks waited for each other. Every form gives "
                "each rank the same work, so this is time the host took from one rank, which the model does not "
                f"predict. Against each total less its skew (not judged): max {max(ns):.1f} %, mean "
                f"{sum(ns) / len(ns):.1f} % over {len(ns)} rows.")
        fig, ax = plt.subplots(figsize=(5, 5))
        for where in dict.fromkeys(p[2] for p in pts):
            sel = [p for p in pts if p[2] == where]
            ax.scatter([p[0] for p in sel], [p[1] for p in sel], label=where)
        lim = max(max(p[0] for p in pts), max(p[1] for p in pts)) * 1.1
        ax.plot([0, lim], [0, lim], color="gray", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured step, s")
        ax.set_ylabel("predicted step, s")
        ax.legend(fontsize=7)
        ax.set_title("model against measurement")
        r.plot(fig, "model_vs_measured.png", "model against measurement")
    section_paper(r)


def paper_predictions(d):
    """laga / explicit and the predicted fastest form at the paper's configurations: [(hw, P, [cells])]."""
    out = []
    for hw_name in HW_FILES:
        for P in (8, 16):
            cells = []
            for T in (4096, 8192, 16384):
                j = load(d, f"model.paper.{hw_name}.p{P}.t{T}.json")
                cells.append(j)
            out.append((hw_name, P, cells))
    return out


def section_paper(r):
    rows = []
    for hw_name, P, cells in paper_predictions(r.d):
        text = [f"{j['forms']['laga']['speedup_vs_explicit']:.3f}" if j and "laga" in j.get("forms", {}) else "-"
                for j in cells]
        best = [f"{j['winner']} {j['forms'][j['winner']].get('speedup_vs_explicit', 0):.3f}" if j and "winner" in j
                else "-" for j in cells]
        paper = PAPER["single_node"] if P == 8 else PAPER["two_nodes"]
        rows.append([hw_name, P] + text + [" / ".join(str(paper[T]) for T in (4096, 8192, 16384)), "; ".join(best)])
    if any(c != "-" for row in rows for c in row[2:5]):
        r.h("The paper's configurations, predicted", 3)
        r.p("DeepSeek-V3, fused, bf16; explicit / laga predicted on the hardware files of docs/hw (assumed utilisations "
            "of published peaks, each with its source), and the form the model predicts fastest (explicit / it).")
        r.p(table(["hardware", "P", "T 4K", "T 8K", "T 16K", "paper 4K / 8K / 16K", "fastest, 4K; 8K; 16K"], rows))


def margin(times):
    """(winner, runner-up, runner-up's time over the winner's) of a grid cell's times."""
    t = sorted(times.items(), key=lambda kv: kv[1])
    if len(t) < 2:
        return t[0][0], None, None
    return t[0][0], t[1][0], t[1][1] / t[0][1]


GRID_SCALARS = ("winner", "winner_s")


def grid_axes(rows):
    """The grid's axes: (y, x) of each panel's cells (T and P where the grid has them), the panels' rows (the
    link scale) and columns (every other axis)."""
    keys = [k for k, v in rows[0].items() if k not in GRID_SCALARS and not isinstance(v, (dict, list))]
    y, x = ("seq", "sp") if {"seq", "sp"} <= set(keys) else (keys[-2], keys[-1])
    prow = "link_scale" if "link_scale" in keys and "link_scale" not in (x, y) else None
    pcol = sorted((k for k in keys if k not in (x, y, prow)), key=lambda k: k != "model")
    return y, x, prow, pcol


def axis_label(key, value):
    if key == "model":
        return str(value)
    if key == "seq" and isinstance(value, int) and value % 1024 == 0:
        value = f"{value // 1024}K"
    elif isinstance(value, float):
        value = f"{value:g}"
    return f"{ {'seq': 'T', 'sp': 'P', 'heads': 'H', 'link_scale': 'link×'}.get(key, key)} {value}"


def heat_map(r, hw, rows, colors):
    """One figure per hardware file: a panel per link scale × model, a cell per T × P colored by the winning
    form, with its margin over the runner-up written in it."""
    y, x, prow, pcol = grid_axes(rows)
    ys = sorted({row[y] for row in rows})
    xs = sorted({row[x] for row in rows})
    prows = sorted({row[prow] for row in rows}) if prow else [None]
    pcols = list(dict.fromkeys(tuple(row[k] for k in pcol) for row in rows))
    fig, axes = plt.subplots(len(prows), len(pcols), figsize=(1.0 + 3.6 * len(pcols), 0.6 + 2.3 * len(prows)),
                             squeeze=False)
    cells = {(row[prow] if prow else None, tuple(row[k] for k in pcol), row[y], row[x]): row for row in rows}
    for i, pr in enumerate(prows):
        for j, pc in enumerate(pcols):
            ax = axes[i][j]
            img = [[(1, 1, 1)] * len(xs) for _ in ys]
            for a, yv in enumerate(ys):
                for b, xv in enumerate(xs):
                    row = cells.get((pr, pc, yv, xv))
                    if not row or not row.get("times_s"):
                        ax.text(b, a, "—", ha="center", va="center", fontsize=7)
                        continue
                    win, _, m = margin(row["times_s"])
                    img[a][b] = colors[win]
                    lum = 0.299 * img[a][b][0] + 0.587 * img[a][b][1] + 0.114 * img[a][b][2]
                    ax.text(b, a, f"{m:.3f}×" if m else "only", ha="center", va="center", fontsize=7,
                            color="black" if lum > 0.5 else "white")
            ax.imshow(img, aspect="auto", origin="lower")
            ax.set_xticks(range(len(xs)), [axis_label(x, v) for v in xs], fontsize=7)
            ax.set_yticks(range(len(ys)), [axis_label(y, v) for v in ys], fontsize=7)
            title = ", ".join(axis_label(k, v) for k, v in zip(pcol, pc))
            if prow:
                title += f"; {axis_label(prow, pr)}"
            ax.set_title(title, fontsize=8)
    winners = r.forms.order(won(rows))
    fig.legend(handles=[Patch(color=colors[w], label=w) for w in winners], loc="lower center",
               ncol=min(4, len(winners)), fontsize=7, frameon=False)
    fig.suptitle(f"the predicted fastest form on {hw}; in each cell its margin over the runner-up", fontsize=9)
    fig.tight_layout(rect=(0, 0.04 + 0.03 * math.ceil(len(winners) / 4), 1, 0.97))
    return fig


def won(rows):
    """The labels that win some cell of a grid."""
    return {margin(row["times_s"])[0] for row in rows if row.get("times_s")}


def grid_summary(rows):
    """One line on a grid: how many cells each form wins, the margins, explicit against the winner."""
    wins = {}
    ms, ex = [], []
    for row in rows:
        if not row.get("times_s"):
            continue
        win, _, m = margin(row["times_s"])
        wins[win] = wins.get(win, 0) + 1
        if m:
            ms.append(m)
        if "explicit" in row["times_s"]:
            ex.append(row["times_s"]["explicit"] / row["times_s"][win])
    n = sum(wins.values())
    text = ", ".join(f"{w} {c}" for w, c in sorted(wins.items(), key=lambda kv: -kv[1]))
    out = f"cells won, of {n}: {text}"
    if ms:
        out += f"; margin over the runner-up {min(ms):.3f}× to {max(ms):.3f}× (median {statistics.median(ms):.3f}×)"
    if ex:
        out += f"; explicit's step over the winner's {min(ex):.3f}× to {max(ex):.3f}×"
    return out, wins, n


def regather_line(rows):
    """What re-gathering costs and saves over the sparse cells: dsa-regather's step over dsa-gather's, and the
    activation peak it saves."""
    cost, saved = [], []
    for row in rows:
        t, m = row.get("times_s") or {}, row.get("activation_peak_bytes") or {}
        if "dsa-gather" in t and "dsa-regather" in t:
            cost.append(t["dsa-regather"] / t["dsa-gather"])
        if "dsa-gather" in m and "dsa-regather" in m:
            saved.append(1 - m["dsa-regather"] / m["dsa-gather"])
    if not cost:
        return ""
    out = f"dsa-regather's step over dsa-gather's: {min(cost):.3f}× to {max(cost):.3f}× (median {statistics.median(cost):.3f}×)"
    if saved:
        out += f", for an activation peak {100 * min(saved):.0f} to {100 * max(saved):.0f} % lower"
    return out + "."


def section_winners(r):
    r.h("8. Which form wins where")
    r.p("Measured where this machine measured (one machine, P 2, `small`: the fastest validated form per T, with the "
        "model's error on that row); predicted elsewhere (`laga model --grid`: every form that can run the cell and "
        "laga with every --ulysses; link× scales the hardware file's link bandwidths; no overlap in the model). The "
        "sparse forms (DeepSeek Sparse Attention) train another function than the dense ones, so they race each "
        "other alone: their own rows, and the deepseek-v3.2 panels of the grids.")
    rows = []
    for asked in ("fused", "eager"):
        j = load(r.d, f"bench.threads.{asked}.json")
        m = load(r.d, f"model.vs_bench.{asked}.json")
        err = {(x["seq"], x["form"]): x["rel_error_total"] for x in ((m or {}).get("comparison") or {}).get("rows", [])}
        by_t = {}
        for row in bench_rows(j):
            if row.get("wrong", 0) == 0 and (asked == "fused" or r.forms.runs(row["variant"], asked, row)):
                by_t.setdefault((row["variant"] in r.forms.sparse, row["seq"]), []).append(row)
        for (sparse, T), rs in sorted(by_t.items()):
            rs.sort(key=lambda x: x["total_s"])
            win = rs[0]
            e = err.get((T, win["variant"]))
            rows.append((asked + (", sparse forms" if sparse else ""), T, win["variant"], r.forms.kernel(win["variant"], asked, win), f"{win['total_s']:.3f}",
                         rs[1]["variant"] if len(rs) > 1 else "-",
                         f"{rs[1]['total_s'] / win['total_s']:.3f}×" if len(rs) > 1 else "-",
                         f"{e * 100:+.1f} %" if e is not None else "-"))
    if rows:
        r.h("Measured (one machine, P 2, small, H 16)", 3)
        r.p(table(["bench --kernel", "T", "winner", "its kernel", "step s", "runner-up", "margin", "model error"], rows))
    else:
        r.missing("measured winners", "bench.threads.fused")
    grids = [(hw, load(r.d, f"model.grid.{hw}.json")) for hw in HW_FILES]
    colors = r.forms.colors({w for _, g in grids if g for w in won(g.get("grid", []))})
    for hw, g in grids:
        r.h(f"Predicted on {hw}", 3)
        if not g or not g.get("grid"):
            r.missing(f"model grid on {hw}", f"model.grid.{hw}")
            continue
        dense = [row for row in g["grid"] if row.get("model") != "deepseek-v3.2"]
        sparse = [row for row in g["grid"] if row.get("model") == "deepseek-v3.2"]
        r.p(grid_summary(dense)[0] + f". Every cell's times: model.grid.{hw}.json.")
        if sparse:
            r.p("deepseek-v3.2, the sparse forms: " + grid_summary(sparse)[0] + ". " + regather_line(sparse))
        r.plot(heat_map(r, hw, g["grid"], colors), f"winners_{hw}.png", f"the predicted fastest form on {hw}",
               layout=False)
    sparse_choice(r)


def sparse_choice(r):
    """The sparse forms: what re-gathering saves (plan at DeepSeek-V3.2 scale), what it costs (bench in one machine and
    across the link, the model on the hardware files), and how each layout balances the ranks' work."""
    r.h("Sparse forms: keep the gathered latent, or gather it again", 3)
    rows, balance = [], []
    plans = [load(r.d, n) for n in sorted(os.listdir(r.d)) if n.startswith("plan.dsa.") and n.endswith(".json")]
    for p in sorted((p for p in plans if p), key=lambda p: (p["config"]["seq_len"], p["config"]["sp"])):
        T, P = p["config"]["seq_len"], p["config"]["sp"]
        f = p["forms"]
        g, rg = f.get("dsa-gather", {}), f.get("dsa-regather", {})
        if "saved_bytes" not in g or "saved_bytes" not in rg:
            continue
        rows.append((T, P, mb(g["saved_bytes"]), mb(rg["saved_bytes"]), f"{rg['saved_bytes'] / g['saved_bytes']:.3f}",
                     mb(g["activation_peak_bytes"]), mb(rg["activation_peak_bytes"]),
                     f"{rg['activation_peak_bytes'] / g['activation_peak_bytes']:.3f}",
                     mb(g["comm"]["wire_bytes"]), mb(rg["comm"]["wire_bytes"])))
        for layout, w in (p.get("sparse_rank_work") or {}).items():
            if isinstance(w, dict) and "imbalance" in w:
                im = w["imbalance"]
                balance.append((T, P, layout, f"{im['indexer']:.3f}", f"{im['attention']:.3f}", f"{im['total']:.3f}"))
    if rows:
        r.p(f"Planned per rank and layer at {p['config'].get('model')} (`laga plan`; planned = measured to "
            "the byte): what dsa-regather saves by gathering the latent again and rebuilding q_abs a row block at a "
            "time, and the traffic it adds (wire bytes: the gathers counted as they travel).")
        r.p(table(["T", "P", "gather saved MB", "regather saved MB", "ratio", "gather peak MB", "regather peak MB",
                   "ratio", "gather wire MB", "regather wire MB"], rows))
    else:
        r.missing("plan of the sparse forms", "plan.dsa.t262144.p64")
    if balance:
        r.p("\nWork per rank (the plan's work ledger of every rank; imbalance = the busiest rank's over the mean): the "
            "indexer scores every earlier key, so under the contiguous layout the last rank's queries score P times "
            "the first's; zigzag pairs chunk r with chunk 2P−1−r.")
        r.p(table(["T", "P", "layout", "indexer", "sparse attention", "step"], balance))
    cost = []
    for name in ("bench.threads.fused.json", "bench.link.matched.json", "bench.link.matched.overlap.json",
                 "bench.link.slow.overlap.json", "bench.link.fast.overlap.json"):
        by = {}
        for row in bench_rows(load(r.d, name)):
            if row.get("wrong", 0) == 0 and row["variant"] in ("dsa-gather", "dsa-regather"):
                by.setdefault(row["seq"], {})[row["variant"]] = row["total_s"]
        for T, t in sorted(by.items()):
            if len(t) == 2:
                cost.append((name[:-5], T, f"{t['dsa-gather']:.3f}", f"{t['dsa-regather']:.3f}",
                             f"{t['dsa-regather'] / t['dsa-gather']:.3f}×"))
    if cost:
        r.p("\nMeasured (small, P 2, medians): the step of each and dsa-regather's over dsa-gather's.")
        r.p(table(["bench", "T", "dsa-gather s", "dsa-regather s", "regather / gather"], cost))
    lines = []
    for hw in HW_FILES:
        g = load(r.d, f"model.grid.{hw}.json")
        sparse = [row for row in (g or {}).get("grid", []) if row.get("model") == "deepseek-v3.2"]
        if sparse:
            lines.append(f"{hw}: {regather_line(sparse)}")
    if lines:
        r.p("\nPredicted at DeepSeek-V3.2 (`laga model --grid`, every T × P × link scale): " + " ".join(lines))
    r.p("\nRe-gathering pays where the activation memory it saves is what limits the run (a longer sequence or fewer "
        "ranks, or no activation recomputation): its price is one more all-gather of 576 values per token and the "
        "per-block rebuild of q_abs, a few per cent of the step where the link keeps pace with compute and more where "
        "it does not. docs/design.md §7.")


def winners_headline(r):
    """The summary's line on the grids: per hardware file, the form that wins most cells."""
    out = []
    for hw in HW_FILES:
        g = load(r.d, f"model.grid.{hw}.json")
        if g and g.get("grid"):
            _, wins, n = grid_summary([row for row in g["grid"] if row.get("model") != "deepseek-v3.2"])
            top = sorted(wins.items(), key=lambda kv: -kv[1])
            out.append(f"{hw}: " + ", ".join(f"{w} {c}" for w, c in top[:3]) + f" of {n} cells")
    return "; ".join(out)
