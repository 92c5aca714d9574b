"""The figures and the one self-contained ``index.html`` of a ``posenc extend`` run.

- ``ppl_by_position.png``: perplexity against position, one line per scaling, one panel per
  length past ``L`` (and ``L`` itself), the trained context marked;
- ``passkey.png``: passkey accuracy, depth x length, one heat map per scaling.

The page leads with the answer (:mod:`posenc.extend.answer`), then the table of every
unit, the figures (embedded), the cost, and the model's identity and settings. It is the
report's page shell and style (:mod:`posenc._pages`); every file is written atomically
(:func:`posenc._files.atomic_write`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posenc._files import atomic_write
from posenc._pages import escape as _e
from posenc._pages import figure_html, page, pyplot, rendered
from posenc._pages import number as _num
from posenc.extend.answer import RULE
from posenc.extend.settings import CONFIG, FACTOR_SCALINGS, NONE, UNSCALED

__all__ = ["write_page"]

_DPI = 110
#: One color per scaling: ``none``, then the registry's in their order, and the config's own.
_PALETTE = ("#444444", "#1f77b4", "#2ca02c", "#9467bd", "#d62728", "#8c564b", "#e377c2")
_COLORS = {name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate((NONE, *FACTOR_SCALINGS))}
_COLORS[CONFIG] = "#ff7f0e"


def _pyplot() -> Any:
    return pyplot("extend", "posenc extend's figures")


def _n(value: Any) -> str:
    return _num(value, 4)


def _units_at(
    records: Sequence[Mapping[str, Any]], length: int, trained: int
) -> list[Mapping[str, Any]]:
    return [
        r
        for r in records
        if r["length"] == length
        and r.get("by_bucket")
        and (length != trained or r["factor"] != 1 or r["scaling"] in UNSCALED)
    ]


def _ppl_figure(results: Mapping[str, Any]) -> bytes:
    plt = _pyplot()
    lengths, trained = results["lengths"], results["trained_context"]
    fig, axes = plt.subplots(
        1, len(lengths), figsize=(4.2 * len(lengths), 3.4), squeeze=False, sharey=True
    )
    for ax, length in zip(axes[0], lengths):
        for r in _units_at(results["records"], length, trained):
            mids = [(b["start"] + b["stop"]) / 2 for b in r["by_bucket"]]
            style = "--" if length == trained and r["scaling"] != NONE else "-"
            ax.plot(
                mids,
                [b["ppl"] for b in r["by_bucket"]],
                style,
                marker="o",
                ms=3,
                color=_COLORS.get(r["scaling"]),
                label=f"{r['scaling']} x{r['factor']:g}",
            )
        ax.axvline(trained, color="k", lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.set_xlabel("position")
        ax.set_title(f"length {length}")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("perplexity (bucket)")
    fig.suptitle(
        f"{results['model']['name']}: perplexity by position (trained context {trained}, dotted)"
    )
    fig.tight_layout()
    return rendered(fig, dpi=_DPI)


def _passkey_figure(results: Mapping[str, Any]) -> bytes:
    plt = _pyplot()
    depths = list(results["settings"]["depths"])
    scalings = [
        s
        for s in results["settings"]["scalings"]
        if any(r["scaling"] == s for r in results["records"])
    ]
    lengths = results["lengths"]
    fig, axes = plt.subplots(
        1, len(scalings), figsize=(2.6 * len(scalings) + 1, 3.0), squeeze=False
    )
    image = None
    for ax, name in zip(axes[0], scalings):
        grid = [[float("nan")] * len(lengths) for _ in depths]
        for r in results["records"]:
            if r["scaling"] != name or r["length"] not in lengths or not r.get("passkey"):
                continue
            for row in r["passkey"]:
                if row["trials"]:
                    grid[depths.index(row["depth"])][lengths.index(r["length"])] = (
                        row["hits"] / row["trials"]
                    )
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], rotation=45, fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("length", fontsize=8)
    axes[0][0].set_ylabel("depth of the key")
    if image is not None:
        fig.colorbar(image, ax=axes[0].tolist(), label="passkey accuracy")
    return rendered(fig, dpi=_DPI)


def _table(results: Mapping[str, Any]) -> str:
    head = "<tr><th>scaling</th><th>factor</th><th>length</th><th>ppl</th><th>ppl, last quarter</th><th>passkey</th><th>seconds</th><th>peak MiB</th><th>note</th></tr>"
    rows = []
    for r in results["records"]:
        note = f"same as {r['same_as']}" if r.get("same_as") else ""
        peak = r.get("peak_bytes")
        rows.append(
            f"<tr><td>{_e(r['scaling'])}</td><td>{r['factor']:g}</td><td>{r['length']}</td><td>{_n(r.get('ppl'))}</td>"
            f"<td>{_n(r.get('ppl_last_quarter'))}</td><td>{_n(r.get('passkey_accuracy'))}</td><td>{_n(r.get('seconds'))}</td>"
            f"<td>{_n(None if peak is None else peak / 2**20)}</td><td>{_e(note)}</td></tr>"
        )
    return f'<div class="scroll"><table>{head}{"".join(rows)}</table></div>'


def _interval(interval: Sequence[float] | None) -> str:
    if interval is None:
        return "no interval: fewer than two documents"
    return f"95% interval of the difference {interval[0]:+.3g} to {interval[1]:+.3g}"


def _cost_lines(results: Mapping[str, Any]) -> str:
    rows = results["answer"]["cost_at_L"]
    if not rows:
        return ""
    items = "".join(
        f"<li>{_e(c['scaling'])} (factor {c['factor']:g}) at L: ppl {_n(c['ppl'])} against "
        f"{_n(c['ppl_none'])} with none: {_e(c['verdict'])} ({_e(_interval(c.get('interval')))})</li>"
        for c in rows
    )
    return f"<h2>What each scaling set for --to costs at L</h2><ul>{items}</ul>"


def write_page(results: Mapping[str, Any], out: Path) -> list[Path]:
    """Write the two figures and ``index.html`` into ``out``, each atomically; returns
    their paths."""
    ppl_png, passkey_png, index = (
        out / "ppl_by_position.png",
        out / "passkey.png",
        out / "index.html",
    )
    atomic_write(ppl_png, _ppl_figure(results))
    atomic_write(passkey_png, _passkey_figure(results))
    model, settings = results["model"], results["settings"]
    docs = ", ".join(f"{d['name']} ({d['tokens']} tokens)" for d in results["documents"])
    body = (
        f"<header><h1>posenc extend: {_e(model['name'])}</h1></header><main>"
        f'<p class="answer"><b>{_e(results["answer"]["sentence"])}</b></p>'
        f'<p class="lead">{_e(RULE)}</p>'
        f"{_table(results)}{_cost_lines(results)}"
        f"{figure_html(ppl_png, 'perplexity by position per scaling')}"
        f"{figure_html(passkey_png, 'passkey accuracy, depth x length')}"
        f"<h2>Model and settings</h2><p>{_e(model['model_type'])}, {model['parameters']} parameters, trained context "
        f"{results['trained_context']}, scaled layer types {_e(results['layer_types_scaled'])}; files "
        f"{_e(model['files'])}</p><p>Documents: {_e(docs)}</p><pre>{_e(settings)}</pre>"
        f"<p>Device {_e(results['device'])}, {results['threads']} threads, posenc {_e(results['posenc'])}.</p></main>"
    )
    atomic_write(index, page("posenc extend", body).encode("utf-8"))
    return [ppl_png, passkey_png, index]
