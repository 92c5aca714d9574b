"""Base classes shared by every encoding module: kind, name and config round trip.

Each encoding is one of three kinds (plus ``none``), and the kind decides where it
plugs into a transformer:

- ``additive``: ``forward(x, positions=None, *, offset=0) -> x + PE`` on embeddings ``[b, s, d]``;
- ``rotary``: ``forward(q, k, positions=None, *, k_positions=None, seq_dim=-2) -> (q, k)``;
- ``bias``: ``bias(q_len, k_len=None, *, q_positions=None, k_positions=None) -> [h, q, k]``
  (or ``[b, h, q, k]`` when positions are batched), added to the scaled attention logits.

A module records its constructor arguments with :meth:`Encoding._set_config`;
:meth:`Encoding.to_config` returns them as a JSON-serialisable dict holding ``"name"``,
and ``posenc.build(config)`` constructs an equal module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from posenc import positions as _positions

__all__ = ["AdditiveEncoding", "BiasEncoding", "Encoding", "Kind", "RotaryEncoding"]

Kind = Literal["additive", "rotary", "bias", "none"]


def _jsonable(value: Any) -> Any:
    """Turn tuples, dataclasses and tensors into JSON-friendly values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


class Encoding(nn.Module):
    """Base of every positional-encoding module.

    Subclasses set the class attributes ``name`` (the registry name) and ``kind``,
    and call ``self._set_config(**constructor_arguments)`` in ``__init__``.
    """

    name: ClassVar[str]
    kind: ClassVar[Kind]
    #: ``TinyTransformer`` gives every layer its own module of this encoding (CoPE: one
    #: table per layer, as its paper) instead of one module shared by the layers.
    per_layer: ClassVar[bool] = False

    def _set_config(self, **config: Any) -> None:
        self._config = {k: _jsonable(v) for k, v in config.items()}

    @classmethod
    def upgrade_config(cls, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """``(registry name, constructor arguments)`` of a config saved by an earlier posenc
        (its ``"name"`` is this class's): keys renamed or moved since are translated here,
        so :func:`posenc.build` loads every config posenc ever wrote. The default changes
        nothing."""
        return cls.name, args

    def to_config(self) -> dict[str, Any]:
        """A JSON-serialisable dict, ``{"name": ..., **constructor arguments}``."""
        return {"name": self.name, **getattr(self, "_config", {})}

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in getattr(self, "_config", {}).items())


class AdditiveEncoding(Encoding):
    """An encoding added to token embeddings ``[b, s, d]`` before the first layer."""

    kind: ClassVar[Kind] = "additive"


