"""The report page's study sections: the answer it leads with, and the full study table."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posenc._pages import escape as _e
from posenc._pages import figure_html
from posenc._pages import number as _num

__all__ = ["embedded", "headline_section", "lengthgen_section"]


def embedded(out: Path, record: Mapping[str, Any], css: str = "") -> str:
    """The figure of ``record`` (one of ``report.json``'s ``figures``), read back from
    ``out`` and embedded."""
    size = (record["width"], record["height"])
    return figure_html(out / record["file"], record["title"], size=size, css=css)


def _optimizer(settings: Mapping[str, Any]) -> str:
    """How the study's models were trained, in words."""
    if settings.get("optimizer", "adamw") == "muon":
        return "Muon on the hidden matrices, AdamW on the rest"
    return "AdamW"


def _figure(data: dict[str, Any], out: Path, file: str | None) -> str:
    if not file:
        return ""
    record = next(f for f in data["figures"] if f["file"] == file)
    return embedded(out, record, "wide")


def _spread(cell: dict[str, float] | None, digits: int = 3) -> str:
    """``mean (min-max)``, or the value alone when the seeds agree (or there is one)."""
    if cell is None:
        return "-"
    if cell["min"] == cell["max"]:
        return _num(cell["mean"], digits)
    return (
        f'{_num(cell["mean"], digits)} <span class="range">'
        f"({_num(cell['min'], digits)}&ndash;{_num(cell['max'], digits)})</span>"
    )


#: A verdict's class: (as the paper, verdict) -> yes / no / level.
_VERDICT_CLASS = {
    (True, "better"): "yes",
    (True, "worse"): "yes",
    (False, "better"): "no",
    (False, "worse"): "no",
    (False, "level"): "level",
}


def _interval(interval: list[float] | None) -> str:
    if interval is None:
        return "one seed: none"
    return f"{_num(interval[0], 3)} to {_num(interval[1], 3)}"


def headline_section(data: dict[str, Any], out: Path) -> str:
    """The answer first: perplexity against length with the seed spread, our ratios beside
    Press et al.'s, the sentence on what agrees, and the checks. Empty without a study."""
    lg = data["lengthgen"]
    if lg["status"] != "ok":
        return ""
    r, comp = lg["results"], lg["comparison"]
    seeds = r["seeds"]
    heads = "".join(
        f'<th>ours {c["ours"]:g}L</th><th class="theirs">Press et al. {c["theirs_len"]} '
        f"({c['theirs']:.1f}L)</th>"
        for c in comp["columns"]
    )
    rows = []
    for row in comp["rows"]:
        cells = "".join(
            f'<td>{_spread(c["ours"], 3)}</td><td class="theirs">{_num(c["theirs"], 3)}</td>'
            for c in row["cells"]
        )
        rows.append(f'<tr><td class="text">{_e(row["encoding"])}</td>{cells}</tr>')
    checks = "".join(
        f'<li class="{"yes" if c["holds"] else "no"}"><b>{"holds" if c["holds"] else "fails"}</b>: '
        f'{_e(c["claim"])} <span class="range">({_e(c["detail"])})</span></li>'
        for c in lg["checks"]
    )
    longest = max(r["eval_lens"])
    verdicts = "".join(
        f'<tr><td class="text">{_e(v["a"])} against {_e(v["b"])}</td>'
        f"<td>{v['times_L']:g}L</td><td>{_num(v['mean'], 3)}</td>"
        f"<td>{_interval(v['interval'])}</td>"
        f'<td class="{_VERDICT_CLASS[v["verdict"] == v["expect"], v["verdict"]]}">'
        f"{_e(v['verdict'])}</td></tr>"
        for v in comp.get("verdicts", [])
    )
    verdict_table = (
        f"""<h3>Press et al.'s order, pair by pair, over the seeds</h3>
<p class="lead">Each row: the growth ppl(nL)&nbsp;/&nbsp;ppl(L) of the first encoding minus the
second's, seed by seed (a seed's models share initialisation and data), its mean and 95% t
interval; <i>better</i>: the first grows less beyond the spread, as Press et al. have it;
<i>level</i>: the interval holds 0, no order is claimed.</p>
<div class="scroll"><table id="verdict-table"><thead><tr><th class="text">pair</th><th>at</th>
<th>mean difference</th><th>95% interval</th><th>verdict</th></tr></thead>
<tbody>{verdicts}</tbody></table></div>"""
        if verdicts
        else ""
    )
    return f"""
<section id="answer">
<h2>The answer: which encodings extrapolate</h2>
<p class="lead">A byte-level TinyTransformer per encoding and seed ({len(seeds)} seeds:
{", ".join(map(str, seeds))}), trained on <code>{_e(r["task"])}</code> at L = {r["train_len"]}
tokens for {lg["settings"]["steps"]} steps ({_optimizer(lg["settings"])}), evaluated up to
{longest} tokens
({longest // r["train_len"]}L) without any fine-tune. Lines: the mean over the seeds; bands:
min to max. Measured in this run; every number is in <code>report.json</code>.</p>
{_figure(data, out, lg["headline"])}
<h3>Perplexity at nL over perplexity at L, beside Press et al. (2022, Table 2)</h3>
<div class="scroll"><table id="ratio-table"><thead><tr><th class="text">encoding</th>{heads}
</tr></thead><tbody>{"".join(rows)}</tbody></table></div>
{verdict_table}
<p class="lead" id="comparison-sentence">{_e(comp["sentence"])}</p>
<p class="lead">Theirs: <a href="{_e(comp["url"])}">{_e(comp["source"])}</a>, at the table's
rows nearest to each multiple of L. Ours: mean (min&ndash;max) over the seeds of each seed's own
ratio.</p>
<ul class="checks" id="study-checks">{checks}</ul>
</section>"""


def lengthgen_section(data: dict[str, Any], out: Path) -> str:
    """Every run of the study: mean (min-max) per encoding and length, the figure with the
    RoPE extensions; or why there is no study."""
    lg = data["lengthgen"]
    if lg["status"] != "ok":
        what = {
            "absent": "The length-generalization experiments are not part of this build",
            "error": "The length-generalization study failed",
            "skipped": "The length-generalization study was not run",
        }[lg["status"]]
        return f"""
<section id="lengthgen">
<h2>Length generalization</h2>
<p class="absent" id="lengthgen-absent"><b>{what}.</b> {_e(lg["reason"] or "")}
The rest of the report is complete. Run <code>posenc lengthgen</code> for a study of its own.</p>
</section>"""
    r = lg["results"]
    lengths = [str(n) for n in r["eval_lens"]]
    metric = r["metric"]
    past = metric == "ppl"
    rows = []
    for label, cells in r["summary"].items():
        tds = []
        for n in lengths:
            cell = cells.get(n, {})
            if "error" in cell:
                tds.append(f'<td class="no" title="{_e(cell["error"])}">error</td>')
                continue
            text = _spread(cell.get(metric))
            if past and cell.get("ppl_past") is not None:
                text += f'<br><span class="range">past L: {_num(cell["ppl_past"]["mean"])}</span>'
            tds.append(f"<td>{text}</td>")
        losses = [
            run["train"]["final_loss"]
            for run in r["runs"]
            if run["encoding"] == label and run["train"].get("final_loss") is not None
        ]
        loss = sum(losses) / len(losses) if losses else None
        rows.append(
            f'<tr><td class="text">{_e(label)}</td><td>{_num(loss)}</td>{"".join(tds)}</tr>'
        )
    heads = "".join(
        f"<th>{n}{' (train)' if int(n) == r['train_len'] else ''}</th>" for n in lengths
    )
    unit = "perplexity, mean (min&ndash;max) over the seeds" if past else _e(metric)
    settings = lg["settings"]
    return f"""
<section id="lengthgen">
<h2>Length generalization: every run</h2>
<p class="lead">The study above in full: TinyTransformers with each encoding, trained on
<code>{_e(r["task"])}</code> at {r["train_len"]} tokens for {settings["steps"]} steps
({_optimizer(settings)}) with seeds
{", ".join(map(str, r["seeds"]))} ({settings["jobs"]} worker processes), then evaluated at
longer lengths; <code>rope+pi</code>, <code>rope+ntk</code> and <code>rope+yarn</code> are the
trained RoPE models with their context extended at evaluation time, no fine-tune.
Cells: {unit}. <code>posenc lengthgen</code> runs studies of your own.</p>
<div class="scroll"><table id="lengthgen-table"><thead><tr><th class="text">encoding</th>
<th>final train loss (mean)</th>{heads}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>
{_figure(data, out, lg["figure"])}
</section>"""
