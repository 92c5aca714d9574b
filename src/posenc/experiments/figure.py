"""The figure of a length-generalization study: metric vs eval length, one line per run."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posenc._errors import PosEncError

__all__ = ["plot_study"]


def _style(label: str) -> dict[str, Any]:
    if label.endswith("+ft"):
        return {"linestyle": ":", "marker": "s"}
    if "+" in label:
        return {"linestyle": "--", "marker": "^"}
    return {"linestyle": "-", "marker": "o"}


def _panel(
    ax: Any, results: Mapping[str, Any], key: str, ylabel: str, log_y: bool, colors: list[Any]
) -> None:
    lengths = [int(e) for e in results["eval_lens"]]
    for run, color in zip(results["runs"], colors):
        xs, ys = [], []
        for length in lengths:
            cell = run["eval"].get(str(length), {})
            if cell.get(key) is not None:
                xs.append(length)
                ys.append(cell[key])
        if xs:
            ax.plot(xs, ys, color=color, **_style(run["encoding"]))
    ax.axvline(results["train_len"], color="0.6", linewidth=1, linestyle="-.")
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([str(n) for n in lengths])
    if log_y:
        from matplotlib.ticker import ScalarFormatter

        ax.set_yscale("log")
        for axis in (ax.yaxis,):
            axis.set_major_formatter(ScalarFormatter())
            axis.set_minor_formatter(ScalarFormatter())
    ax.set_xlabel("eval length (tokens)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)


def plot_study(results: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Draw ``results`` (what :func:`~posenc.experiments.lengthgen.run_study` returns)
    to a PNG at ``path``; returns the path.

    ``lm``: perplexity over the whole window and over the positions past the training
    length (log scale). Synthetic tasks: exact-match accuracy. The training length is
    the vertical line; cells that errored are left out of their line.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("plotting needs the 'plot' extra: pip install 'posenc[plot]'") from e
    if "runs" not in results or "eval_lens" not in results:
        raise PosEncError("results must be a run_study result (with 'runs' and 'eval_lens')")
    from matplotlib.lines import Line2D

    lm = results["metric"] == "ppl"
    runs = results["runs"]
    cmap = plt.get_cmap("tab10" if len(runs) <= 10 else "tab20")
    colors = [cmap(i % cmap.N) for i in range(len(runs))]  # one color per run, every panel
    fig, axes = plt.subplots(1, 2 if lm else 1, figsize=(12 if lm else 7, 4.4), squeeze=False)
    title = f"{results['task']}: trained at {results['train_len']} tokens"
    if lm:
        _panel(axes[0, 0], results, "ppl", "perplexity (whole window)", True, colors)
        _panel(axes[0, 1], results, "ppl_past", "perplexity (positions past train length)",
               True, colors)  # fmt: skip
    else:
        _panel(axes[0, 0], results, "accuracy", "exact-match accuracy", False, colors)
        axes[0, 0].set_ylim(-0.02, 1.02)
    handles = [
        Line2D([], [], color=c, label=r["encoding"], **_style(r["encoding"]))
        for r, c in zip(runs, colors)
    ]
    fig.legend(handles=handles, loc="center right", fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 0.86 if lm else 0.78, 1))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
