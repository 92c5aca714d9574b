"""The models of a study: a :class:`~posenc.models.TinyTransformer` per encoding.

Encoding specs are completed with what the study knows:

- ``t5``: ``max_distance`` is the training length (and ``causal=True``,
  as in T5's decoder, since the models are causal; ``num_buckets`` is 32, or the
  training length when that is shorter, so that the log-spaced buckets exist). T5 buckets distances up to
  ``max_distance`` logarithmically and puts everything farther into the last
  bucket; a ``max_distance`` above the training length would create buckets that
  no training pair ever reaches, whose biases stay at their random initial
  values and are then met at evaluation only. A config asking for more is refused.
- ``learned``: its table gets ``max_len`` rows, the longest position seen in
  training (the training length, or ``L_max`` with randomized positions); longer
  eval lengths are errors for that cell, as they must be.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from posenc import registry
from posenc._errors import PosEncError, check_int

if TYPE_CHECKING:
    from posenc.models import TinyTransformer

__all__ = ["ModelSettings", "build_model", "encoding_label", "encoding_spec"]


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """Size of the TinyTransformer of every run (causal, no dropout)."""

    dim: int = 64
    num_layers: int = 2
    num_heads: int = 4
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        for name in ("dim", "num_layers", "num_heads", "mlp_ratio"):  # stored as plain ints
            object.__setattr__(self, name, check_int(name, getattr(self, name), min=1))
        if self.dim % self.num_heads:
            raise PosEncError(
                f"dim must be divisible by num_heads ({self.num_heads}), got {self.dim}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def encoding_label(spec: str | Mapping[str, Any]) -> str:
    """The name a run is reported under: the registry name (aliases resolved)."""
    name = spec if isinstance(spec, str) else spec.get("name")
    if not isinstance(name, str):
        raise PosEncError(f"encoding must be a registry name or a config dict, got {spec!r}")
    return registry.get(name).name  # PosEncError naming the registered names


def encoding_spec(spec: str | Mapping[str, Any], *, train_len: int) -> dict[str, Any]:
    """The encoding config a study builds for ``spec`` at training length ``train_len``.

    Examples:
        >>> encoding_spec("t5", train_len=64)
        {'name': 't5', 'max_distance': 64, 'causal': True, 'num_buckets': 32}
        >>> encoding_spec("t5", train_len=8)["num_buckets"]
        8
        >>> encoding_spec("rope", train_len=64)
        {'name': 'rope'}
    """
    label = encoding_label(spec)
    config: dict[str, Any] = {"name": label}
    if not isinstance(spec, str):
        config.update({k: v for k, v in spec.items() if k != "name"})
    if label == "t5":
        distance = config.setdefault("max_distance", train_len)
        if check_int("t5 max_distance", distance, min=1) > train_len:
            raise PosEncError(
                f"t5 max_distance must be <= train_len ({train_len}): buckets past the "
                f"training length are never trained, got {distance}"
            )
        config.setdefault("causal", True)
        # T5's 32 buckets need max_distance > 16 exact distances; short training lengths
        # get fewer buckets (half exact, half logarithmic up to max_distance).
        config.setdefault("num_buckets", max(2, min(32, int(distance))))
    return config


def build_model(
    vocab_size: int,
    encoding: Mapping[str, Any],
    settings: ModelSettings,
    *,
    max_len: int,
    seed: int,
) -> TinyTransformer:
    """A causal TinyTransformer with ``encoding``, initialised from ``seed``.

    ``max_len`` sizes learned tables (the longest position trained on).
    """
    from posenc.models import TinyTransformer

    torch.manual_seed(seed)
    return TinyTransformer(
        vocab_size,
        dim=settings.dim,
        num_layers=settings.num_layers,
        num_heads=settings.num_heads,
        mlp_ratio=settings.mlp_ratio,
        encoding=dict(encoding),
        causal=True,
        dropout=0.0,
        max_len=max_len,
    )


def check_distinct(labels: Sequence[str]) -> None:
    """Refuse an encoding listed twice (runs are keyed by name)."""
    seen: set[str] = set()
    for label in labels:
        if label in seen:
            raise PosEncError(f"encodings must be distinct, got {label!r} twice")
        seen.add(label)
