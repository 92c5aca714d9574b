"""Float64 NumPy oracle of resampling a learned position table to a new length or grid.

Resampling is separable: along each axis, output row ``j`` is a weighted sum of input
rows, so each axis is one ``[out, in]`` weight matrix written out below, point by point.

- ``linear`` / ``bilinear``: the tent kernel ``1 - |x|``.
- ``bicubic``: Keys' cubic convolution (1981) with ``a = -0.75`` and clamped borders.
- ``antialias=True`` (bilinear / bicubic): the filter is stretched by the downscaling
  factor so that every input row contributes (PIL's resampling, bicubic with
  ``a = -0.5``), and the taps that fall outside the input are dropped and the rest
  renormalised. This is what ``timm``'s ``resample_abs_pos_embed`` uses.

Sample coordinates follow ``align_corners``: ``False`` maps pixel centres
(``src = (dst + 0.5) * in / out - 0.5``), ``True`` maps the first and last rows onto
each other (``src = dst * (in - 1) / (out - 1)``).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["resample_table", "resample_weights"]


def _keys_near(x: float, a: float) -> float:  # |x| <= 1
    return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0


def _keys_far(x: float, a: float) -> float:  # 1 < |x| < 2
    return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a


def _scale(n_in: int, n_out: int, align_corners: bool) -> float:
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return n_in / n_out


def _filter(mode: str, x: float) -> float:
    """The antialiasing filter: tent for bilinear, cubic with a = -0.5 for bicubic."""
    x = abs(x)
    if mode == "bicubic":
        if x < 1.0:
            return _keys_near(x, -0.5)
        return _keys_far(x, -0.5) if x < 2.0 else 0.0
    return 1.0 - x if x < 1.0 else 0.0


def resample_weights(
    n_in: int, n_out: int, *, mode: str, align_corners: bool = False, antialias: bool = False
) -> np.ndarray:
    """The ``[n_out, n_in]`` matrix of one axis: ``out = W @ in``."""
    w = np.zeros((n_out, n_in), dtype=np.float64)
    scale = _scale(n_in, n_out, align_corners)
    for j in range(n_out):
        if antialias:
            support = (1.0 if mode != "bicubic" else 2.0) * max(scale, 1.0)
            invscale = 1.0 / scale if scale >= 1.0 else 1.0
            center = scale * (j + 0.5)
            lo = max(int(center - support + 0.5), 0)
            hi = min(int(center + support + 0.5), n_in)
            taps = [_filter(mode, (i - center + 0.5) * invscale) for i in range(lo, hi)]
            total = sum(taps)
            for i, t in zip(range(lo, hi), taps):
                w[j, i] = t / total if total != 0.0 else t
        elif mode == "bicubic":
            src = scale * j if align_corners else scale * (j + 0.5) - 0.5
            i0 = math.floor(src)
            t = src - i0
            coeffs = [
                _keys_far(t + 1.0, -0.75),
                _keys_near(t, -0.75),
                _keys_near(1.0 - t, -0.75),
                _keys_far(2.0 - t, -0.75),
            ]
            for k, c in enumerate(coeffs):
                w[j, min(max(i0 - 1 + k, 0), n_in - 1)] += c
        else:  # linear / bilinear
            src = scale * j if align_corners else max(scale * (j + 0.5) - 0.5, 0.0)
            i0 = int(src)
            i1 = min(i0 + 1, n_in - 1)
            t = src - i0
            w[j, i0] += 1.0 - t
            w[j, i1] += t
    return w


def resample_table(
    table,
    size,
    *,
    grid=None,
    num_prefix_tokens: int = 0,
    mode: str | None = None,
    align_corners: bool = False,
    antialias: bool | None = None,
) -> np.ndarray:
    """Resample the rows of ``table [n, d]`` after ``num_prefix_tokens`` kept rows.

    1-D (``grid=None``): ``size`` is the new total length. 2-D: the rows form the grid
    ``(H, W)`` (row-major) and ``size`` is the new grid ``(H', W')``.
    See posenc.learned.resample_table. Shape: ``[n, d]`` -> ``[prefix + new, d]``.
    """
    t = np.asarray(table, dtype=np.float64)
    prefix, body = t[:num_prefix_tokens], t[num_prefix_tokens:]
    if grid is None:
        mode = mode or "linear"
        w = resample_weights(
            len(body), size - num_prefix_tokens, mode=mode, align_corners=align_corners
        )
        out = w @ body
    else:
        mode = mode or "bicubic"
        antialias = True if antialias is None else antialias
        (h, wd), (nh, nw) = grid, size
        wh = resample_weights(h, nh, mode=mode, align_corners=align_corners, antialias=antialias)
        ww = resample_weights(wd, nw, mode=mode, align_corners=align_corners, antialias=antialias)
        body = body.reshape(h, wd, -1)
        out = np.einsum("ih,jw,hwd->ijd", wh, ww, body).reshape(nh * nw, -1)
    return np.concatenate([prefix, out], axis=0)
