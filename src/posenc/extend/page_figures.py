"""The figures of a ``posenc extend`` page, each drawn only from what was measured.

- :func:`ppl_plot`: perplexity against position, one panel per measured length, one line
  per scaling, the trained context dotted;
- :func:`probe_plot`: each probe task's score against length, one panel per task that ran,
  one line per setting (scaling and factor), its 95 % Wilson interval as error bars and the
  task's bar dotted; None when no probe ran.

Titles are wrapped to the figure's width (:func:`fit_title`), so a long model name never
runs off the image. :func:`png` renders a figure to bytes.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posenc._pages import pyplot, rendered
from posenc.extend.settings import CONFIG, FACTOR_SCALINGS, NONE, REMAPS, SCALING_NAMES, UNSCALED

__all__ = [
    "DPI",
    "display_name",
    "fit_title",
    "measured_lengths",
    "png",
    "ppl_plot",
    "probe_plot",
    "probe_tasks",
    "scaling_color",
    "setting_name",
    "settings_of",
    "short_name",
]

DPI = 110
#: One color per scaling: ``none``, the registry's in their order, the position maps, and
#: the config's own.
_PALETTE = ("#444444", "#1f77b4", "#2ca02c", "#9467bd", "#d62728", "#8c564b", "#e377c2")
_COLORS = {
    name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate((NONE, *FACTOR_SCALINGS, *REMAPS))
}
_COLORS[CONFIG] = "#ff7f0e"
_OTHER = "#17becf"  # a scaling of no registry's (the searched factors)
_STYLES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "^", "D", "v")
#: The longest model name a title shows whole; a longer one keeps its two ends.
_NAME_MAX = 80


def _pyplot() -> Any:
    return pyplot("extend", "posenc extend's figures")


def display_name(model: Mapping[str, Any]) -> str:
    """The model's name as a page shows it: its ``name``, or the last part of it (or of
    its ``path``) where that is a path on this machine."""
    name = str(model.get("name") or "") or Path(str(model.get("path") or "model")).name
    return Path(name).name if os.path.isabs(name) or name.startswith("~") else name


def scaling_color(scaling: str) -> str:
    """The color of ``scaling`` in every figure of the page."""
    return _COLORS.get(scaling, _OTHER)


def setting_name(scaling: str, factor: float) -> str:
    """``yarn (factor 2)``; ``none`` and ``config`` alone (they run at factor 1)."""
    return scaling if scaling in UNSCALED and factor == 1 else f"{scaling} (factor {factor:g})"


def _order(scaling: str) -> int:
    return SCALING_NAMES.index(scaling) if scaling in SCALING_NAMES else len(SCALING_NAMES)


def settings_of(
    records: Sequence[Mapping[str, Any]],
) -> list[tuple[tuple[str, float], list[Mapping[str, Any]]]]:
    """The records grouped by setting ``(scaling, factor)``, in the order scalings are
    measured, then by factor; each group's records by length."""
    groups: dict[tuple[str, float], list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["scaling"], float(r["factor"])), []).append(r)
    keys = sorted(groups, key=lambda k: (_order(k[0]), k[0], k[1]))
    return [(k, sorted(groups[k], key=lambda r: r["length"])) for k in keys]


def measured_lengths(results: Mapping[str, Any]) -> list[int]:
    """Every length a record was measured at (``none`` at ``L`` is, even where ``L`` is not
    among the lengths asked for), ascending."""
    return sorted({*results["lengths"], *(r["length"] for r in results["records"])})


def probe_tasks(results: Mapping[str, Any]) -> list[str]:
    """The tasks at least one probe of some record scored, in the settings' order."""
    ran = {
        task
        for r in results["records"]
        for task, s in (r.get("scores") or {}).items()
        if r.get("probes") and s.get("probes")
    }
    order = list(results["settings"].get("tasks") or ())
    return [t for t in order if t in ran] + sorted(ran - set(order))


def _short(name: str) -> str:
    if len(name) <= _NAME_MAX:
        return name
    half = (_NAME_MAX - 1) // 2
    return f"{name[:half]}\N{HORIZONTAL ELLIPSIS}{name[-half:]}"


def short_name(model: Mapping[str, Any]) -> str:
    """The model's name as a figure's title shows it: :func:`display_name`, its two ends
    kept where it is long."""
    return _short(display_name(model))


def fit_title(fig: Any, text: str, *, fontsize: float = 11) -> Any:
    """``text`` as ``fig``'s title, wrapped (long words broken) until its drawn extent lies
    inside the figure's; returns the title's ``Text``."""
    width = fig.get_figwidth() * 72 / (0.62 * fontsize)  # characters of about 0.62 em
    chars = max(16, int(width))
    title = fig.suptitle(textwrap.fill(text, chars), fontsize=fontsize)
    for _ in range(12):
        fig.draw_without_rendering()
        box, frame = title.get_window_extent(), fig.bbox
        if box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y1 <= frame.y1:
            break
        chars = max(8, int(chars * 0.85))
        title.set_text(textwrap.fill(text, chars))
    return title


