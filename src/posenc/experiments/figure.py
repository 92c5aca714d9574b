"""The figure of a length-generalization study: metric vs eval length, one line per run.

Panels: the trained encodings (``lm``: perplexity over the whole window and over the
positions past the training length; synthetic tasks: exact-match accuracy), then, when
the study extended RoPE, the extension runs beside the plain ``rope`` model.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posenc._errors import PosEncError
from posenc.experiments.checkpoint import atomic_write

__all__ = ["plot_study"]

_METHOD_COLORS = {"pi": "tab:green", "ntk": "tab:red", "yarn": "tab:purple"}


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
    runs: Sequence[Mapping[str, Any]],
    key: str,
    ylabel: str,
    base_colors: Mapping[str, Any],
    extension_panel: bool,
) -> None:
    lengths = [int(e) for e in results["eval_lens"]]
    values = []
    for run in runs:
        xs, ys = [], []
        for length in lengths:
            cell = run["eval"].get(str(length), {})
            if cell.get(key) is not None:
                xs.append(length)
                ys.append(cell[key])
        if xs:
            style = _style(run["encoding"], base_colors, extension_panel)
            ax.plot(xs, ys, label=run["encoding"], **style)
            values.extend(ys)
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


def plot_study(results: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Draw ``results`` (what :func:`~posenc.experiments.lengthgen.run_study` returns)
    to a PNG at ``path``; returns the path.

    The training length is the dash-dotted vertical line; a cell that errored (a learned
    table too short for the length) is left out of its line.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("plotting needs the 'plot' extra: pip install 'posenc[plot]'") from e
    if not isinstance(results, Mapping) or "runs" not in results or "eval_lens" not in results:
        raise PosEncError("results must be a run_study result (with 'runs' and 'eval_lens')")
    lm = results["metric"] == "ppl"
    runs = list(results["runs"])
    base = [r for r in runs if "+" not in r["encoding"]]
    extended = [r for r in runs if r["encoding"] == "rope" or "+" in r["encoding"]]
    if len(extended) <= 1:
        extended = []
    cmap = plt.get_cmap("tab10")
    base_colors: dict[str, Any] = {r["encoding"]: cmap(i % 10) for i, r in enumerate(base)}
    base_colors.setdefault("rope", "black")
    metric = ("ppl", "perplexity") if lm else ("accuracy", "exact-match accuracy")
    panels = [(base, metric[0], f"{metric[1]} (whole window)" if lm else metric[1])]
    if lm:
        panels.append((base, "ppl_past", "perplexity (positions past train length)"))
    if extended:
        panels.append((extended, metric[0], f"RoPE extended: {metric[1]}"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.4), squeeze=False)
    for ax, (subset, key, ylabel) in zip(axes[0], panels):
        _panel(ax, results, subset, key, ylabel, base_colors, subset is extended)
        if not lm:
            ax.set_ylim(-0.02, 1.02)
    fig.suptitle(f"{results['task']}: trained at {results['train_len']} tokens")
    fig.tight_layout()
    path = Path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=110, format=path.suffix.lstrip(".").lower() or "png")
    plt.close(fig)
    atomic_write(path, buffer.getvalue())  # a full disk keeps the previous figure whole
    return path