class RotaryEncoding(Encoding):
    """An encoding that rotates queries and keys inside attention.

    The protocol attention relies on (:mod:`posenc.attend` calls nothing else):

    - :attr:`position_coords`: ``None`` when a position is one number (``[s]`` / ``[b, s]``),
      ``n`` when it is ``n`` coordinates (``[s, n]`` / ``[b, s, n]``: M-RoPE, axial RoPE);
      :func:`posenc.positions.resolve_pair` takes it as ``coords``.
    - :meth:`rotation_at`: the rotation (cos/sin, or whatever the member needs) of positions
      already resolved by :func:`posenc.positions.resolve_pair`: no validation, no defaults;
      ``k_positions is q_positions`` means the queries and keys are the same tokens.
    - :meth:`rotate`: apply a rotation to ``q`` and ``k``.

    ``forward(q, k, q_positions, k_positions=...)`` is ``rotate(q, k, rotation(...))``;
    a model computes the rotation once per forward pass and rotates every layer with it.
    """

    kind: ClassVar[Kind] = "rotary"

    @property
    def position_coords(self) -> int | None:
        """Coordinates per position: ``None`` for scalar positions, else ``n``."""
        return None

    def rotation_at(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor, *, dtype: torch.dtype
    ) -> Any:
        """The rotation of resolved positions, in ``dtype`` (float32 or float64)."""
        raise NotImplementedError

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, rotation: Any, *, seq_dim: int = -2
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``q`` and ``k`` rotated by a rotation from :meth:`rotation_at`."""
        raise NotImplementedError


class BiasEncoding(Encoding):
    """An encoding that adds a bias to the attention logits.

    The protocol attention relies on (:mod:`posenc.attend` calls nothing else):
    ``num_heads``; :meth:`bias_at` on positions already resolved by
    :func:`posenc.positions.resolve_pair`; :meth:`score_mod_at` (optional: a FlexAttention
    ``score_mod`` from indices); and :meth:`value_bias_at` for value-dependent encodings.
    Encodings whose bias depends on the queries (Shaw et al.'s relative keys) set
    ``query_dependent = True`` and take ``q`` (already multiplied by the attention scale);
    those that also act on the values set ``value_dependent = True``. Contextual encodings
    (``contextual = True``: CoPE) compute their bias from the logits, queries and keys
    (:meth:`contextual_bias_at`); gated ones (``gated = True``: forgetting attention) from
    per-token gates the model computes (:meth:`gate_bias_at`); neither has a bias of
    positions alone.

    The public :meth:`bias` / :meth:`value_bias` resolve and validate the positions once,
    then call the ``*_at`` methods; families override them where they validate more (or
    on another device).
    """

    kind: ClassVar[Kind] = "bias"
    query_dependent: ClassVar[bool] = False
    value_dependent: ClassVar[bool] = False
    #: The bias depends on the content of the queries and keys (CoPE's gates), not on
    #: positions alone: attention calls :meth:`contextual_bias_at` with the logits.
    contextual: ClassVar[bool] = False
    #: The bias is computed from per-token gates the model supplies (FoX's forget gates):
    #: attention calls :meth:`gate_bias_at` / :meth:`gate_score_mod_at` with them.
    gated: ClassVar[bool] = False
    #: ``None`` for encodings that serve any number of heads (CoPE's one shared table).
    num_heads: int | None

    def bias(
        self,
        q_len: int,
        k_len: int | None = None,
        *,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The bias ``[h, q, k]`` (``[b, h, q, k]`` for batched positions) of ``q_len``
        queries and ``k_len`` keys, positions resolved by :func:`posenc.positions.resolve_pair`;
        query-dependent encodings add a keyword ``q``."""
        qpos, kpos = _positions.resolve_pair(q_len, k_len, q_positions, k_positions)
        return self.bias_at(qpos, kpos)

    def bias_at(
        self,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
        *,
        q: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`bias` of positions already resolved by :func:`posenc.positions.resolve_pair`
        (no validation, no defaults): ``[h, q, k]``, or ``[b, h, q, k]`` for batched
        positions. Query-dependent encodings take ``q`` (already multiplied by the scale)."""
        raise NotImplementedError

    def value_bias(
        self,
        probs: torch.Tensor,
        *,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Value-dependent encodings: the term added to ``probs @ v`` (``probs
        [b, h, q, k]``), positions resolved by :func:`posenc.positions.resolve_pair`."""
        q_len, k_len = int(probs.shape[-2]), int(probs.shape[-1])
        qpos, kpos = _positions.resolve_pair(q_len, k_len, q_positions, k_positions)
        return self.value_bias_at(probs, qpos, kpos)

    def value_bias_at(
        self, probs: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> torch.Tensor:
        """:meth:`value_bias` of resolved positions (no validation)."""
        raise NotImplementedError(f"{type(self).__name__} is not value-dependent")

    def score_mod(
        self,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
    ) -> Callable[..., torch.Tensor] | None:
        """A FlexAttention ``score_mod(score, b, h, q_idx, kv_idx)`` adding this bias
        without materialising ``[h, q, k]``; ``None`` when the encoding has none.

        ``q_positions`` / ``k_positions`` are ``[q]`` / ``[k]`` or ``[b, q]`` / ``[b, k]``.
        """
        return None

    def score_mod_at(
        self,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
    ) -> Callable[..., torch.Tensor] | None:
        """:meth:`score_mod` of positions already resolved by
        :func:`posenc.positions.resolve_pair` (no validation): what attention calls. The
        default calls :meth:`score_mod`; posenc's families override both."""
        return self.score_mod(q_positions, k_positions)

    def contextual_bias_at(
        self,
        logits: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        allowed: torch.Tensor | None,
        scale: float,
    ) -> torch.Tensor:
        """Contextual encodings: the term ``[b, h, q, k]`` added to ``logits = q k^T *
        scale`` (``[b, h, q, k]``, float32 or wider), from ``q [b, h, q, d]``, ``k [b, h, k,
        d]`` (key heads repeated to ``h``) and ``allowed`` (bool ``[.., q, k]``, the pairs
        that may attend; None: all)."""
        raise NotImplementedError(f"{type(self).__name__} is not contextual")

    def gate_bias_at(self, gates: torch.Tensor, q_len: int) -> torch.Tensor:
        """Gated encodings: the bias ``[b, h, q_len, k]`` of per-token ``gates [b, h, k]``
        (the queries are the last ``q_len`` keys), ``-inf`` on the pairs it forbids."""
        raise NotImplementedError(f"{type(self).__name__} is not gated")

    def gate_score_mod_at(
        self, gates: torch.Tensor, q_len: int
    ) -> Callable[..., torch.Tensor] | None:
        """Gated encodings: :meth:`gate_bias_at` as a FlexAttention ``score_mod`` (or None)."""
        return None

    @property
    def has_score_mod(self) -> bool:
        """Whether the encoding computes its bias from indices (a Flex ``score_mod``)."""
        cls = type(self)
        return (
            cls.score_mod is not BiasEncoding.score_mod
            or cls.score_mod_at is not BiasEncoding.score_mod_at
        )
