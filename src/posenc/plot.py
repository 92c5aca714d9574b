"""Pictures of what an encoding does (the ``plot`` extra: ``pip install 'posenc[plot]'``).

Every function takes an encoding (a module, a registry name or a config dict, built as
:mod:`posenc.analysis` builds them) and returns a :class:`matplotlib.figure.Figure` drawn on
the Agg canvas, ``figsize * dpi`` pixels when saved. No pyplot state is touched, so the
functions are safe in scripts, servers and notebooks alike; save with :func:`save_figure`
or ``fig.savefig``.

- :func:`plot_table`: the table as a heatmap (rotary: cos and sin of every angle ``p * theta_i``);
- :func:`plot_similarity`: cosine similarity of every pair of positions;
- :func:`plot_decay`: similarity against distance for several encodings (rotary: with
  RoFormer's bound), and the mean bias of bias encodings;
- :func:`plot_bias`: the bias map of each head;
- :func:`plot_clock_hands`: the rotation angle of each position, one clock per frequency.
"""

from __future__ import annotations

import io
import math
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from posenc._angles import reduced_angles
from posenc._base import Encoding
from posenc._errors import PosEncError, check_int
from posenc.analysis._encodings import (
    additive_table,
    bias_matrix,
    inv_freq,
    resolve_encoding,
    resolve_positions,
    rotary_matrices,
)
from posenc.analysis.properties import EncodingSpec, Positions
from posenc.analysis.relative import Decay, decay

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "FORMATS",
    "figure_bytes",
    "plot_bias",
    "plot_clock_hands",
    "plot_decay",
    "plot_similarity",
    "plot_table",
    "save_figure",
]

FORMATS = ("png", "svg")


def _figure(figsize: tuple[float, float], dpi: int) -> Figure:
    """A new figure on its own Agg canvas (pyplot and the global backend are untouched)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("posenc.plot needs matplotlib: pip install 'posenc[plot]'") from e
    _check_figsize(figsize)
    dpi = check_int("dpi", dpi, min=10, max=1000)
    fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _check_figsize(figsize: Any) -> None:
    """Two finite positive numbers (inches) in a tuple or list, at most 1000 inches each."""
    if (
        not isinstance(figsize, (tuple, list))
        or len(figsize) != 2
        or not all(
            isinstance(v, numbers.Real)
            and not isinstance(v, bool)
            and type(v).__name__ != "bool_"
            and 0 < cast(Any, v) <= 1000
            for v in figsize
        )
    ):
        raise PosEncError(
            f"figsize must be two positive numbers (inches, <= 1000 each) in a tuple or list, "
            f"got {figsize!r}"
        )


def _label(enc: Any) -> str:
    return str(enc.name)


def _np(x: torch.Tensor) -> Any:
    return x.detach().to(torch.float64).numpy()


def _heatmap(
    ax: Any, values: torch.Tensor, top: float, extent: tuple[float, ...], **kw: Any
) -> Any:
    """``values`` as an image on ``ax``, from ``-top`` (blue) to ``top`` (red)."""
    return ax.imshow(
        _np(values),
        cmap="RdBu_r",
        vmin=-top,
        vmax=top,
        interpolation="nearest",
        extent=extent,
        **kw,
    )


def _titled(fig: Figure, ax: Any, im: Any, xlabel: str, title: str) -> Figure:
    """``ax`` with its labels (positions down), ``title`` and a colorbar of ``im``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel("position p")
    ax.set_title(title)
    fig.colorbar(im, ax=ax)
    return fig


def plot_table(
    encoding: EncodingSpec,
    positions: Positions = None,
    *,
    figsize: tuple[float, float] = (8.0, 4.5),
    dpi: int = 100,
) -> Figure:
    """The encoding's table as a heatmap: position down, channel across.

    Additive: ``PE(p)``. Rotary: ``cos`` and ``sin`` of ``p * theta_i`` side by side (one
    column per frequency ``i``, highest frequency first). Bias: :func:`plot_bias`.

    Args:
        encoding: an encoding module, registry name or config dict.
        positions: a count, a ``(start, stop)`` range or explicit positions (default 0..127).
        figsize, dpi: size of the figure in inches and its resolution.

    Examples:
        >>> from posenc.plot import plot_table
        >>> fig = plot_table("sinusoidal", 64, figsize=(4, 3), dpi=50)
        >>> fig.canvas.get_width_height()
        (200, 150)
    """
    enc = resolve_encoding(encoding)
    if enc.kind == "bias":
        return plot_bias(enc, positions, figsize=figsize, dpi=dpi)
    pos = resolve_positions(positions, (0, 128))
    fig = _figure(figsize, dpi)
    top_row, bottom_row = float(pos[0]) - 0.5, float(pos[-1]) + 0.5  # imshow extent, y down
    if enc.kind == "rotary":
        angles = reduced_angles(pos, inv_freq(enc))  # [n, r/2]
        axes = fig.subplots(1, 2, sharey=True)
        for ax, values, name in zip(axes, (angles.cos(), angles.sin()), ("cos", "sin")):
            extent = (-0.5, values.shape[1] - 0.5, bottom_row, top_row)
            im = _heatmap(ax, values, 1, extent, aspect="auto")
            ax.set_title(f"{name}(p * theta_i)")
            ax.set_xlabel("frequency i")
        axes[0].set_ylabel("position p")
        fig.colorbar(im, ax=list(axes))
        fig.suptitle(f"{_label(enc)}: rotation angles of {angles.shape[-1]} frequencies")
        return fig
    table = additive_table(enc, pos)  # [n, d]
    ax = fig.subplots()
    top = float(table.abs().max()) or 1.0
    extent = (-0.5, table.shape[1] - 0.5, bottom_row, top_row)
    im = _heatmap(ax, table, top, extent, aspect="auto")
    note = " (adds nothing)" if enc.kind == "none" else ""
    return _titled(fig, ax, im, "channel", f"{_label(enc)}: PE(p), {table.shape[1]} channels{note}")


