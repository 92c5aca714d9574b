"""The sections of a ``posenc extend`` page that show what was measured: each setting's
effective length, the position maps' parameters, each probe task's bar, the probe scores
with their 95 % Wilson intervals, perplexity and the cost. Each is an HTML string, empty
when nothing behind it was measured.

Perplexity orders two settings only where the answer's verdicts (the project's one
comparison rule, :func:`posenc.experiments.comparisons.paired_verdict`) say so, and names
how each length was paired (by document, by position bucket with one document, or not at
all: then every pair is level).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from posenc._pages import escape as _e
from posenc._pages import number as _num
from posenc.extend.page_figures import measured_lengths, setting_name, settings_of

__all__ = [
    "bar_section",
    "cost_section",
    "effective_section",
    "lengths_text",
    "map_runs",
    "map_text",
    "maps_section",
    "ppl_section",
    "probe_section",
]

_AGAINST_NONE = {
    "better": "better than none",
    "worse": "worse than none",
    "level": "level with none",
}


def _n(value: Any) -> str:
    return _num(value, 4)


def _scroll(table: str) -> str:
    return f'<div class="scroll"><table>{table}</table></div>'


def _head(*names: str, text: Sequence[str] = ()) -> str:
    """A table's head row: the first column and those named in ``text`` left-aligned."""
    cells = "".join(
        f'<th class="text">{_e(n)}</th>' if i == 0 or n in text else f"<th>{_e(n)}</th>"
        for i, n in enumerate(names)
    )
    return f"<thead><tr>{cells}</tr></thead>"


def _f2(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}"


def _interval(score: Mapping[str, Any] | None) -> str:
    """``0.75 [0.41, 0.93], 8 probes``; ``-`` when nothing was scored."""
    if not score or not score.get("probes"):
        return "-"
    n = score["probes"]
    return (
        f"{score['score']:.2f} [{score['low']:.2f}, {score['high']:.2f}], "
        f"{n} probe{'' if n == 1 else 's'}"
    )


def lengths_text(lengths: Sequence[Any]) -> str:
    return ", ".join(str(n) for n in lengths)


def _failed(names: Sequence[str]) -> str:
    return ", ".join("perplexity" if n == "ppl" else n for n in names)


# --- the answer and the effective lengths ------------------------------------------------------


def _first_failure(setting: Mapping[str, Any]) -> str:
    for row in sorted(setting.get("lengths") or (), key=lambda r: r["length"]):
        if not row.get("holds"):
            return f"at {row['length']} tokens: {_failed(row.get('failed') or ())}"
    measured = lengths_text(sorted(r["length"] for r in setting.get("lengths") or ()))
    return f"held at every length measured ({measured})"


def effective_section(results: Mapping[str, Any], probes: bool) -> str:
    rows = results["answer"].get("settings") or []
    if not rows:
        return ""
    s, trained = results["settings"], results["trained_context"]
    shortest = min(measured_lengths(results))
    bar, tolerance = s.get("bar"), s.get("ppl_tolerance")
    rise = f"at most {tolerance:.0%}" if tolerance is not None else "within the tolerance"
    ceiling = f"rises {rise} above none's at the trained context ({trained} tokens)"
    rule = (
        f" keeps {bar:.0%} of the model's own score with no scaling at {shortest} tokens on "
        f"every probe task left in (below), and its perplexity {ceiling}."
        if probes and bar is not None
        else f"'s perplexity {ceiling}; no probe ran, so perplexity alone decides."
    )
    body = "".join(
        f'<tr><td class="text">{_e(r["scaling"])}</td><td>{r["factor"]:g}</td>'
        f"<td>{_num(r.get('effective_length'))}</td>"
        f'<td class="text wrap">{_e(_first_failure(r))}</td></tr>'
        for r in rows
    )
    return (
        '<section id="effective"><h2>Effective length per setting</h2>'
        f'<p class="lead">The longest length measured at which a setting{rule} '
        "A setting with no effective length failed at the first length it was measured.</p>"
        + _scroll(
            _head("scaling", "factor", "effective length", "failed first", text=["failed first"])
            + body
        )
        + "</section>"
    )


