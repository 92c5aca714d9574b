"""Bounds on the sizes a transformers config sets, checked before anything is built from it.

A config is data (a ``config.json`` from anywhere), and some of its numbers size what is
built from it: the head dim sizes posenc's frequencies and every call's cos/sin, and the
context (``max_position_embeddings``, GPT-J's ``n_positions``, the original context of a
scaling) sizes the cos/sin of the positions the model serves (GPT-J's own rotary module is a
table of that many rows). :func:`check_head_dim` and :func:`check_context` refuse a value past
a bound far above every published model, naming the key, the bound and the bytes it would
take, before :class:`posenc.RotaryEmbedding` (or transformers' class, for the CLI's
comparison) allocates anything. The layer count is bounded where a config is first read
(:data:`posenc.integrations._hf_reader.MAX_LAYERS`).
"""

from __future__ import annotations

from typing import Any

from posenc._errors import PosEncError, check_int

__all__ = ["MAX_CONTEXT", "MAX_HEAD_DIM", "check_context", "check_head_dim"]

# Channels per head: published models have at most 1024 (Gemma 4's global layers: 512).
MAX_HEAD_DIM = 1 << 16
# Positions of a context: 64 Mi, six times the longest published (Llama 4 Scout: 10 Mi).
MAX_CONTEXT = 1 << 26
# A call's cos/sin are float32 [s, rotary_dim / 2] each: 4 bytes per position and channel.
_COS_SIN_BYTES = 4
_CALL_POSITIONS = 4096  # the positions of the call the head-dim estimate is given for

# The keys that set a context, in the config or in its RoPE parameters.
CONTEXT_KEYS = ("max_position_embeddings", "original_max_position_embeddings")


def check_head_dim(key: str, value: Any) -> int:
    """``value`` (the head dim, read from ``key``) as an int, refused past
    :data:`MAX_HEAD_DIM` with the bytes of the cos/sin of a call of 4096 positions."""
    value = check_int(key, value, min=2)
    if value > MAX_HEAD_DIM:
        estimate = _CALL_POSITIONS * value * _COS_SIN_BYTES
        raise PosEncError(
            f"{key} must be <= {MAX_HEAD_DIM} channels per head (published models have at most "
            f"1024), got {value}: the cos/sin of one call of {_CALL_POSITIONS} positions alone "
            f"would take about {estimate:.3g} bytes"
        )
    return value


def check_context(key: str, value: Any, rotary_dim: int) -> int | None:
    """A context length (``key``: ``max_position_embeddings``, ...; None: not given) as an
    int: refused when no integer or below 1, or past :data:`MAX_CONTEXT` positions, with the
    bytes of its cos/sin (of ``rotary_dim`` channels; GPT-J's own rotary module holds such a
    table)."""
    if value is None:
        return None
    value = check_int(key, value, min=1)
    if value > MAX_CONTEXT:
        estimate = value * rotary_dim * _COS_SIN_BYTES
        raise PosEncError(
            f"{key} must be <= {MAX_CONTEXT} positions (published models serve at most about "
            f"1e7), got {value}: the cos/sin of that context ({rotary_dim} rotated channels, "
            f"float32) would take about {estimate:.3g} bytes"
        )
    return value
