"""The report's headline figure: perplexity against length with the seed spread, and the
growth past L beside Press et al.'s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc._pages import pyplot
from posenc.report.literature import press_ratios

__all__ = ["draw_headline"]

_COLORS = {
    "none": "tab:gray",
    "sinusoidal": "tab:blue",
    "learned": "tab:brown",
    "rope": "black",
    "alibi": "tab:green",
    "t5": "tab:orange",
}


def draw_headline(
    results: Mapping[str, Any], ratios: Mapping[str, Any], *, dpi: int, figsize=(12, 4.6)
) -> Any:
    """Left: perplexity at each eval length, mean line and min-max band per trained
    encoding (learned: at L only, where it can run). Right: ``ppl(nL) / ppl(L)`` against
    ``n``, ours (solid, band) and Press et al.'s Table 2 (dashed, hollow markers)."""
    plt = pyplot("plot", "posenc report")
    train_len = results["train_len"]
    summary = results["summary"]
    labels = [label for label in summary if "+" not in label]
    fig, (left, right) = plt.subplots(1, 2, figsize=figsize, dpi=dpi)
    for i, label in enumerate(labels):
        color = _COLORS.get(label, plt.get_cmap("tab10")(i % 10))
        xs, mean, low, high = _perplexities(results, label)
        if not xs:
            continue
        _band(left, xs, (mean, low, high), color=color, label=label)
        cells = ratios.get(label, {})
        rx = [int(n) / train_len for n in cells]
        if len(rx) > 1:
            stats = [[c[k] for c in cells.values()] for k in ("mean", "min", "max")]
            _band(right, rx, stats, color=color, label=label)
    for method, points in press_ratios().items():
        if method in labels:
            xs = sorted(points)
            right.plot(
                xs,
                [points[x] for x in xs],
                color=_COLORS[method],
                linestyle="--",
                marker="o",
                markerfacecolor="white",
                label=f"{method} (Press et al.)",
            )
    _perplexity_axes(left, results)
    _growth_axes(right, results)
    fig.tight_layout()
    return fig


def _perplexities(results: Mapping[str, Any], label: str) -> tuple[list[Any], ...]:
    """``(lengths, mean, min, max)`` of ``label``'s metric over the seeds, at each eval
    length where it was measured."""
    xs: list[Any] = []
    mean: list[Any] = []
    low: list[Any] = []
    high: list[Any] = []
    for length in results["eval_lens"]:
        stats = results["summary"][label][str(length)].get(results["metric"])
        if stats is not None:
            xs.append(length)
            mean.append(stats["mean"])
            low.append(stats["min"])
            high.append(stats["max"])
    return xs, mean, low, high


def _band(ax: Any, xs: list[Any], stats: Any, *, color: Any, label: str) -> None:
    """The mean as a line with markers over a band from the min to the max."""
    mean, low, high = stats
    ax.plot(xs, mean, color=color, marker="o", label=label)
    ax.fill_between(xs, low, high, color=color, alpha=0.2, linewidth=0)


def _perplexity_axes(left: Any, results: Mapping[str, Any]) -> None:
    train_len, metric = results["train_len"], results["metric"]
    lengths = list(results["eval_lens"])
    left.axvline(train_len, color="0.6", linewidth=1, linestyle="-.")
    left.set_xscale("log", base=2)
    left.set_xticks(lengths)
    left.set_xticklabels([f"{n}\n{n // train_len}L" for n in lengths])
    left.minorticks_off()
    left.set_xlabel("eval length (tokens)")
    left.set_ylabel("perplexity per byte" if metric == "ppl" else metric)
    left.set_title(f"trained at L = {train_len}; mean and min-max of {len(results['seeds'])} seeds")
    left.grid(True, alpha=0.3)
    left.legend(fontsize=8, loc="upper left")


def _growth_axes(right: Any, results: Mapping[str, Any]) -> None:
    train_len = results["train_len"]
    right.axhline(1.0, color="0.6", linewidth=1)
    right.set_xscale("log", base=2)
    multiples = sorted({n / train_len for n in results["eval_lens"]} | {1.0})
    right.set_xticks(multiples)
    right.set_xticklabels([f"{m:g}L" for m in multiples])
    right.minorticks_off()
    right.set_yscale("log")
    right.set_xlabel("eval length / train length")
    right.set_ylabel("ppl(nL) / ppl(L)")
    right.set_title("growth past L: ours (solid) and Press et al. 2022 (dashed)")
    right.grid(True, alpha=0.3, which="both")
    right.legend(fontsize=7, loc="upper left", ncol=2)