def bar_section(results: Mapping[str, Any], tasks: Sequence[str]) -> str:
    bars = results["answer"].get("tasks") or {}
    rows = []
    for task in tasks:
        b = bars.get(task)
        if not b:
            continue
        verdict = "yes" if b.get("included") else f"no: {b.get('reason') or 'left out'}"
        interval = "-" if b.get("low") is None else f"[{_f2(b['low'])}, {_f2(b['high'])}]"
        rows.append(
            f'<tr><td class="text">{_e(task)}</td><td>{_f2(b.get("baseline"))}</td>'
            f"<td>{interval}</td><td>{_num(b.get('probes'))}</td><td>{_f2(b.get('bar'))}</td>"
            f'<td class="{"yes" if b.get("included") else "no"} text wrap">{_e(verdict)}</td></tr>'
        )
    if not rows:
        return ""
    s = results["settings"]
    bar = s.get("bar")
    share = f"{bar:.0%} of " if bar is not None else ""
    return (
        '<section id="bars"><h2>The bar for each probe task</h2>'
        f"<p class=\"lead\">Each task's bar is {share}the model's own score with no scaling at "
        f"{min(measured_lengths(results))} tokens (95% Wilson interval over its probes). A task the "
        "model cannot do even there is reported, and left out of every verdict.</p>"
        + _scroll(
            _head(
                "task",
                "score unscaled",
                "95% interval",
                "probes",
                "bar",
                "in the verdict",
                text=["in the verdict"],
            )
            + "".join(rows)
        )
        + "</section>"
    )


def probe_section(results: Mapping[str, Any], tasks: Sequence[str], figure: str) -> str:
    rows = []
    for s in results["answer"].get("settings") or ():
        for row in sorted(s.get("lengths") or (), key=lambda r: r["length"]):
            scores = row.get("scores") or {}
            if not any((scores.get(t) or {}).get("probes") for t in tasks):
                continue
            cells = "".join(f"<td>{_interval(scores.get(t))}</td>" for t in tasks)
            holds = "holds" if row.get("holds") else f"fails: {_failed(row.get('failed') or ())}"
            rows.append(
                f'<tr><td class="text">{_e(s["scaling"])}</td><td>{s["factor"]:g}</td>'
                f"<td>{row['length']}</td>"
                f'<td class="{"yes" if row.get("holds") else "no"} text wrap">{_e(holds)}</td>'
                f"{cells}</tr>"
            )
    if not rows:
        return ""
    return (
        '<section id="probes"><h2>Probe scores per setting and length</h2>'
        '<p class="lead">RULER-style probes in the same haystacks for every setting at one '
        "length; each probe scores its exact-match recall. Cells: the mean score [its 95% "
        "Wilson interval], the number of probes.</p>"
        + figure
        + _scroll(
            _head("scaling", "factor", "length", "at this length", *tasks, text=["at this length"])
            + "".join(rows)
        )
        + "</section>"
    )


# --- the position maps ------------------------------------------------------------------------

#: Each map's parameters as the page names them.
_MAP_PARAMETERS = {
    "self_extend": (("group_size", "group size G"), ("neighbor_window", "neighbour window W")),
    "string": (("shift", "shift S"), ("local_window", "local window W")),
}
#: Where each map runs (:mod:`posenc.integrations.engines` refuses it everywhere else).
_MAP_RUNS = {
    "self_extend": "llama.cpp's llama-completion (its group attention, --grp-attn-n / "
    "--grp-attn-w, moves cached positions: not pair by pair) and transformers with posenc",
    "string": "transformers with posenc only",
}


def map_text(remap: Mapping[str, Any]) -> str:
    """A map's parameters in words: ``group size G 4, neighbour window W 128``."""
    names = _MAP_PARAMETERS.get(str(remap.get("type")), ())
    return ", ".join(f"{label} {remap.get(key)}" for key, label in names) or str(dict(remap))


def map_runs(remap: Mapping[str, Any]) -> str:
    """Where the map of this type runs, in words."""
    return _MAP_RUNS.get(str(remap.get("type")), "transformers with posenc only")


def _runs_with(spec: Mapping[str, Any] | None) -> str:
    inner = (spec or {}).get("scaling")
    if not isinstance(inner, Mapping):
        return "the model's own RoPE"
    factor = inner.get("factor")
    return f"{inner.get('type')} factor {factor:g}" if factor else str(inner.get("type"))


