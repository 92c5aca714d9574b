"""The figure of a length-generalization study: metric vs eval length, one line per
encoding (the mean over the seeds; a band from the min to the max when there are several).

Panels: the trained encodings (``lm``: perplexity over the whole window and over the
positions past the training length; synthetic tasks: exact-match accuracy, and for
flip-flop the read error on its main split), then, when
the study extended RoPE, the extension runs beside the plain ``rope`` model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posenc._errors import PosEncError
from posenc._files import atomic_write
from posenc._pages import pyplot, rendered
from posenc.experiments.results import summarize

__all__ = ["draw_study", "plot_study"]

_METHOD_COLORS = {"pi": "tab:green", "ntk": "tab:red", "yarn": "tab:purple"}
_ERROR_OF = {"mean": "mean", "min": "max", "max": "min"}


def _style(label: str, base_colors: Mapping[str, Any], extension_panel: bool) -> dict[str, Any]:
    parts = label.split("+")
    if len(parts) == 1:
        color = "black" if extension_panel else base_colors[label]
        return {"color": color, "linestyle": "-", "marker": "o"}
    color = _METHOD_COLORS.get(parts[1], "tab:gray")
    if parts[-1] == "ft":
        return {"color": color, "linestyle": ":", "marker": "s"}
    return {"color": color, "linestyle": "--", "marker": "^"}


def _panel(
    ax: Any,
    results: Mapping[str, Any],
    labels: Sequence[str],
    key: str,
    ylabel: str,
    base_colors: Mapping[str, Any],
    extension_panel: bool,
    as_error: bool = False,
) -> None:
    """One line per label: the mean over the seeds, the min-max band when several;
    ``as_error``: an accuracy drawn as the error rate in %."""
    lengths = [int(e) for e in results["eval_lens"]]
    summary = results["summary"]
    values = []
    for label in labels:
        xs, mean, low, high = [], [], [], []
        for length in lengths:
            stats = summary[label].get(str(length), {}).get(key)
            if stats is not None:
                xs.append(length)
                if as_error:  # the min accuracy is the max error
                    stats = {k: 100.0 * (1.0 - stats[j]) for k, j in _ERROR_OF.items()}
                mean.append(stats["mean"])
                low.append(stats["min"])
                high.append(stats["max"])
        if xs:
            style = _style(label, base_colors, extension_panel)
            ax.plot(xs, mean, label=label, **style)
            if low != high:
                ax.fill_between(xs, low, high, color=style["color"], alpha=0.18, linewidth=0)
            values.extend(low + high)
    ax.axvline(results["train_len"], color="0.6", linewidth=1, linestyle="-.")
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([str(n) for n in lengths])
    ax.minorticks_off()
    if key.startswith("ppl") and values and max(values) > 10 * min(values):
        ax.set_yscale("log")  # perplexities that blow up: ratios read as distances
    ax.set_xlabel("eval length (tokens)")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if values:
        ax.legend(fontsize=7, loc="best")


def _has(results: Mapping[str, Any], key: str) -> bool:
    return any(key in cell for cells in results["summary"].values() for cell in cells.values())


def plot_study(results: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Draw ``results`` (what :func:`~posenc.experiments.lengthgen.run_study` returns)
    to a PNG at ``path``; returns the path.

    The training length is the dash-dotted vertical line; a cell that errored (a learned
    table too short for the length) is left out of its line.
    """
    fig = draw_study(results)
    path = Path(path)
    data = rendered(fig, dpi=110, format=path.suffix.lstrip(".").lower() or "png")
    atomic_write(path, data)  # a full disk keeps the previous figure whole
    return path


def draw_study(results: Mapping[str, Any]) -> Any:
    """The figure of ``results`` (a matplotlib ``Figure``, for :func:`plot_study`): one
    panel per metric, each line the mean over the seeds with its min-max band."""
    plt = pyplot("plot", "plotting")
    if not isinstance(results, Mapping) or "runs" not in results or "eval_lens" not in results:
        raise PosEncError("results must be a run_study result (with 'runs' and 'eval_lens')")
    lm = results["metric"] == "ppl"
    if "summary" not in results:  # a results.json of 0.1.0: one seed, no summary
        results = {**results, "summary": summarize(results["runs"], results["eval_lens"])}
    labels = list(results["summary"])
    base = [label for label in labels if "+" not in label]
    extended = [label for label in labels if label == "rope" or "+" in label]
    if len(extended) <= 1:
        extended = []
    cmap = plt.get_cmap("tab10")
    base_colors: dict[str, Any] = {label: cmap(i % 10) for i, label in enumerate(base)}
    base_colors.setdefault("rope", "black")
    metric = ("ppl", "perplexity") if lm else ("accuracy", "exact-match accuracy")
    panels = [(base, metric[0], f"{metric[1]} (whole window)" if lm else metric[1])]
    if lm:
        panels.append((base, "ppl_past", "perplexity (positions past train length)"))
    read_error = results["task"] == "flipflop" and _has(results, "token_accuracy")
    if read_error:  # flip-flop's main metric: the read bits wrong
        split = results.get("settings", {}).get("task_options", {}).get("eval_split", "sparse")
        panels.append((base, "token_accuracy", f"read error % ({split} split)"))
    if extended:
        panels.append((extended, metric[0], f"RoPE extended: {metric[1]}"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.4), squeeze=False)
    for ax, (subset, key, ylabel) in zip(axes[0], panels):
        error = key == "token_accuracy"
        _panel(ax, results, subset, key, ylabel, base_colors, subset is extended, error)
        if error:
            ax.set_ylim(-2, 102)
        elif not lm:
            ax.set_ylim(-0.02, 1.02)
    seeds = results.get("seeds", [0])
    spread = f"; mean of {len(seeds)} seeds, band: min-max" if len(seeds) > 1 else ""
    fig.suptitle(f"{results['task']}: trained at {results['train_len']} tokens{spread}")
    fig.tight_layout()
    return fig
