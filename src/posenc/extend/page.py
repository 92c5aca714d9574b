"""The one self-contained ``index.html`` of a ``posenc extend`` run, and its figures.

The page is the report's shell and style (:mod:`posenc._pages`), and shows only what was
measured, in the order a user needs it: the answer's lead line first (``answer["lead"]``;
a hybrid model's note beside it), then the effective length of each setting, the position
maps' parameters, each probe task's bar, the probe scores with their 95 % Wilson
intervals, perplexity, the cost, the factor search (:mod:`posenc.extend.page_search`),
the setting written for each engine (``results["emit"]``; for a position map, the
``patch(model, scaling=...)`` that runs it) and the model's identity and settings as a
table. A section, a figure or a column with nothing measured behind it is left out (no
probe ran: no probe table, no ``probes.png``; no search: no ``search.png``).

Two settings are ordered only where the answer's verdicts (the project's one comparison
rule, :func:`posenc.experiments.comparisons.paired_verdict`) say so; anything else is
``level``. No machine path reaches the page: the model is named by its name and its files'
SHA-256, text files by their names, and any absolute path left in a string (the model's,
the texts', the output folder's) is cut to its last part. Every file is written atomically
(:func:`posenc._files.atomic_write`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from posenc._files import atomic_write
from posenc._pages import escape as _e
from posenc._pages import figure_html, page
from posenc.extend.page_figures import (
    display_name,
    measured_lengths,
    png,
    ppl_plot,
    probe_plot,
    probe_tasks,
    setting_name,
)
from posenc.extend.page_search import SEARCH_FIGURE, search_plot, search_section
from posenc.extend.page_sections import (
    bar_section,
    cost_section,
    effective_section,
    lengths_text,
    map_runs,
    maps_section,
    ppl_section,
    probe_section,
)

__all__ = ["write_page"]

PPL_FIGURE, PROBE_FIGURE, INDEX = "ppl_by_position.png", "probes.png", "index.html"
#: Figures an earlier run may have left that this page does not draw (``passkey.png``:
#: before the probes).
_FIGURES = (PPL_FIGURE, PROBE_FIGURE, SEARCH_FIGURE, "passkey.png")


def _chosen_map(results: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The position map of the setting written for the engines (None: a plain scaling)."""
    spec = (results.get("chosen") or {}).get("spec")
    if isinstance(spec, Mapping) and spec.get("type") in ("self_extend", "string"):
        return spec
    return None


def _lead(results: Mapping[str, Any]) -> str:
    answer = results["answer"]
    lead = answer.get("lead") or answer.get("sentence") or "Nothing was measured."
    choice = results.get("chosen") or answer.get("choice")
    if choice:
        where = " (below: the setting for each engine)" if results.get("emit") else ""
        chosen = (
            f"The setting chosen to write: {setting_name(choice['scaling'], choice['factor'])}"
            f" for {choice['length']} tokens{where}."
        )
        remap = _chosen_map(results)
        if remap is not None:
            chosen += f" A position map: it runs in {map_runs(remap)}."
    else:
        chosen = "No setting was chosen to write: see each setting's effective length below."
    note = results.get("model_note")
    note_html = f'<p class="lead" id="model-note">{_e(note)}.</p>' if note else ""
    return (
        f'<p class="answer" id="lead"><b>{_e(lead)}</b></p><p class="lead">{_e(chosen)}</p>'
        + note_html
    )


def _patch_snippet(results: Mapping[str, Any], remap: Mapping[str, Any]) -> str:
    """The Python that runs the chosen position map: transformers' model, posenc's patch."""
    model = results["model"]
    name = display_name(model)
    if str(model.get("path", "")).endswith(".gguf"):
        where = f"'.', gguf_file={Path(str(model['path'])).name!r}"
    else:
        where = repr(name)
    code = (
        "import transformers\n"
        "from posenc.integrations.transformers import patch\n\n"
        f"model = transformers.AutoModelForCausalLM.from_pretrained({where})\n"
        f"model = patch(model, scaling={dict(remap)!r})\n"
    )
    return (
        '<div class="demo engine" id="engine-posenc"><h3>transformers with posenc</h3>'
        f"<p>No engine config carries this position map; it runs in {_e(map_runs(remap))}:</p>"
        f'<pre class="command">{_e(code)}</pre></div>'
    )


# --- the setting for each engine ----------------------------------------------------------------