def maps_section(results: Mapping[str, Any]) -> str:
    """The parameters of each position map measured, what it ran with and where it runs."""
    rows = []
    trained = results["trained_context"]
    for (scaling, factor), units in settings_of(results["records"]):
        first = next((u for u in units if u.get("map")), None)
        if first is None:
            continue
        still = [str(u["length"]) for u in units if not u.get("map_changes", True)]
        moved = f"; moves no pair at {', '.join(still)}" if still else ""
        rows.append(
            f'<tr><td class="text">{_e(setting_name(scaling, factor))}</td>'
            f"<td>{round(factor * trained)}</td>"
            f'<td class="text wrap">{_e(map_text(first["map"]) + moved)}</td>'
            f'<td class="text">{_e(_runs_with(first.get("rope")))}</td>'
            f'<td class="text wrap">{_e(map_runs(first["map"]))}</td></tr>'
        )
    if not rows:
        return ""
    return (
        '<section id="maps"><h2>Position maps</h2>'
        '<p class="lead">Self-Extend (Jin et al. 2024) keeps the exact positions of the keys '
        "within its neighbour window W of a query and groups farther ones by G; STRING (An et "
        "al. 2024) rotates an offset of S or more as the offset minus S plus W. Both change "
        "the positions attention rotates each (query, key) pair at, not RoPE's frequencies, "
        "with each paper's parameters for the trained context and the length a setting is "
        "set for. No engine's config can say either; where one moves no pair at a length, "
        "that unit takes the numbers of the setting it then equals.</p>"
        + _scroll(
            _head(
                "setting",
                "set for (tokens)",
                "parameters",
                "runs with",
                "where it runs",
                text=["parameters", "runs with", "where it runs"],
            )
            + "".join(rows)
        )
        + "</section>"
    )


# --- perplexity: ordered only by the answer's verdicts ------------------------------------------


def _unit(records: Sequence[Mapping[str, Any]], length: int, scaling: str, factor: float) -> Any:
    return next(
        (
            r
            for r in records
            if r["length"] == length
            and r["scaling"] == scaling
            and float(r["factor"]) == float(factor)
        ),
        None,
    )


def _best_text(
    verdicts: Mapping[str, str], names: Mapping[str, str], rank: Mapping[str, int]
) -> tuple[str, str]:
    if not verdicts:
        return "the only setting at this length", ""
    ordered = sorted(verdicts, key=lambda k: rank.get(k, len(rank)))
    beaten = [names.get(k, k) for k in ordered if verdicts[k] == "better"]
    level = [names.get(k, k) for k in ordered if verdicts[k] != "better"]
    if not beaten:
        return "level with every other", "level"
    text = "better than " + ", ".join(beaten)
    return (text + "; level with " + ", ".join(level) if level else text), "yes"


