"""The report's section on the model beside published measurements: renders model.published.json, the JSON of
`laga model --published docs/published.json --json DIR/model.published.json` (docs/model.md, Beside published
measurements).

report.py calls section_published(r) with its writer (r.h, r.p, r.missing, r.d); table and load are report.py's,
imported when first needed unless given.
"""

FILE = "model.published.json"
STEP = "model.published"


def _pct(x):
    return "-" if x is None else f"{100 * x:.0f} %"


def _side(s):
    extra = ["overlap"] if s.get("overlap") else []
    if s.get("link_scale", 1) != 1:
        extra.append(f"links ×{s['link_scale']:.3g}")
    return s["form"] + (f" ({', '.join(extra)})" if extra else "")


def section_published(r, table=None, load=None):
    if table is None or load is None:
        import report_common  # beside this file, as report.py imports it
        table = table or report_common.table
        load = load or report_common.load
    r.h("Beside published measurements")
    j = load(r.d, FILE)
    if not j or not j.get("rows"):
        return r.missing("the model beside published measurements", STEP)
    above = j.get("explain_above", 0.10)
    r.p("Each row is a published speed ratio of a form over a baseline (arXiv 2607.17644 and public pull requests) "
        "beside the model's prediction of the same ratio under the row's assumptions (docs/published.json: model, T, "
        "P, layers, hardware file, placement on nodes, the time outside attention). *outside*: of the baseline's "
        "predicted step, the share outside attention; *to match*: the share at which the prediction would equal the "
        f"published ratio (- where none would). Rows more than {100 * above:.0f} % apart give the data file's reason "
        "below the table.")
    rows = []
    for x in j["rows"]:
        a = x["assumes"]
        o = a["outside_attention"]
        rows.append((x["id"], f"[{x['publication']}]({x['url']})",
                     f"{a['model']}, T {a['seq']}, P {a['sp']}, L {a['layers']}, {a['kernel']}",
                     f"{a['hw_file']} ({a['ranks_per_node']}/node)",
                     f"{_side(a['form'])} / {_side(a['baseline'])}",
                     f"{x['published']:.3f}", f"{x['predicted']['speedup']:.3f}", f"{100 * x['difference']:+.1f} %",
                     f"{_pct(o['share_of_baseline_step'])} ({o['method']})", _pct(x.get("share_outside_to_match"))))
    r.p(table(["row", "published by", "configuration", "hardware", "form / baseline", "published ×", "predicted ×",
               "difference", "outside", "to match"], rows))
    far = [x for x in j["rows"] if abs(x["difference"]) > above]
    if far:
        r.p("")
        for x in far:
            why = x.get("why") or "*the data file gives no reason*"
            r.p(f"- **{x['id']}** ({100 * x['difference']:+.1f} %): {why}")
    assumed = [(x["id"], s) for x in j["rows"] for s in x["assumes"].get("assumptions", [])]
    if assumed:
        r.p("\nWhat the rows assume beyond their publications' text:")
        r.p(table(["row", "assumption"], assumed))
