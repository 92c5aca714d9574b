"""The study figure draws the spread: every line the mean over the seeds with its min-max
band, flip-flop's read error among them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from posenc.experiments.results import summarize

pytest.importorskip("matplotlib")

from posenc.experiments.figure import draw_study

LENS = [8, 16]


def _flipflop() -> dict[str, Any]:
    runs = []
    for label, per_seed in (("rope", (0.99, 0.80, 0.95)), ("cope", (1.0, 1.0, 0.9))):
        for seed, acc in enumerate(per_seed):
            cells = {str(n): {"accuracy": acc / 2, "token_accuracy": acc} for n in LENS}
            runs.append({"encoding": label, "seed": seed, "eval": cells})
    return {
        "task": "flipflop",
        "metric": "accuracy",
        "train_len": 8,
        "eval_lens": LENS,
        "seeds": [0, 1, 2],
        "runs": runs,
        "summary": summarize(runs, LENS),
    }


def test_flipflop_draws_its_read_error_with_the_seed_spread() -> None:
    import matplotlib.pyplot as plt

    fig = draw_study(_flipflop())
    accuracy, read_error = fig.axes
    assert read_error.get_ylabel() == "read error % (sparse split)"
    rope = next(line for line in read_error.get_lines() if line.get_label() == "rope")
    assert rope.get_ydata().tolist() == pytest.approx([100 * (1 - 2.74 / 3)] * 2)
    for ax in (accuracy, read_error):
        assert len(ax.collections) == 2  # a min-max band per encoding
    band = read_error.collections[0].get_paths()[0].vertices[:, 1]
    assert np.min(band) == pytest.approx(1.0) and np.max(band) == pytest.approx(20.0)
    assert "mean of 3 seeds, band: min-max" in fig._suptitle.get_text()
    plt.close(fig)