def _engine(name: str, e: Mapping[str, Any]) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    head = f'<div class="demo engine" id="engine-{_e(slug)}"><h3>{_e(name)}</h3>'
    if "refused" in e:
        return f'{head}<p class="absent"><b>Refused:</b> {_e(e["refused"])}</p></div>'
    parts = [head]
    if e.get("command"):
        parts.append(f'<pre class="command">{_e(e["command"])}</pre>')
    if e.get("files"):
        files = ", ".join(f"<code>{_e(f)}</code>" for f in e["files"])
        parts.append(f"<p>Files: {files}</p>")
    if e.get("settings"):
        data = json.dumps(e["settings"], indent=2, default=str)
        parts.append(
            f'<details><summary>settings as data</summary><pre class="command">{_e(data)}</pre>'
            "</details>"
        )
    warnings = "".join(
        f'<li class="no"><b>warning</b>: {_e(w)}</li>' for w in e.get("warnings") or ()
    )
    if warnings:
        parts.append(f'<ul class="checks">{warnings}</ul>')
    if e.get("checked"):
        parts.append(f'<p class="verdict">Checked: {_e(e["checked"])}</p>')
    return "".join(parts) + "</div>"


def _engines_section(results: Mapping[str, Any]) -> str:
    emit = results.get("emit") or {}
    if not emit:
        return ""
    choice = results.get("chosen") or results["answer"].get("choice")
    remap = _chosen_map(results)
    snippet = _patch_snippet(results, remap) if remap is not None else ""
    what = (
        f"{setting_name(choice['scaling'], choice['factor'])} for {choice['length']} tokens"
        if choice
        else "the chosen setting"
    )
    return (
        '<section id="engines"><h2>The setting for each engine</h2>'
        f'<p class="lead">{_e(what)}, in each engine\'s own spelling; files are in this '
        "folder. A warning is a known silent failure of that engine with this scaling.</p>"
        + snippet
        + "".join(_engine(name, e) for name, e in emit.items())
        + "</section>"
    )


# --- the model and the settings ---------------------------------------------------------------


def _unpath(text: str) -> str:
    return Path(text).name if os.path.isabs(text) or text.startswith("~") else text


def _plain(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_plain(v) for v in value) or "none"
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {_plain(v)}" for k, v in value.items()) or "none"
    return _unpath(str(value))


_LABELS = {
    "to": "longest length (multiple of L)",
    "multiples": "lengths (multiples of L)",
    "scalings": "scalings",
    "texts": "text files",
    "documents": "documents (at most)",
    "depths": "needle depths",
    "trials": "haystacks per setting and length",
    "seed": "seed",
    "dtype": "dtype",
    "device": "device asked for",
    "context": "trained context given",
    "quick": "quick run",
    "tasks": "probe tasks",
    "bar": "bar (share of the unscaled score at the shortest length)",
    "ppl_tolerance": "perplexity tolerance (rise over none at L)",
    "emit": "engines written",
}


def _pairs(rows: Sequence[tuple[str, str]]) -> str:
    body = "".join(
        f'<tr><th class="text" scope="row">{_e(k)}</th><td class="text wrap">{_e(v)}</td></tr>'
        for k, v in rows
    )
    return f'<div class="scroll"><table class="pairs">{body}</table></div>'


def _model_rows(results: Mapping[str, Any]) -> list[tuple[str, str]]:
    model = results["model"]
    rows = [("model", display_name(model)), ("model type", str(model.get("model_type", "?")))]
    if isinstance(model.get("parameters"), int):
        rows.append(("parameters", f"{model['parameters']:,}"))
    rows.append(("trained context (L)", f"{results['trained_context']} tokens"))
    types = [t for t in results.get("layer_types_scaled") or () if t is not None]
    if types:
        rows.append(("layer types scaled", ", ".join(map(str, types))))
    nope = [str(i) for i, f in enumerate(results.get("rope_layers") or ()) if not f]
    if nope:
        rows.append(("layers without RoPE (left as they are)", ", ".join(nope)))
    rows += [("file", f"{n}: SHA-256 {h[:16]}") for n, h in (model.get("files") or {}).items()]
    rows += [
        (
            "document",
            f"{d['name']}: {d['tokens']:,} tokens, SHA-256 {str(d.get('sha256', ''))[:16]}",
        )
        for d in results.get("documents") or ()
    ]
    rows.append(("lengths measured", lengths_text(measured_lengths(results))))
    if results.get("estimated_peak_bytes"):
        rows.append(
            ("estimated peak memory", f"{results['estimated_peak_bytes'] / 2**20:,.0f} MiB")
        )
    rows.append(("ran on", f"{results['device']}, {results['threads']} threads"))
    rows.append(("posenc", str(results["posenc"])))
    return rows