def plot_similarity(
    encoding: EncodingSpec,
    positions: Positions = None,
    *,
    figsize: tuple[float, float] = (5.5, 4.5),
    dpi: int = 100,
) -> Figure:
    """Cosine similarity of the encodings of every pair of positions.

    Additive: of the table rows ``PE(p)``; rotary: of the maps ``R_q(p)`` and ``R_k(p')``
    (the expected ``q.k`` for ``q = k ~ N(0, I)``, normalized). Bias encodings have no
    per-position vector: plot their bias with :func:`plot_bias`.

    Examples:
        >>> from posenc.plot import plot_similarity
        >>> plot_similarity("rope", 32, figsize=(3, 3), dpi=40).canvas.get_width_height()
        (120, 120)
    """
    enc = resolve_encoding(encoding)
    if enc.kind == "bias":
        raise PosEncError(
            f"similarity needs an additive or rotary encoding, got the bias encoding "
            f"{enc.name!r}: plot its bias instead (posenc.plot.plot_bias)"
        )
    pos = resolve_positions(positions, (0, 128))
    if enc.kind == "rotary":
        rq, rk = rotary_matrices(enc, pos)
        a, b = rq.reshape(pos.shape[0], -1), rk.reshape(pos.shape[0], -1)
        what = "cos(R_q(p), R_k(p'))"
    else:
        a = b = additive_table(enc, pos)
        what = "cos(PE(p), PE(p'))"
    norms = a.norm(dim=-1)[:, None] * b.norm(dim=-1)[None, :]
    sim = torch.where(norms > 0, (a @ b.T) / norms.clamp_min(1e-300), torch.zeros_like(norms))
    fig = _figure(figsize, dpi)
    ax = fig.subplots()
    lo, hi = float(pos[0]) - 0.5, float(pos[-1]) + 0.5
    im = _heatmap(ax, sim, 1, (lo, hi, hi, lo))
    note = " (all zero: adds nothing)" if enc.kind == "none" else ""
    return _titled(fig, ax, im, "position p'", f"{_label(enc)}: {what}{note}")


def plot_decay(
    encodings: EncodingSpec | Sequence[EncodingSpec],
    max_distance: int = 128,
    *,
    figsize: tuple[float, float] = (9.0, 4.0),
    dpi: int = 100,
) -> Figure:
    """Similarity against the distance between query and key, for one or more encodings.

    Additive and rotary encodings share one panel (similarity normalized to 1 at distance
    0; rotary also draws RoFormer's long-term decay bound, dashed); bias encodings get a
    second panel with their mean bias over heads. Curves beyond the panel's range (the naive
    index grows without bound) are clipped and say so in the legend.

    Examples:
        >>> from posenc.plot import plot_decay
        >>> fig = plot_decay(["sinusoidal", "rope", "alibi"], 32, figsize=(6, 3), dpi=50)
        >>> len(fig.axes)
        2
    """
    specs = _specs(encodings)
    _check_figsize(figsize)
    curves = [decay(spec, max_distance) for spec in specs]
    similar = [c for c in curves if c.kind != "bias"]
    biases = [c for c in curves if c.kind == "bias"]
    fig = _figure(figsize, dpi)
    axes = list(fig.subplots(1, int(bool(similar)) + int(bool(biases)), squeeze=False)[0])
    # legends beside the axes when there is room, inside them otherwise
    where = {"loc": "upper left", "bbox_to_anchor": (1.0, 1.0)} if figsize[0] >= 7 else {}
    colors = {id(c): f"C{i % 10}" for group in (similar, biases) for i, c in enumerate(group)}
    for group, panel in ((similar, _similarity_panel), (biases, _bias_panel)):
        if group:
            ax = axes.pop(0)
            panel(ax, group, colors)
            ax.legend(fontsize="small", **where)
    return fig


