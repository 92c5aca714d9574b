"""Published numbers the report sets its own beside.

Press, Smith & Lewis, "Train Short, Test Long: Attention with Linear Biases Enables Input
Length Extrapolation" (ICLR 2022, arXiv:2108.12409), appendix Table 2: 247M-parameter
word-level language models trained on WikiText-103 with ``L = 512`` tokens, perplexity on
the validation set at longer inference lengths (no fine-tune, non-overlapping windows).
The rows kept are those from ``L`` to about ``9L``; numbers as printed in the table.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PRESS_2022", "press_ratios"]

PRESS_2022: dict[str, Any] = {
    "citation": (
        "Press, Smith & Lewis, Train Short, Test Long (ICLR 2022), Table 2: WikiText-103 "
        "validation perplexity, trained on L = 512"
    ),
    "url": "https://arxiv.org/abs/2108.12409",
    "train_len": 512,
    # inference length -> perplexity per method (posenc's registry names)
    "ppl": {
        512: {"sinusoidal": 20.05, "rope": 20.07, "t5": 19.65, "alibi": 19.73},
        1012: {"sinusoidal": 43.54, "rope": 21.37, "t5": 18.79, "alibi": 18.73},
        1512: {"sinusoidal": 76.23, "rope": 25.99, "t5": 18.91, "alibi": 18.52},
        2512: {"sinusoidal": 132.41, "rope": 31.58, "t5": 20.41, "alibi": 18.41},
        3512: {"sinusoidal": 178.97, "rope": 35.54, "t5": 22.91, "alibi": 18.40},
        4512: {"sinusoidal": 209.37, "rope": 39.15, "t5": 25.91, "alibi": 18.41},
    },
}


def press_ratios() -> dict[str, dict[float, float]]:
    """Per method, ``{length / L: ppl(length) / ppl(L)}`` of :data:`PRESS_2022`.

    Examples:
        >>> round(press_ratios()["sinusoidal"][1012 / 512], 3)
        2.172
    """
    table, base = PRESS_2022["ppl"], PRESS_2022["train_len"]
    methods = table[base]
    return {
        m: {length / base: row[m] / methods[m] for length, row in table.items()} for m in methods
    }
