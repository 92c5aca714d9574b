"""Learning-rate schedule: linear warmup, then cosine decay to a floor.

A pure function of the step, so a resumed run needs no scheduler state.
"""

from __future__ import annotations

import math

from posenc._errors import check_float, check_int

__all__ = ["warmup_cosine"]


def warmup_cosine(
    step: int, *, steps: int, peak: float, warmup: int, min_ratio: float = 0.1
) -> float:
    """The learning rate of 0-based ``step`` out of ``steps``.

    Steps ``0 .. warmup - 1`` ramp linearly to ``peak`` (step ``i`` uses
    ``peak * (i + 1) / warmup``); the rest follow half a cosine from ``peak``
    down to ``peak * min_ratio`` at the last step.

    Args:
        step: the step about to run, ``0 <= step < steps``.
        steps: total number of steps.
        peak: the largest learning rate.
        warmup: number of warmup steps (0 for none).
        min_ratio: the final learning rate as a fraction of ``peak``.

    Examples:
        >>> [round(warmup_cosine(i, steps=6, peak=1.0, warmup=2), 3) for i in range(6)]
        [0.5, 1.0, 1.0, 0.775, 0.325, 0.1]
    """
    steps = check_int("steps", steps, min=1)
    step = check_int("step", step, min=0, max=steps - 1)
    warmup = check_int("warmup", warmup, min=0)
    peak = check_float("peak", peak, min=0.0)
    min_ratio = check_float("min_ratio", min_ratio, min=0.0, max=1.0)
    if step < warmup:
        return peak * (step + 1) / warmup
    decay = steps - warmup  # steps on the cosine, >= 1 here
    progress = (step - warmup) / max(1, decay - 1)
    return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))
