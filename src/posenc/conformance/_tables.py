"""The table cases: sinusoidal (three layouts), N-D sinusoidal, the index table, a learned
table resampled, and xPos's scale, all from :mod:`posenc.reference`."""

from __future__ import annotations

import numpy as np

from posenc import reference
from posenc._layouts import LAYOUTS
from posenc.conformance._case import Case, make, positions, representable, where_name

__all__ = ["SINUSOIDAL_LAYOUTS", "build", "sinusoidal_rates"]

#: The sinusoidal layouts: Vaswani's interleaved pairs, [sin | cos] halves with exponent
#: 2i/d (the TensorFlow tutorial), and [sin | cos] halves log-spaced over d/2 - 1 (Flax).
SINUSOIDAL_LAYOUTS = (*LAYOUTS, "flax")
_WORDS = {
    "interleaved": "sin and cos interleaved (even channels sin), rates base^(-2i/d)",
    "half": "[sin | cos] halves, rates base^(-2i/d)",
    "flax": "[sin | cos] halves, rates log-spaced over d/2 - 1 (the last is 1/base)",
}
BASE = 10000.0


def sinusoidal_rates(dim: int, layout: str, base: float = BASE) -> np.ndarray:
    """The rate (angle per position) of each channel of a sinusoidal table (0 for flax's
    zero channel of an odd ``dim``): the tolerance model's angle bound.

    Shape: ``[dim]``.
    """
    rates = np.zeros(dim)
    n_first = (dim + 1) // 2
    for c in range(dim):
        if layout == "interleaved":
            rates[c] = base ** (-2.0 * (c // 2) / dim)
        elif layout == "half":
            i = c if c < n_first else c - n_first
            rates[c] = base ** (-2.0 * i / dim)
        elif c < 2 * (dim // 2):
            n = dim // 2
            rates[c] = base ** (-(c % n) / (n - 1))
    return rates


def _sinusoidal_case(
    name: str,
    family: str,
    layout: str,
    dim: int,
    pos: np.ndarray,
    table: np.ndarray,
    angle: np.ndarray,
    *,
    far: bool,
    doc: str,
) -> Case:
    """A sinusoidal table case: unit amplitude, its angles ``angle`` (the angle bound)."""
    return make(
        name,
        family,
        "table",
        convention={"layout": layout, "order": "sin_cos"},
        parameters={"dim": dim, "base": BASE},
        inputs={"positions": pos},
        expected={"table": table},
        magnitude={"table": np.ones((1, 1))},
        angle_bound={"table": angle},
        far=far,
        doc=doc,
    )


def _sinusoidal(layout: str, dim: int, far: bool) -> Case:
    pos = positions(far)
    table = reference.sinusoidal_table(pos, dim, base=BASE, layout=layout)
    angle = np.abs(pos.astype(np.float64))[:, None] * sinusoidal_rates(dim, layout)[None, :]
    return _sinusoidal_case(
        f"sinusoidal.{layout}.d{dim}{where_name(far)}",
        "sinusoidal",
        layout,
        dim,
        pos,
        table,
        angle,
        far=far,
        doc=f"sinusoidal table, {_WORDS[layout]}, dim {dim}, base 10000",
    )


def _sinusoidal_nd(layout: str) -> Case:
    grid = np.array([[0, 0], [0, 1], [1, 0], [3, 7], [255, 256], [257, 4095]], dtype=np.int64)
    dim = 64
    table = reference.sinusoidal_table_nd(grid, dim, base=BASE, layout=layout)
    rates = sinusoidal_rates(dim // 2, layout)
    angle = np.concatenate(
        [np.abs(grid[:, a : a + 1].astype(np.float64)) * rates[None, :] for a in range(2)], axis=1
    )
    return _sinusoidal_case(
        f"sinusoidal_nd.{layout}.d{dim}@near",
        "sinusoidal_nd",
        layout,
        dim,
        grid,
        table,
        angle,
        far=False,
        doc=f"2-D sinusoidal table: channels split evenly over the axes, axis 0 first, {layout}",
    )


def _index(normalize: str | None, far: bool) -> Case:
    pos = positions(far)
    dim = 8
    length = 4096 if normalize else None
    table = reference.index_table(pos, dim, normalize=normalize, length=length)
    detail = "length" if normalize else "plain"
    return make(
        f"index.{detail}.d{dim}{where_name(far)}",
        "index",
        "table",
        convention={"normalize": normalize},
        parameters={"dim": dim, "normalize": normalize, "length": length},
        inputs={"positions": pos},
        expected={"table": table},
        far=far,
        doc="every channel holds the position" + (" / 4096" if normalize else ""),
    )


_RESAMPLES = (  # name, rows in, rows out, grid in, grid out, prefix, mode, align, antialias
    ("linear", 16, 24, None, None, 0, "linear", False, None),
    ("linear-align", 16, 10, None, None, 0, "linear", True, None),
    ("bicubic2d", 17, 37, (4, 4), (6, 6), 1, "bicubic", False, True),
    ("bilinear2d-down", 36, 16, (6, 6), (4, 4), 0, "bilinear", False, True),
)


def _learned() -> list[Case]:
    rng = np.random.default_rng(20240142)
    dim = 16
    out = []
    for name, n_in, n_out, grid, size, prefix, mode, align, antialias in _RESAMPLES:
        table = representable(rng, (n_in, dim), scale=128)
        target = n_out if grid is None else size
        options = (target, grid, prefix, mode, align, antialias)
        got = _resample(table, *options)
        parameters = {
            "dim": dim,
            "size": list(size) if size else n_out,
            "grid": list(grid) if grid else None,
            "num_prefix_tokens": prefix,
            "mode": mode,
            "align_corners": align,
            "antialias": antialias,
        }
        # |W| @ |table|: the size of the terms each resampled value sums (the same resampling
        # of the absolute values; twice it covers bicubic's negative lobes)
        bound = np.abs(_resample(np.abs(table), *options)) * 2.0
        out.append(
            make(
                f"learned.resample-{name}.d{dim}@near",
                "learned",
                "table",
                convention={"mode": mode, "align_corners": align},
                parameters=parameters,
                inputs={"positions": np.arange(n_out, dtype=np.int64), "table": table},
                expected={"table": got},
                magnitude={"table": bound},
                doc=f"a learned table [{n_in}, {dim}] resampled to {n_out} rows ({mode}"
                + (f", grid {grid} -> {size}" if grid else "")
                + (", align_corners" if align else "")
                + ")",
            )
        )
    return out


def _resample(table, target, grid, prefix, mode, align, antialias) -> np.ndarray:
    """``reference.resample_table`` with a resample case's options."""
    return reference.resample_table(
        table,
        target,
        grid=grid,
        num_prefix_tokens=prefix,
        mode=mode,
        align_corners=align,
        antialias=antialias,
    )


def _xpos() -> Case:
    pos = positions(False)
    dim, scale_base = 64, 512.0
    scale = reference.xpos_scale(pos, dim, scale_base)
    return make(
        f"xpos.scale.d{dim}@near",
        "xpos",
        "table",
        convention={},
        parameters={"dim": dim, "scale_base": scale_base},
        inputs={"positions": pos},
        expected={"table": scale},
        magnitude={"table": np.abs(scale) * (1.0 + np.abs(np.log(scale)))},
        doc="xPos's scale zeta_i^(p / 512), zeta_i = (2i + 0.4 d) / (1.4 d) (queries'; keys "
        "take its inverse)",
    )


def build() -> list[Case]:
    """Every table case, in a fixed order."""
    cases = [
        _sinusoidal(layout, dim, far)
        for layout in SINUSOIDAL_LAYOUTS
        for dim in (64, 128, 33)
        for far in (False, True)
    ]
    cases += [_sinusoidal_nd(layout) for layout in SINUSOIDAL_LAYOUTS]
    cases += [_index(normalize, far) for normalize in (None, "length") for far in (False, True)]
    cases += _learned()
    cases.append(_xpos())
    return cases