def _units_at(records: Sequence[Mapping[str, Any]], length: int) -> list[Mapping[str, Any]]:
    """The records at ``length`` with perplexity by position: every scaling set for that
    length, and at ``L`` also each scaling set for the longest length (its cost there)."""
    return sorted(
        (r for r in records if r["length"] == length and r.get("by_bucket")),
        key=lambda r: (_order(r["scaling"]), r["factor"]),
    )


def _panels(n: int, width: float, height: float) -> tuple[Any, Any]:
    """A figure of ``n`` panels in a row, ``width`` inches each (6.4 at the least), sharing
    their y axis: ``(fig, axes)``, ``axes[0][i]`` the i-th panel."""
    return _pyplot().subplots(
        1,
        n,
        figsize=(max(6.4, width * n), height),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )


def _legend(fig: Any, handles: Mapping[str, Any], columns: int) -> None:
    """One legend under the panels: a line per name of ``handles``, up to ``columns`` a row."""
    fig.legend(
        list(handles.values()),
        list(handles),
        loc="outside lower center",
        ncol=min(len(handles), columns),
        fontsize=8,
        frameon=False,
    )


def ppl_plot(results: Mapping[str, Any]) -> Any:
    """Perplexity by position, one panel per length with perplexity measured (None:
    none was)."""
    trained, records = results["trained_context"], results["records"]
    panels = [(n, units) for n in measured_lengths(results) if (units := _units_at(records, n))]
    if not panels:
        return None
    fig, axes = _panels(len(panels), 4.0, 4.0)
    handles: dict[str, Any] = {}
    for ax, (length, units) in zip(axes[0], panels):
        for r in units:
            mids = [(b["start"] + b["stop"]) / 2 for b in r["by_bucket"]]
            at_cost = length == trained and r["scaling"] not in UNSCALED
            (line,) = ax.plot(
                mids,
                [b["ppl"] for b in r["by_bucket"]],
                "--" if at_cost else "-",
                marker="o",
                ms=3,
                color=scaling_color(r["scaling"]),
            )
            handles.setdefault(r["scaling"], line)
        ax.axvline(trained, color="k", lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.set_xlabel("position")
        ax.set_title(f"{length} tokens", fontsize=10)
    axes[0][0].set_ylabel("perplexity (bucket)")
    _legend(fig, handles, 6)
    name = short_name(results["model"])
    fit_title(fig, f"{name}: perplexity by position (trained context {trained}, dotted)")
    return fig


def _dodge(i: int, n: int) -> float:
    return 0.0 if n < 2 else (i - (n - 1) / 2) * min(0.3 / (n - 1), 0.06)


def probe_plot(results: Mapping[str, Any]) -> Any:
    """Each probe task's score against length, with 95 % Wilson intervals (None: no probe
    ran)."""
    tasks = probe_tasks(results)
    if not tasks:
        return None
    lengths = measured_lengths(results)
    groups = [
        (k, [r for r in rs if r.get("probes") and r["length"] in lengths])
        for k, rs in settings_of(results["records"])
    ]
    groups = [(k, rs) for k, rs in groups if rs]
    factors = sorted({k[1] for k, _ in groups})
    bars = (results.get("answer") or {}).get("tasks") or {}
    fig, axes = _panels(len(tasks), 3.0, 3.8)
    handles: dict[str, Any] = {}
    for ax, task in zip(axes[0], tasks):
        for i, ((scaling, factor), rs) in enumerate(groups):
            cells = [(r["length"], r["scores"][task]) for r in rs if task in r.get("scores", {})]
            cells = [(n, s) for n, s in cells if s.get("probes")]
            if not cells:
                continue
            y = [s["score"] for _, s in cells]
            spread = [
                [max(0.0, s["score"] - s["low"]) for _, s in cells],
                [max(0.0, s["high"] - s["score"]) for _, s in cells],
            ]
            style = factors.index(factor)
            bars_drawn = ax.errorbar(
                [lengths.index(n) + _dodge(i, len(groups)) for n, _ in cells],
                y,
                yerr=spread,
                color=scaling_color(scaling),
                ls=_STYLES[style % len(_STYLES)],
                marker=_MARKERS[style % len(_MARKERS)],
                ms=4,
                lw=1.2,
                capsize=2,
            )
            handles.setdefault(setting_name(scaling, factor), bars_drawn)
        bar = bars.get(task) or {}
        if bar.get("included") and bar.get("bar") is not None:
            ax.axhline(bar["bar"], color="#888888", lw=0.8, ls=":")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=8)
        ax.set_xlim(-0.5, len(lengths) - 0.5)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("length")
        ax.set_title(task, fontsize=10)
    axes[0][0].set_ylabel("score (exact-match recall)")
    _legend(fig, handles, 5)
    fit_title(fig, "probe score by length: 95% Wilson intervals, each task's bar dotted")
    return fig


def png(fig: Any) -> bytes:
    """``fig`` rendered as PNG bytes at :data:`DPI` (the figure closed)."""
    return rendered(fig, dpi=DPI)
