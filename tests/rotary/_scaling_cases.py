"""Shared by the scaling tests: the original context, LongRoPE factors of any dim, and the
transformers ``rope_parameters`` (its spelling, without ``rope_theta``) several files use."""

ORIGINAL = 512  # the "original context" of yarn / longrope / llama3


def longrope_factors(dim: int, short: float = 0.02, long: float = 0.5) -> dict:
    """``dim / 2`` short and long LongRoPE factors, ``1 + short * i`` and ``1 + long * i``."""
    half = dim // 2
    return {
        "short_factor": [1.0 + short * i for i in range(half)],
        "long_factor": [1.0 + long * i for i in range(half)],
    }


def tf_longrope(original: int, factors: dict, **extra) -> dict:
    """transformers' LongRoPE parameters (factor 4 unless ``extra`` says otherwise)."""
    return {
        "rope_type": "longrope",
        "factor": 4.0,
        "original_max_position_embeddings": original,
        **factors,
        **extra,
    }


def tf_llama3(original: int) -> dict:
    """transformers' Llama 3.1 parameters (factor 8, frequency factors 1 and 4)."""
    return {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": original,
    }
