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

A study may also name a *variant* (:data:`VARIANTS`): an encoding with the settings of a
paper, reported under its own label (``prope-0.75``: p-RoPE keeping 3/4 of the
frequencies, and ``prope-<p>`` for any ``p`` in ``(0, 1]``; ``drope``: RoPE dropped late in
training), and give any encoding or variant a
per-layer schedule of :data:`posenc.models.schedules.SCHEDULES` as ``name@schedule``
(``rope@nope-every-4``). Their specs carry keys besides the encoding's config:
``"schedule"`` (the schedule's name, resolved for the model's depth by :func:`build_model`),
``"rotary_fraction"`` (p-RoPE's ``p``: ``rotary_dim = 2 * int(p * head_dim // 2)``, as
transformers' ``partial_rotary_factor``) and ``"drope_at"`` (the fraction of the training
steps after which the rotary encoding is dropped:
:class:`~posenc.experiments.train.TrainSettings`' ``drope_step``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from posenc import registry
from posenc._errors import PosEncError, check_float, check_int

if TYPE_CHECKING:
    from posenc.models import TinyTransformer

__all__ = ["VARIANTS", "ModelSettings", "build_model", "encoding_label", "encoding_spec"]

#: Study variants: label -> (the encoding's config, extra spec keys, what it is).
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "prope-0.25": (
        {"name": "rope", "scaling": {"type": "proportional"}},
        {"rotary_fraction": 0.25},
        "p-RoPE (Barbero et al. 2025): the highest quarter of RoPE's frequencies, the rest "
        "not rotated",
    ),
    "prope-0.75": (
        {"name": "rope", "scaling": {"type": "proportional"}},
        {"rotary_fraction": 0.75},
        "p-RoPE keeping the highest three quarters of RoPE's frequencies",
    ),
    "drope": (
        {"name": "rope"},
        {"drope_at": 0.85},
        "DroPE (Gelberg et al. 2025): trained with RoPE, which is dropped after 85% of the "
        "steps; the rest recalibrates the model without it (evaluated as NoPE)",
    ),
}
_SPEC_KEYS = ("schedule", "drope_at", "rotary_fraction")


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


def _split_schedule(name: str) -> tuple[str, str | None]:
    """``"rope@nope-every-4"`` -> ``("rope", "nope-every-4")`` (the schedule checked)."""
    from posenc.models.schedules import SCHEDULES

    base, at, sched = name.partition("@")
    if not at:
        return name, None
    if sched not in SCHEDULES:
        raise PosEncError(
            f"the schedule after '@' must be one of {', '.join(map(repr, SCHEDULES))}, got "
            f"{sched!r} (in {name!r})"
        )
    return base, sched


def encoding_label(spec: str | Mapping[str, Any]) -> str:
    """The name a run is reported under: the registry name (aliases resolved), a variant's
    name, followed by ``@schedule`` when one is given."""
    name = (
        spec if isinstance(spec, str) else spec.get("name") if isinstance(spec, Mapping) else None
    )
    if not isinstance(name, str):
        raise PosEncError(f"encoding must be a registry name or a config dict, got {spec!r}")
    base, sched = _split_schedule(name.strip())
    if base in VARIANTS or _prope_fraction(base) is not None:
        label = base
    else:
        label = registry.get(base).name  # PosEncError naming the registered names
    return label if sched is None else f"{label}@{sched}"


def _prope_fraction(name: str) -> float | None:
    """p of ``"prope-<p>"`` (p-RoPE with any fraction in ``(0, 1]``), else None."""
    if not name.startswith("prope-"):
        return None
    try:
        p = float(name.removeprefix("prope-"))
    except ValueError:
        return None
    if not 0.0 < p <= 1.0:
        raise PosEncError(f"the fraction of prope-<p> must be in (0, 1], got {name!r}")
    return p


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
    base, sched = _split_schedule(encoding_label(spec))
    config: dict[str, Any] = {"name": base}
    if base in VARIANTS:
        encoding, extra, _ = VARIANTS[base]
        config = copy.deepcopy({**encoding, **extra})
    elif (fraction := _prope_fraction(base)) is not None:  # p-RoPE of any fraction
        config = {"name": "rope", "scaling": {"type": "proportional"}, "rotary_fraction": fraction}
    if not isinstance(spec, str):
        config.update({k: v for k, v in spec.items() if k != "name"})
    if sched is not None:
        config["schedule"] = sched
    label = config["name"]
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


def split_spec(spec: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(the encoding's config, the study keys)`` of a study spec (see the module docs)."""
    encoding = {k: v for k, v in spec.items() if k not in _SPEC_KEYS}
    return encoding, {k: spec[k] for k in _SPEC_KEYS if k in spec}


def build_model(
    vocab_size: int,
    encoding: Mapping[str, Any],
    settings: ModelSettings,
    *,
    max_len: int,
    seed: int,
    train_len: int | None = None,
    layer: Mapping[str, Any] | None = None,
) -> TinyTransformer:
    """A causal TinyTransformer with ``encoding`` (a study spec: its ``"schedule"`` becomes
    the model's ``layers``), initialised from ``seed``.

    ``max_len`` sizes learned tables (the longest position trained on); ``train_len`` sizes
    a schedule's windows (default ``max_len``); ``layer``: settings every layer gets
    (``qk_norm``, ``temperature``; :mod:`posenc.models.layers`).
    """
    from posenc.models import TinyTransformer
    from posenc.models.schedules import schedule

    config, extra = split_spec(encoding)
    if "rotary_fraction" in extra:
        fraction = check_float("rotary_fraction", extra["rotary_fraction"], min=0.0, max=1.0)
        head_dim = settings.dim // settings.num_heads
        config["rotary_dim"] = 2 * int(fraction * head_dim // 2)
    layers = None
    if "schedule" in extra:
        layers = schedule(extra["schedule"], settings.num_layers, train_len or max_len, config)
    if layer:
        layers = [{**dict(layer), **entry} for entry in (layers or [{}] * settings.num_layers)]
    torch.manual_seed(seed)
    return TinyTransformer(
        vocab_size,
        dim=settings.dim,
        num_layers=settings.num_layers,
        num_heads=settings.num_heads,
        mlp_ratio=settings.mlp_ratio,
        encoding=config,
        causal=True,
        dropout=0.0,
        max_len=max_len,
        layers=layers,
    )


def check_distinct(labels: Sequence[str]) -> None:
    """Refuse an encoding listed twice (runs are keyed by name)."""
    seen: set[str] = set()
    for label in labels:
        if label in seen:
            raise PosEncError(f"encodings must be distinct, got {label!r} twice")
        seen.add(label)