def _specs(encodings: Any) -> list[EncodingSpec]:
    """``encodings`` as a non-empty list of encodings."""
    if isinstance(encodings, (str, Mapping, Encoding)):
        specs: list[EncodingSpec] = [encodings]
    elif isinstance(encodings, (list, tuple)):
        specs = list(encodings)
    else:
        raise PosEncError(
            "encodings must be an encoding (name, config or module) or a list of them, "
            f"got {type(encodings).__name__}"
        )
    if not specs:
        raise PosEncError("encodings must name at least one encoding, got an empty list")
    return specs


def _similarity_panel(ax: Any, similar: list[Decay], colors: dict[int, str]) -> None:
    """The normalized similarity of each curve against distance (clipped above 1.6), and
    one dashed RoFormer bound per distinct bound."""
    top = 1.6
    bounds: dict[tuple[float, ...], list[str]] = {}  # one dashed bound per distinct curve
    for rank, curve in enumerate(similar):
        color = colors[id(curve)]
        width = 1.0 + 2.0 * (len(similar) - 1 - rank) / max(1, len(similar) - 1)
        values = curve.normalized if curve.normalized is not None else curve.similarity
        label = curve.encoding if curve.normalized is not None else f"{curve.encoding} (zero)"
        if max(values) > top:
            label += f" (grows to {max(values):.3g}, clipped)"
        # earlier curves drawn wider, so identical curves (sinusoidal, rope) both show
        ax.plot(curve.distances, values, color=color, label=label, linewidth=width)
        if curve.bound_normalized is not None:
            key = tuple(round(v, 6) for v in curve.bound_normalized)
            bounds.setdefault(key, []).append(curve.encoding)
    for (key, owners), style in zip(bounds.items(), ["--", ":", "-."] * len(bounds)):
        ax.plot(
            similar[0].distances,
            key,
            color="0.2",
            linestyle=style,
            linewidth=1.0,
            label=f"RoFormer bound, shape ({', '.join(owners)})",
        )
    ax.set_ylim(-1.05, top)
    ax.axhline(0.0, color="0.7", linewidth=0.8)
    ax.set_xlabel("distance k (query at p + k, key at p)")
    ax.set_ylabel("similarity / similarity at k = 0")
    ax.set_title("similarity against distance")


def _bias_panel(ax: Any, biases: list[Decay], colors: dict[int, str]) -> None:
    """The mean bias over heads of each curve against distance."""
    for curve in biases:
        ax.plot(curve.distances, curve.similarity, color=colors[id(curve)], label=curve.encoding)
    ax.set_xlabel("distance k of the key behind the query")
    ax.set_ylabel("bias (mean over heads)")
    ax.set_title("attention bias against distance")


def plot_bias(
    encoding: EncodingSpec,
    positions: Positions = None,
    *,
    max_heads: int = 8,
    figsize: tuple[float, float] = (10.0, 5.0),
    dpi: int = 100,
) -> Figure:
    """The bias ``b[h, q, k]`` of each head (up to ``max_heads``) as a heatmap.

    Query-dependent biases (Shaw's relative keys) are shown for one fixed random query per
    head. Entries that are ``-inf`` (masked) are left blank.

    Examples:
        >>> from posenc.plot import plot_bias
        >>> fig = plot_bias({"name": "alibi", "num_heads": 4}, 16, figsize=(6, 3), dpi=50)
        >>> len(fig.axes)  # 4 heads and a colorbar
        5
    """
    enc = resolve_encoding(encoding)
    if enc.kind != "bias":
        raise PosEncError(
            f"encoding must be a bias encoding for a bias map, got {enc.name!r} of kind {enc.kind!r}"
        )
    max_heads = check_int("max_heads", max_heads, min=1)
    pos = resolve_positions(positions, (0, 32))
    bias = bias_matrix(enc, pos)  # [h, q, k]
    shown = bias[:max_heads]
    bias_np = _np(shown.masked_fill(~torch.isfinite(shown), math.nan))
    finite = shown[torch.isfinite(shown)]
    lo = float(finite.min()) if finite.numel() else 0.0
    hi = float(finite.max()) if finite.numel() else 0.0
    h = shown.shape[0]
    cols = min(h, 4)
    rows = math.ceil(h / cols)
    fig = _figure(figsize, dpi)
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
    first, last = float(pos[0]) - 0.5, float(pos[-1]) + 0.5
    im: Any = None
    for i, ax in enumerate(axes.flat):
        if i >= h:
            ax.set_visible(False)
            continue
        im = ax.imshow(
            bias_np[i],
            cmap="viridis",
            vmin=lo,
            vmax=hi if hi > lo else lo + 1,
            interpolation="nearest",
            extent=(first, last, last, first),
        )
        ax.set_title(f"head {i}", fontsize="small")
        ax.tick_params(labelsize="x-small")
        ax.label_outer()  # tick labels on the outer panels only
    fig.colorbar(im, ax=axes.ravel().tolist())
    shown_note = f" (first {h} of {bias.shape[0]} heads)" if h < bias.shape[0] else ""
    fig.suptitle(f"{_label(enc)}: bias b[h, query, key]{shown_note}")
    return fig


