"""What every bias encoding shares: query/key positions, pairwise distances, exact constants,
and :class:`PositionBias`, the public methods of a bias of positions alone, written once.

Shapes: query positions ``[q]`` or ``[b, q]``, key positions ``[k]`` or ``[b, k]``; a pair
of them broadcasts to ``[q, k]`` or ``[b, q, k]``, and a bias is ``[h, q, k]`` or
``[b, h, q, k]`` (the head axis goes in front of the pair axes).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from posenc import positions as _positions
from posenc._base import BiasEncoding
from posenc._errors import (
    PosEncError,
    check_alloc,
    check_choice,
    check_positions,
    check_same_device,
    tracing,
)

__all__ = [
    "ExactConstants",
    "PositionBias",
    "canonical",
    "canonical_pair",
    "causal_option",
    "check_bias_size",
    "check_integer_positions",
    "check_module_device",
    "check_pair",
    "distance",
    "head_first",
    "index_positions",
    "pairs",
    "renamed",
    "resolve_pair",
]


def canonical(p: torch.Tensor) -> torch.Tensor:
    """Integer positions as int64, floating ones as float64: exact differences."""
    return p.to(torch.float64) if p.is_floating_point() else p.to(torch.long)


def canonical_pair(
    qpos: torch.Tensor, kpos: torch.Tensor, device: torch.device | str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both positions :func:`canonical` (int64 / float64) and on ``device``."""
    return canonical(qpos).to(device), canonical(kpos).to(device)