def _settings_rows(results: Mapping[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for key, value in results["settings"].items():
        if key == "model":
            continue  # the model is named above, by its name and its files' hashes
        if key == "texts":
            text = _plain([Path(str(t)).name for t in value]) if value else ""
            rows.append((_LABELS[key], text or "the longest Python standard-library sources"))
        elif key == "context" and value is None:
            rows.append((_LABELS[key], f"no: the config's ({results['trained_context']})"))
        else:
            rows.append((_LABELS.get(key, key), _plain(value)))
    return rows


def _model_section(results: Mapping[str, Any]) -> str:
    return (
        '<section id="model"><h2>The model, and where it ran</h2>'
        + _pairs(_model_rows(results))
        + "</section>"
    )


def _settings_section(results: Mapping[str, Any]) -> str:
    return (
        '<section id="settings"><h2>Settings of this run</h2>'
        + _pairs(_settings_rows(results))
        + "</section>"
    )


# --- the page -----------------------------------------------------------------------------------


def _scrubber(results: Mapping[str, Any], out: Path) -> Callable[[str], str]:
    """A function that cuts every machine path this run knows of to its last part."""
    short: dict[str, str] = {}
    model, settings = results["model"], results["settings"]
    texts = settings.get("texts") or ()
    for path in (model.get("path"), settings.get("model"), model.get("name"), *texts):
        if path and os.path.isabs(str(path)):
            short[str(path)] = Path(str(path)).name
    for folder in {str(out.absolute()), str(out.resolve())}:
        short[folder + os.sep], short[folder] = "", "OUT"
    home = str(Path.home())
    if len(home) > 1:
        short[home + os.sep] = "~" + os.sep
    order = sorted((p for p in short if len(p) > 1), key=len, reverse=True)

    def scrub(html: str) -> str:
        for p in order:
            html = html.replace(_e(p), _e(short[p])).replace(p, short[p])
        return html

    return scrub


def _header(results: Mapping[str, Any], sections: Sequence[tuple[str, str]]) -> str:
    model = results["model"]
    nav = "".join(f'<a href="#{anchor}">{_e(title)}</a>' for anchor, title in sections)
    return (
        f"<header><h1>posenc extend: {_e(display_name(model))}</h1>"
        f'<p class="meta">{_e(model.get("model_type", "?"))} &middot; trained context '
        f"{results['trained_context']} tokens &middot; measured at "
        f"{_e(lengths_text(measured_lengths(results)))} &middot; posenc {_e(results['posenc'])} &middot; "
        'every number in <a href="results.json" style="color:#fff">results.json</a></p>'
        f"<nav>{nav}</nav></header>"
    )


_NAV = {
    "effective": "Effective length",
    "maps": "Position maps",
    "bars": "Bars",
    "probes": "Probes",
    "perplexity": "Perplexity",
    "cost": "Cost",
    "search": "Search",
    "engines": "Engines",
    "model": "Model",
    "settings": "Settings",
}


def _figure(out: Path, name: str, fig: Any, written: list[Path]) -> str:
    if fig is None:
        return ""
    atomic_write(out / name, png(fig))
    written.append(out / name)
    return "\x00" + name + "\x00"


def write_page(results: Mapping[str, Any], out: Path) -> list[Path]:
    """Write the figures of what was measured (``ppl_by_position.png``, ``probes.png``
    when a probe ran, ``search.png`` after a factor search) and ``index.html`` into
    ``out``, each atomically;
    returns their paths, the page last. A figure of an earlier run that this one does not
    draw is removed."""
    written: list[Path] = []
    tasks = probe_tasks(results)
    titles = {
        PPL_FIGURE: "perplexity by position per scaling, one panel per length",
        PROBE_FIGURE: "probe score by length per setting, 95% Wilson intervals",
        SEARCH_FIGURE: "the searched factor per band beside PI's, NTK's and YaRN's; the best "
        "validation perplexity by evaluation",
    }
    ppl = _figure(out, PPL_FIGURE, ppl_plot(results), written)
    probes = _figure(out, PROBE_FIGURE, probe_plot(results), written)
    searched = _figure(out, SEARCH_FIGURE, search_plot(results), written)
    for stale in set(_FIGURES) - {p.name for p in written}:
        (out / stale).unlink(missing_ok=True)
    sections = {
        "effective": effective_section(results, bool(tasks)),
        "maps": maps_section(results),
        "bars": bar_section(results, tasks) if tasks else "",
        "probes": probe_section(results, tasks, probes) if tasks else "",
        "perplexity": ppl_section(results, ppl),
        "cost": cost_section(results, bool(tasks)),
        "search": search_section(results, searched),
        "engines": _engines_section(results),
        "model": _model_section(results),
        "settings": _settings_section(results),
    }
    shown = [(k, _NAV[k]) for k, html in sections.items() if html]
    body = (
        _header(results, shown)
        + "<main>"
        + _lead(results)
        + "".join(sections.values())
        + "<footer>Made by <code>posenc extend</code>. Figures are also in this folder as "
        "PNG files; every number is in <code>results.json</code>.</footer></main>"
    )
    body = _scrubber(results, out)(body)
    for p in written:
        body = body.replace("\x00" + p.name + "\x00", figure_html(p, titles[p.name]))
    atomic_write(out / INDEX, page("posenc extend", body).encode("utf-8"))
    return [*written, out / INDEX]