def _verdicts(results: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """Each record's key -> (its verdict in words, the cell's class), from the answer."""
    records, answer = results["records"], results["answer"]
    names = {r["key"]: setting_name(r["scaling"], r["factor"]) for r in records}
    ordered = [r["key"] for _, units in settings_of(records) for r in units]
    rank = {key: i for i, key in enumerate(ordered)}
    out: dict[str, tuple[str, str]] = {}
    for row in answer.get("per_length") or ():
        best_name = setting_name(row["best"], row["factor"])
        verdicts = row.get("verdicts") or {}
        for key, verdict in verdicts.items():
            out[key] = {
                "better": (f"worse than {best_name}", "no"),
                "worse": (f"better than {best_name}", "yes"),
            }.get(verdict, (f"level with {best_name}", "level"))
        best = _unit(records, row["length"], row["best"], row["factor"])
        if best is not None:
            out[best["key"]] = _best_text(verdicts, names, rank)
    trained = results["trained_context"]
    for c in answer.get("cost_at_L") or ():
        unit = _unit(records, trained, c["scaling"], c["factor"])
        if unit is not None:
            css = {"better": "yes", "worse": "no"}.get(c["verdict"], "level")
            out[unit["key"]] = (f"{_AGAINST_NONE.get(c['verdict'], 'level with none')} at L", css)
    return out


def _notes(records: Sequence[Mapping[str, Any]]) -> Callable[[Mapping[str, Any]], str]:
    """A record's note cell, or nothing for every record when none has a note (no empty
    column)."""
    if not any(_note(r) for r in records):
        return lambda r: ""
    return lambda r: f'<td class="text wrap">{_e(_note(r))}</td>'


def _note(r: Mapping[str, Any]) -> str:
    if r.get("same_as") and r.get("map") and not r.get("map_changes"):
        return f"the map moves no pair at this length: the numbers of {r['same_as']}"
    if r.get("same_as"):
        return f"same rotary tables as {r['same_as']}: its numbers"
    if r.get("shared_pass"):
        return f"from the forward pass of {r['shared_pass']}"
    return ""


def _paired_by(pairing: str | None, record: Mapping[str, Any]) -> str:
    """How two settings were paired, in words: by ``document`` or by position ``bucket``
    (``pairing``, as the answer gives it), counted on ``record``."""
    docs, buckets = len(record.get("ppl_by_document") or ()), len(record.get("by_bucket") or ())
    if pairing == "bucket":
        return f"paired by position bucket ({buckets} buckets of one document)"
    if pairing == "document" and docs > 1:
        return f"paired by document ({docs} documents)"
    if pairing == "document":
        return "one document and no buckets to pair: no spread, so every pair is level"
    return "nothing pairs: no spread, so every pair is level"


def _pairings(results: Mapping[str, Any]) -> str:
    items = []
    for row in results["answer"].get("per_length") or ():
        best = _unit(results["records"], row["length"], row["best"], row["factor"]) or {}
        text = (
            _paired_by(row.get("pairing"), best)
            if row.get("verdicts")
            else "one setting measured: nothing to compare"
        )
        items.append(f"<li>{row['length']} tokens: {_e(text)}</li>")
    return f'<ul id="pairing">{"".join(items)}</ul>' if items else ""


def ppl_section(results: Mapping[str, Any], figure: str) -> str:
    records = [r for r in results["records"] if r.get("ppl") is not None]
    if not records:
        return ""
    verdicts, note = _verdicts(results), _notes(records)
    rows = []
    for (_, _), units in settings_of(records):
        for r in units:
            text, css = verdicts.get(r["key"], ("-", ""))
            rows.append(
                f'<tr><td class="text">{_e(r["scaling"])}</td><td>{r["factor"]:g}</td>'
                f"<td>{r['length']}</td><td>{_n(r['ppl'])}</td>"
                f"<td>{_n(r.get('ppl_last_quarter'))}</td>"
                f'<td class="{css + " " if css else ""}text wrap">{_e(text)}</td>{note(r)}</tr>'
            )
    rule = results["answer"].get("rule") or ""
    return (
        '<section id="perplexity"><h2>Perplexity</h2>'
        f'<p class="lead">{_e(rule)} At each length the settings set for it are compared with '
        "the lowest; at L, each scaling set for the longest length is compared with none.</p>"
        + _pairings(results)
        + figure
        + _scroll(
            _head(
                "scaling",
                "factor",
                "length",
                "ppl",
                "ppl, last quarter",
                "verdict",
                *(["note"] if note(records[0]) else []),
                text=["verdict", "note"],
            )
            + "".join(rows)
        )
        + "</section>"
    )


# --- the cost ---------------------------------------------------------------------------------


def cost_section(results: Mapping[str, Any], probes: bool) -> str:
    trained = results["trained_context"]
    items = []
    for c in results["answer"].get("cost_at_L") or ():
        interval = c.get("interval")
        unit = _unit(results["records"], trained, c["scaling"], c["factor"]) or {}
        spread = (
            _paired_by(c.get("pairing", "document"), unit)
            if interval is None
            else f"{_paired_by(c.get('pairing', 'document'), unit)}: 95% interval of the "
            f"difference {interval[0]:+.3g} to {interval[1]:+.3g}"
        )
        items.append(
            f"<li>{_e(setting_name(c['scaling'], c['factor']))} at L ({trained} tokens): ppl "
            f"{_n(c['ppl'])} against {_n(c['ppl_none'])} with none: "
            f"<b>{_e(c['verdict'])}</b> ({_e(spread)})</li>"
        )
    at_l = (
        f"<h3>What each scaling set for the longest length costs at L</h3><ul>{''.join(items)}</ul>"
        if items
        else ""
    )
    heads = ["scaling", "factor", "length", "seconds, perplexity"]
    heads += ["seconds, probes"] if probes else []
    rows, note = [], _notes(results["records"])
    heads += ["peak MiB"] + (["note"] if note(results["records"][0]) else [])
    for _, units in settings_of(results["records"]):
        for r in units:
            peak = r.get("peak_bytes")
            seconds = [r.get("seconds_ppl", r.get("seconds"))]
            seconds += [r.get("seconds_probes")] if probes else []
            cells = "".join(f"<td>{_num(s)}</td>" for s in seconds)
            rows.append(
                f'<tr><td class="text">{_e(r["scaling"])}</td><td>{r["factor"]:g}</td>'
                f"<td>{r['length']}</td>{cells}"
                f"<td>{'-' if peak is None else f'{peak / 2**20:,.0f}'}</td>{note(r)}</tr>"
            )
    if not rows and not at_l:
        return ""
    return (
        '<section id="cost"><h2>The cost</h2>'
        + at_l
        + "<h3>Time and memory of each unit</h3>"
        + _scroll(_head(*heads, text=["note"]) + "".join(rows))
        + "</section>"
    )
