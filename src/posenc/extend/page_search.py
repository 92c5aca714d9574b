"""The factor search on a ``posenc extend`` page: ``results["search"]`` (the record of
:func:`posenc.extend.search.run_search` with the export of
:mod:`posenc.extend.search_export`), in words, in a figure and as the files it was written to.

- :func:`search_section`: the section "Searched factors": what was searched, scored on what
  and for how long, where the best candidate came from and its validation perplexity beside
  each seed's, the factors per band, and each exported file with what its read-back checked;
  empty without a search;
- :func:`search_plot`: ``search.png``: the best candidate's factor per band against the
  band's wavelength (log x) beside PI's, NTK's and YaRN's, and the best validation
  perplexity after each evaluation beside each seed's; None without a search.

Only what the record holds is said: a seed the budget left unscored is named as such, and
nothing is called better than anything (the units ``search`` are compared with the other
settings by the answer's verdicts, elsewhere on the page).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from posenc._pages import escape as _e
from posenc._pages import number as _num
from posenc._pages import pyplot
from posenc.extend.page_figures import fit_title, scaling_color, short_name

__all__ = ["SEARCH_FIGURE", "search_plot", "search_section"]

SEARCH_FIGURE = "search.png"
#: The seeds as the search names them, as the page names them, and their scaling's color.
_SEEDS = (("pi", "PI", "linear"), ("ntk", "NTK", "ntk"), ("yarn", "YaRN", "yarn"))
_ORIGINS = {
    "pi": "the PI seed itself",
    "ntk": "the NTK seed itself",
    "yarn": "the YaRN seed itself",
    "mutation": "a mutation",
    "crossover": "a crossover",
}
_STOPPED = {
    "budget": "the next candidate would have run past the budget",
    "evaluations": "the cap on candidates scored was reached",
    "exhausted": "no new candidate could be drawn",
}


def _ppl(value: Any) -> str:
    return "not finite" if value is None else _num(value, 4)


def _against(seeds: Mapping[str, Any]) -> str:
    """``PI 12.3, NTK 11.2 and YaRN 10.9``; a seed left unscored is named as such."""
    scored = [f"{label} {_ppl(seeds[key])}" for key, label, _ in _SEEDS if key in seeds]
    missing = [label for key, label, _ in _SEEDS if key not in seeds]
    text = (
        ", ".join(scored[:-1]) + " and " + scored[-1] if len(scored) > 1 else "".join(scored)
    ) or "no seed"
    if missing:
        text += f" ({' and '.join(missing)} not scored within the budget)"
    return text


def _cost(found: Mapping[str, Any], results: Mapping[str, Any]) -> str:
    """What the budget was spent on, and what a full-size search would add."""
    length, target = found["length"], found["target"]
    proxy = f"a proxy scoring length ({length} of {target} tokens), " if length < target else ""
    device = str(results.get("device") or "?")
    where = f"{results.get('threads', '?')} CPU threads"
    spent = f"{proxy}one validation document, a population of {found['population']}."
    if not device.startswith("cpu"):
        return f" It ran on {device}: {spent}"
    full = "scored at the target length, " if length < target else ""
    return (
        f" This budget fits {where}: {spent} A full-size search ({full}a larger population, "
        "more generations) belongs on a GPU."
    )


def _what(found: Mapping[str, Any], results: Mapping[str, Any]) -> str:
    """The search in words, every number read off ``found``."""
    trained, best, v = results["trained_context"], found["best"], found["validation"]
    measured = any(r.get("scaling") == "search" for r in results.get("records") or ())
    unit = (
        " The units <code>search</code> measure it on the evaluation documents like every "
        "other setting (above: the effective length and perplexity)."
        if measured
        else ""
    )
    return (
        f"An evolutionary search over one rescale factor per rotary frequency pair "
        f"({len(best['long_factor'])} pairs; \u03bb<sub>i</sub> \u2265 1, non-decreasing from "
        f"high to low frequency, at most {_num(2 * found['factor'])}, twice target/L), started "
        "from PI, NTK and YaRN and evolved by mutation and crossover (LongRoPE, Ding et al. "
        f"2024), from seed {found['seed']}. Each candidate was scored by the perplexity of "
        f"<code>{_e(v['name'])}</code>, a standard-library source none of the evaluation "
        f"documents is, over its first {found['length']} tokens ({found['length'] / trained:g}"
        f" L; the evaluation runs to {found['target']}). It scored {found['evaluated']} "
        f"candidate{'' if found['evaluated'] == 1 else 's'} in {found['generations']} "
        f"generation{'' if found['generations'] == 1 else 's'}, in "
        f"{_num(found['seconds'] / 60)} of {found['minutes']:g} minutes (stopped: "
        f"{_e(_STOPPED.get(found['stopped'], found['stopped']))}). The best came from "
        f"{_e(_ORIGINS.get(best['origin'], best['origin']))} (generation {best['generation']}),"
        f" with validation perplexity {_ppl(best['ppl'])} against "
        f"{_e(_against(found.get('seeds') or {}))}.{unit} LongRoPE's starting-token window "
        "(n\u0302) is not searched: the longrope of transformers, vLLM and llama.cpp cannot "
        "express it." + _e(_cost(found, results))
    )


def _bands_table(found: Mapping[str, Any]) -> str:
    """Each band's wavelength, the best factor and the seeds', in a closed ``<details>``."""
    bands = found.get("bands") or {}
    waves, best = bands.get("wavelength") or (), found["best"]["long_factor"]
    if len(waves) != len(best):
        return ""
    seeds = [(key, label) for key, label, _ in _SEEDS if len(bands.get(key) or ()) == len(best)]
    head = "".join(f"<th>{_e(label)}</th>" for _, label in seeds)
    rows = "".join(
        f"<tr><td>{i}</td><td>{_num(w)}</td><td>{_num(best[i], 4)}</td>"
        + "".join(f"<td>{_num(bands[key][i], 4)}</td>" for key, _ in seeds)
        + "</tr>"
        for i, w in enumerate(waves)
    )
    return (
        "<details><summary>the factor of each band</summary>"
        '<div class="scroll"><table><thead><tr><th>band</th><th>wavelength (tokens)</th>'
        f"<th>best</th>{head}</tr></thead>{rows}</table></div></details>"
    )


def _exported(found: Mapping[str, Any]) -> str:
    """Each file written from the best candidate, its settings and what reading it back
    checked."""
    export = found.get("export") or {}
    items = []
    hf = export.get("transformers")
    if hf:
        params = (hf.get("settings") or {}).get("rope_parameters") or {}
        short = params.get("short_factor") or ()
        parts = [f"rope_type {params.get('rope_type')}"]
        if short and all(f == 1 for f in short):
            parts.append("short factors all 1")
        parts.append(f"the {len(params.get('long_factor') or ())} long factors")
        parts.append(
            f"original_max_position_embeddings {params.get('original_max_position_embeddings')}"
        )
        parts.append(f"factor {_num(params.get('factor'))}")
        files = ", ".join(f"<code>{_e(f)}</code>" for f in hf.get("files") or ())
        items.append(f"<li>{files}: {_e(', '.join(parts))}. Checked: {_e(hf.get('checked'))}</li>")
    gguf = export.get("gguf")
    if gguf:
        files = ", ".join(f"<code>{_e(f)}</code>" for f in gguf.get("files") or ())
        items.append(
            f"<li>{files}: the GGUF copy with the tensors <code>rope_factors_long</code> and "
            f"<code>rope_factors_short</code>. Checked: {_e(gguf.get('checked'))}</li>"
        )
    if not items:
        return ""
    return (
        f'<h3>Where the best candidate was written</h3><ul id="search-export">{"".join(items)}</ul>'
    )


def search_section(results: Mapping[str, Any], figure: str) -> str:
    """The section "Searched factors" (module docstring); empty without a search."""
    found = results.get("search")
    if not found:
        return ""
    return (
        '<section id="search"><h2>Searched factors</h2>'
        f'<p class="lead">{_what(found, results)}</p>'
        + figure
        + _bands_table(found)
        + _exported(found)
        + "</section>"
    )


def _bands_panel(ax: Any, found: Mapping[str, Any], trained: int) -> None:
    bands = found["bands"]
    waves = bands["wavelength"]
    for (key, label, scaling), style in zip(_SEEDS, ("--", ":", "-.")):
        if len(bands.get(key) or ()) == len(waves):
            ax.plot(waves, bands[key], style, color=scaling_color(scaling), lw=1.4, label=label)
    ax.plot(
        waves,
        found["best"]["long_factor"],
        "-",
        marker="o",
        ms=3,
        color=scaling_color("search"),
        lw=1.8,
        label="best found",
    )
    ax.axvline(trained, color="k", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("wavelength of the band (tokens; L dotted)")
    ax.set_ylabel("rescale factor \u03bb")
    ax.set_title("factor per band", fontsize=10)
    ax.legend(fontsize=8, frameon=False)


def _history_panel(ax: Any, found: Mapping[str, Any], history: Sequence[tuple[int, float]]) -> None:
    ax.step(
        [i for i, _ in history],
        [p for _, p in history],
        where="post",
        lw=1.8,
        color=scaling_color("search"),
        label="best so far",
    )
    values = [p for _, p in history]
    seeds = found.get("seeds") or {}
    for (key, label, scaling), style in zip(_SEEDS, ("--", ":", "-.")):
        if seeds.get(key) is not None:
            ax.axhline(seeds[key], ls=style, lw=1.2, color=scaling_color(scaling), label=label)
            values.append(seeds[key])
    if max(values) > 10 * min(values):
        ax.set_yscale("log")
    ax.set_xlabel("candidates scored")
    ax.set_ylabel("validation perplexity")
    ax.set_title("best validation perplexity by evaluation", fontsize=10)
    ax.legend(fontsize=8, frameon=False)


def search_plot(results: Mapping[str, Any]) -> Any:
    """``search.png`` (module docstring): one panel per kind of data the record holds;
    None without a search."""
    found = results.get("search")
    if not found:
        return None
    best = found["best"]["long_factor"]
    waves = (found.get("bands") or {}).get("wavelength") or ()
    history = [
        (i + 1, p) for i, p in enumerate(found.get("best_ppl_by_evaluation") or ()) if p is not None
    ]
    panels = [p for p, has in (("bands", len(waves) == len(best) > 0), ("history", history)) if has]
    if not panels:
        return None
    fig, axes = pyplot("extend", "posenc extend's figures").subplots(
        1,
        len(panels),
        figsize=(max(6.4, 4.6 * len(panels)), 4.2),
        squeeze=False,
        layout="constrained",
    )
    for ax, panel in zip(axes[0], panels):
        if panel == "bands":
            _bands_panel(ax, found, results["trained_context"])
        else:
            _history_panel(ax, found, history)
    name = short_name(results["model"])
    fit_title(
        fig,
        f"{name}: searched factors for {found['target']} tokens (trained context "
        f"{results['trained_context']}), scored on {found['validation']['name']}",
    )
    return fig
