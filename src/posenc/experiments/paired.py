"""The one rule that orders two things measured in pairs: by seed in a study
(:mod:`.comparisons`), by document in ``posenc extend`` (:mod:`posenc.extend.answer`).

The differences ``a - b`` of a lower-is-better number, one per pair, get their mean and a
95 % t interval of it (with 3 to 6 pairs a bootstrap interval is too narrow to trust); the
verdict is ``better`` (the whole interval below 0), ``worse`` (above 0) or ``level`` (the
interval holds 0, or there is one pair and so no interval).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from posenc._errors import PosEncError
from posenc.experiments.student_t import t_quantile

__all__ = ["paired_verdict"]

_LARGEST = 1e150  # |difference| beyond it: its square and their sum would not stay finite


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def paired_verdict(differences: Sequence[float]) -> tuple[float, list[float] | None, str]:
    """The mean of ``differences`` (``a - b``, one per pair), its 95 % t interval (None
    under two pairs) and the verdict, ``better``, ``worse`` or ``level``.

    Raises:
        PosEncError: ``differences`` is not a non-empty list or tuple of numbers within
            ``+-1e150`` (NaN and inf refused).

    Examples:
        >>> paired_verdict([-1.0, -0.9, -1.2])[2], paired_verdict([-0.1, 0.1, -0.1])[2]
        ('better', 'level')
    """
    if (
        not isinstance(differences, (list, tuple))
        or not differences
        or not all(_number(d) and abs(d) <= _LARGEST for d in differences)
    ):
        raise PosEncError(
            "differences must be a non-empty list or tuple of numbers within +-1e150, "
            f"got {differences!r:.80}"
        )
    n = len(differences)
    mean = math.fsum(differences) / n
    if n < 2:
        return mean, None, "level"
    var = math.fsum((d - mean) ** 2 for d in differences) / (n - 1)
    half = t_quantile(0.975, n - 1) * math.sqrt(var / n)
    low, high = mean - half, mean + half
    if low <= 0.0 <= high:
        return mean, [low, high], "level"
    return mean, [low, high], "better" if high < 0.0 else "worse"