def plot_clock_hands(
    encoding: EncodingSpec,
    positions: Positions = None,
    *,
    frequencies: Sequence[int] | None = None,
    figsize: tuple[float, float] = (10.0, 3.0),
    dpi: int = 100,
) -> Figure:
    """RoPE as clocks: for each chosen frequency ``i`` a unit circle with one hand per
    position ``p`` at angle ``p * theta_i`` (fast hands first, slow ones last).

    Args:
        encoding: a rotary encoding.
        positions: the positions drawn as hands (default 0..7).
        frequencies: frequency indices (default: 5 spread from the fastest to the slowest).

    Examples:
        >>> from posenc.plot import plot_clock_hands
        >>> len(plot_clock_hands("rope", frequencies=[0, 8, 31]).axes)
        3
    """
    enc = resolve_encoding(encoding)
    if enc.kind != "rotary":
        raise PosEncError(
            f"encoding must be rotary for clock hands, got {enc.name!r} of kind {enc.kind!r}"
        )
    pos = resolve_positions(positions, (0, 8))
    theta = inv_freq(enc)
    r = theta.shape[0]
    if frequencies is None:
        frequencies = sorted({round(i * (r - 1) / 4) for i in range(5)})
    if not isinstance(frequencies, (list, tuple, range)) or not frequencies:
        raise PosEncError(f"frequencies must be a non-empty list of indices, got {frequencies!r}")
    idx = [check_int("frequencies", i, min=0, max=r - 1) for i in frequencies]
    angles = reduced_angles(pos, theta[idx])  # [n, f]
    fig = _figure(figsize, dpi)
    axes = fig.subplots(1, len(idx), squeeze=False)[0]
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    n = pos.shape[0]
    circle = torch.linspace(0, 2 * math.pi, 200)
    for j, ax in enumerate(axes):
        ax.plot(circle.cos().numpy(), circle.sin().numpy(), color="0.75", linewidth=1)
        for t in range(n):
            a = float(angles[t, j])
            ax.plot([0, math.cos(a)], [0, math.sin(a)], color=cmap(t / max(1, n - 1)), linewidth=2)
        ax.set_xlim(-1.15, 1.15)
        ax.set_ylim(-1.15, 1.15)
        ax.set_aspect("equal")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"i = {idx[j]}\n{float(theta[idx[j]]):.3g} rad / position", fontsize="small")
    fig.suptitle(
        f"{_label(enc)}: one hand per position {int(pos[0])}..{int(pos[-1])} (dark to light)"
    )
    return fig


def figure_bytes(fig: Figure, format: str = "png") -> bytes:
    """The figure encoded as PNG or SVG bytes (``figsize * dpi`` pixels for PNG)."""
    format = _format(format)
    if not callable(getattr(fig, "savefig", None)):
        raise PosEncError(f"fig must be a matplotlib Figure, got {type(fig).__name__}")
    buf = io.BytesIO()
    fig.savefig(buf, format=format)
    return buf.getvalue()


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` (``.png`` or ``.svg``, chosen by the suffix) and return it.

    Raises:
        PosEncError: ``fig`` is no figure, ``path`` is no str or Path, has another suffix,
            lies in no existing folder, or cannot be written (any ``OSError``: a read-only
            or virtual file system such as ``/proc``, no permission, a full disk), naming
            ``path``.
    """
    if not isinstance(path, (str, Path)) or not str(path):
        raise PosEncError(f"path must be a non-empty str or Path, got {path!r}")
    if "\0" in str(path):
        raise PosEncError(f"path must not hold a NUL character, got {str(path)!r}")
    path = Path(path)
    data = figure_bytes(fig, _format(path.suffix.lstrip(".").lower(), name="path suffix"))
    if not path.parent.is_dir():
        raise PosEncError(f"path must be in an existing folder, got {str(path)!r}")
    try:
        path.write_bytes(data)
    except OSError as e:
        raise PosEncError(
            f"path {str(path)!r} cannot be written: {e.strerror or type(e).__name__}"
        ) from e
    return path


def _format(value: str, *, name: str = "format") -> str:
    if value not in FORMATS:
        raise PosEncError(f"{name} must be one of {', '.join(map(repr, FORMATS))}, got {value!r}")
    return value
