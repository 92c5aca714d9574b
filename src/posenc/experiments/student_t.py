"""Student's t quantiles, for the 95 % intervals of the comparisons over seeds (no SciPy)."""

from __future__ import annotations

import functools
import math

from posenc._errors import PosEncError

__all__ = ["MAX_DF", "t_quantile"]

MAX_DF = 10**15  # past this t is the normal to every digit a float holds


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``p`` in
    ``(0.5, 1)``), by bisection on its CDF (Simpson's rule on the density; exact to
    about 1e-9, no SciPy).

    Examples:
        >>> round(t_quantile(0.975, 2), 3), round(t_quantile(0.975, 4), 3)
        (4.303, 2.776)
    """
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.5 < p < 1.0:
        raise PosEncError(f"p must be a number in (0.5, 1), got {p!r:.80}")
    if not isinstance(df, int) or isinstance(df, bool) or not 1 <= df <= MAX_DF:
        raise PosEncError(f"df must be an integer in [1, {MAX_DF}], got {df!r:.80}")
    return _t_quantile(float(p), int(df))


@functools.lru_cache(maxsize=256)
def _t_quantile(p: float, df: int) -> float:
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(x: float) -> float:
        return math.exp(log_norm - (df + 1) / 2 * math.log1p(x * x / df))

    def cdf(x: float) -> float:  # 0.5 + the integral from 0 to x, x >= 0
        n = 2000
        h = x / n
        s = density(0.0) + density(x)
        s += 4 * math.fsum(density((2 * i - 1) * h) for i in range(1, n // 2 + 1))
        s += 2 * math.fsum(density(2 * i * h) for i in range(1, n // 2))
        return 0.5 + s * h / 3

    # the tail shrinks like x^-df: substitute x = tan(u) keeps the bracket finite
    lo, hi = 0.0, math.pi / 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if cdf(math.tan(mid)) < p:
            lo = mid
        else:
            hi = mid
    return math.tan((lo + hi) / 2)