def check_pair(q_positions: Any, k_positions: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a pair ``[q] | [b, q]`` and ``[k] | [b, k]`` whose batch sizes agree (or are
    1) and whose distances fit (:func:`posenc.positions.check_distances`)."""
    qpos = check_positions("q_positions", q_positions)
    kpos = check_positions("k_positions", k_positions)
    check_same_device(("q_positions", "k_positions"), qpos, kpos)
    if qpos.ndim == 2 and kpos.ndim == 2 and 1 not in (qpos.shape[0], kpos.shape[0]):
        if qpos.shape[0] != kpos.shape[0]:
            raise PosEncError(
                "q_positions and k_positions must have the same batch size (or 1), got "
                f"shapes {tuple(qpos.shape)} and {tuple(kpos.shape)}"
            )
    _positions.check_distances(qpos, kpos)
    return qpos, kpos


def resolve_pair(
    q_len: int,
    k_len: int | None,
    q_positions: torch.Tensor | None,
    k_positions: torch.Tensor | None,
    *,
    device: torch.device | str | None,
    batch: int | None = None,
    num_heads: int | None = None,
    channels: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The query and key positions a ``bias(q_len, k_len, ...)`` call means, validated once:
    the defaults of :func:`posenc.positions.resolve_pair` (keys ``arange(k_len)``, queries
    the last ``q_len`` of them), on ``device``, int64 for integer positions and float64 for
    floating ones, their distances under ``2**63`` (:func:`posenc.positions.check_distances`).
    ``batch``: the batch size ``[b, s]`` positions must have (or 1).

    ``device`` is the module's: one on the meta device (no values) is refused. With
    ``num_heads``, the ``[b, h, q, k]`` bias (times ``channels`` values per pair) it asks
    for is checked against the allocation limit first (:func:`check_bias_size`)."""
    check_module_device(device)
    qpos, kpos = _positions.resolve_pair(q_len, k_len, q_positions, k_positions, batch=batch)
    if q_positions is not None or k_positions is not None:  # the defaults are near 0
        _positions.check_distances(qpos, kpos)
    if num_heads is not None:
        check_bias_size(qpos, kpos, num_heads, device, channels=channels)
    return canonical_pair(qpos, kpos, device)


def check_module_device(device: torch.device | str | None) -> None:
    """Raise if a bias module's tensors are on the meta device: they hold no values, and a
    bias computed from them would be garbage (``to_empty(device=...)`` gives real ones)."""
    if device is not None and torch.device(device).type == "meta":
        raise PosEncError(
            "the module's parameters are on the meta device (no values); move it with "
            "to_empty(device=...) and initialise it before computing a bias, got device meta"
        )


def check_bias_size(
    qpos: torch.Tensor,
    kpos: torch.Tensor,
    num_heads: int,
    device: torch.device | str | None,
    *,
    channels: int = 1,
) -> None:
    """Raise before materialising a ``[b, h, q, k]`` float32 bias (with its int64 distances)
    that needs more memory than allowed (:func:`posenc._errors.check_alloc`)."""
    if tracing():
        return
    b = max(qpos.shape[0] if qpos.ndim == 2 else 1, kpos.shape[0] if kpos.ndim == 2 else 1)
    q, k = qpos.shape[-1], kpos.shape[-1]
    # the bias, plus about three [b, q, k] int64 / float64 temporaries (distances, buckets)
    shape = (b, num_heads * channels + 6, q, k)
    check_alloc("q_len, k_len", (q, k), shape, torch.float32, device)


def check_integer_positions(encoding: str, qpos: torch.Tensor, kpos: torch.Tensor) -> None:
    """Raise unless both position tensors are integers (relative distances index a table)."""
    for name, p in (("q_positions", qpos), ("k_positions", kpos)):
        if p.is_floating_point():
            raise PosEncError(
                f"{name} must be an integer tensor for {encoding} (relative distances index "
                f"a table), got dtype {p.dtype}"
            )


def causal_option(causal: Any, bidirectional: Any, *, default: bool) -> bool:
    """The direction option ``causal`` (True: a query sees only keys at or before it, as in a
    decoder; False: both directions, an encoder), or ``not bidirectional``, its deprecated
    spelling (a ``DeprecationWarning``). ``None``: not given (``default`` when neither is)."""
    if bidirectional is not None:
        if causal is not None:
            raise PosEncError(
                "give causal or the deprecated bidirectional (its opposite), not both, got "
                f"causal={causal!r} and bidirectional={bidirectional!r}"
            )
        warnings.warn(
            "bidirectional= is deprecated, use causal= (causal=not bidirectional); "
            "bidirectional= will be removed in the next release",
            DeprecationWarning,
            stacklevel=3,
        )
        return not check_choice("bidirectional", bidirectional, (True, False))
    return default if causal is None else bool(check_choice("causal", causal, (True, False)))


def renamed(module: str, name: str, classes: Mapping[str, type]) -> type:
    """A module ``__getattr__`` (PEP 562) for renamed classes: ``classes`` maps an old name to
    its class, returned with a ``DeprecationWarning`` naming the new name."""
    if name not in classes:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new = classes[name].__name__
    warnings.warn(
        f"{module}.{name} is deprecated, use {new} (bias modules end in Bias); "
        "the old name will be removed in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return classes[name]


def pairs(
    qpos: torch.Tensor, kpos: torch.Tensor, device: torch.device | str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Query positions ``[.., q, 1]`` and key positions ``[.., 1, k]``, :func:`canonical`
    (int64 / float64) on ``device``: they broadcast to pairs."""
    qpos, kpos = canonical_pair(qpos, kpos, device)
    return qpos.unsqueeze(-1), kpos.unsqueeze(-2)


def distance(qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
    """``i - j`` (query minus key position) in float32, from exact int64/float64 operands.

    Used both on whole ``[.., q, 1] x [.., 1, k]`` grids and on single indices inside a
    FlexAttention ``score_mod``, so the two paths round identically.
    """
    return (qp - kp).to(torch.float32)


def head_first(per_head: torch.Tensor, pair_ndim: int) -> torch.Tensor:
    """A per-head vector ``[h]`` shaped to broadcast with pair tensors ``[q, k]`` / ``[b, q, k]``."""
    return per_head.reshape(-1, 1, 1) if pair_ndim == 2 else per_head.reshape(1, -1, 1, 1)


def index_positions(
    qpos: torch.Tensor, kpos: torch.Tensor
) -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]:
    """Lookups ``(b, q_idx) -> position`` and ``(b, kv_idx) -> position`` for a ``score_mod``.

    ``[s]`` and ``[1, s]`` positions ignore ``b``; ``[b, s]`` positions are read at row ``b``.
    """

    def lookup(p: torch.Tensor) -> Callable[..., torch.Tensor]:
        if p.ndim == 2 and p.shape[0] == 1:
            p = p[0]
        if p.ndim == 1:
            return lambda b, idx: p[idx]
        # One flat index instead of p[b, idx]: the same values, and Inductor's CPU
        # FlexAttention template compiles it for larger score_mods (FIRE's MLP) too.
        length, flat = p.shape[1], p.reshape(-1)
        return lambda b, idx: flat[b * length + idx]

    return lookup(qpos), lookup(kpos)


class ExactConstants(nn.Module):
    """Mixin for constant tensors that must stay exact: non-persistent buffers rebuilt from
    their definition after every ``.to()`` / ``.cuda()`` / ``.half()`` / ``to_empty()``.

    Subclasses implement :meth:`_constants` (name -> CPU tensor) and call
    :meth:`_install_constants` in ``__init__``. ``module.to(torch.bfloat16)`` therefore moves
    the constants but never lowers their precision, they never enter ``state_dict``, and a
    module built on the meta device gets real values from ``to_empty``.
    """

    def _constants(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _install_constants(self, device: torch.device | str | None = None) -> None:
        device = torch.get_default_device() if device is None else torch.device(device)
        for name, value in self._constants().items():
            self.register_buffer(name, value.to(device), persistent=False)

    def _apply(
        self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
    ) -> ExactConstants:
        super()._apply(fn, recurse)
        for name, value in self._constants().items():
            setattr(self, name, value.to(getattr(self, name).device))
        return self


class PositionBias(BiasEncoding):
    """A bias of positions and heads alone (ALiBi, T5, FIRE, Kerple): the public methods of
    the protocol, written once.

    :meth:`bias` resolves and validates the positions (:meth:`_resolve`, with
    :func:`resolve_pair`: on the module's device, the ``[b, h, q, k]`` size checked for
    ``num_heads`` heads) and calls :meth:`bias_at`; :meth:`score_mod` validates them (:func:`check_pair`) and calls
    :meth:`score_mod_at`; :meth:`bias_at` ignores ``q``. A subclass gives ``num_heads``,
    :attr:`_device` (where its tensors live), :meth:`_position_bias` (the bias of resolved
    positions) and :meth:`score_mod_at`.
    """

    num_heads: int

    @property
    def _device(self) -> torch.device:
        """The device of the module's tensors, where the bias is computed."""
        raise NotImplementedError

    def _resolve(
        self,
        q_len: int,
        k_len: int | None,
        q_positions: torch.Tensor | None,
        k_positions: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The positions a ``bias(q_len, k_len, ...)`` call means (:func:`resolve_pair`)."""
        return resolve_pair(
            q_len, k_len, q_positions, k_positions, device=self._device, num_heads=self.num_heads
        )

    def _index_positions(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]:
        """:func:`index_positions` of resolved positions, on the module's device."""
        return index_positions(*canonical_pair(q_positions, k_positions, self._device))

    def bias_at(
        self,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
        *,
        q: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`bias` of positions already resolved by :func:`posenc.positions.resolve_pair`
        (no validation); ``q`` is ignored (the bias does not depend on the queries)."""
        return self._position_bias(q_positions, k_positions)

    def _position_bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """:meth:`bias_at`, the family's formula."""
        raise NotImplementedError

    def score_mod(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> Callable[..., torch.Tensor]:
        """FlexAttention ``score_mod(score, b, h, q_idx, kv_idx) -> score + bias``: the bias
        of one pair from the two positions, no ``[h, q, k]`` tensor.

        Positions ``[q]`` / ``[k]`` or ``[b, q]`` / ``[b, k]`` are validated, then passed to
        :meth:`score_mod_at`."""
        return self.score_mod_at(*check_pair(q_positions, k_positions))

    def score_mod_at(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> Callable[..., torch.Tensor]:
        """:meth:`score_mod` of positions already resolved (no validation)."""
        raise NotImplementedError
