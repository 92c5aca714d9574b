"""Shared by the scaling tests: the original context and LongRoPE factors of any dim."""

ORIGINAL = 512  # the "original context" of yarn / longrope / llama3


def longrope_factors(dim: int) -> dict:
    """``dim / 2`` short and long LongRoPE factors."""
    half = dim // 2
    return {
        "short_factor": [1.0 + 0.02 * i for i in range(half)],
        "long_factor": [1.0 + 0.5 * i for i in range(half)],
    }
