"""An encoding prepared once for many attention calls over the same tokens.

:func:`posenc.attention` turns its ``encoding`` and positions into a
:class:`PreparedEncoding`: the encoding module, the query and key positions resolved (and
validated, once) by :func:`posenc.positions.resolve_pair`, and, computed on first use and
then kept, what depends on nothing but them: a rotary encoding's rotation (cos/sin, xPos
scales included), a bias encoding's ``[h, q, k]`` tensor, the SDPA float mask merging it
with the causal / padding mask, and its FlexAttention ``score_mod``. A direct call
prepares and uses it once; a model prepares one per forward pass and hands it to every
layer, so that work is done once, not per layer::

    prep = prepare_encoding(enc, q_len=s, k_len=s, num_heads=h, head_dim=d, q_positions=p,
                            k_positions=p, batch=b)
    for layer in layers:  # each layer: attention(q, k, v, encoding=prep, causal=True)

It knows the encoding protocols of :mod:`posenc._base`, never a concrete class: rotary
encodings through ``position_coords`` / ``rotation_at`` / ``rotate``, bias encodings
through ``bias_at`` / ``value_bias_at`` / ``score_mod_at``. Query- and value-dependent terms
(Shaw relative keys / values) depend on ``q`` or the attention probabilities and are
still computed per call; contextual and gated encodings depend on the tokens, so nothing
of theirs is kept here (attention's paths call their protocols per call).
"""

from __future__ import annotations

import itertools
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch

from posenc import positions as _positions
from posenc import registry
from posenc._base import LOGIT_PROTOCOLS, BiasEncoding, Encoding, RotaryEncoding
from posenc._errors import PosEncError, check_int
from posenc.attend.flex import bias_score_mod
from posenc.attend.paths import allowed_pairs

__all__ = ["PreparedEncoding", "prepare_encoding"]

# --- the encoding of a call ----------------------------------------------------------

_BUILT_MAX = 32
#: Modules built from a name or config, kept when they hold no parameters (a second call
#: with the same spec builds nothing); learned ones are built afresh (pass an instance).
_BUILT: OrderedDict[str, Encoding] = OrderedDict()


def _key(spec: Any, num_heads: int, head_dim: int) -> str | None:
    """The cache key of a name or config (None: one holding tensors or objects)."""
    try:
        return json.dumps([spec, num_heads, head_dim], sort_keys=True)
    except (TypeError, ValueError):
        return None


def _cached(spec: Any, num_heads: int, head_dim: int) -> Encoding | None:
    """The module built before from this name or config (only parameter-free attention
    encodings are kept: checked when they were built), or None."""
    if isinstance(spec, Encoding) or spec is None:
        return None
    key = _key(spec, num_heads, head_dim)
    enc = None if key is None else _BUILT.get(key)
    if enc is not None:
        _BUILT.move_to_end(key)  # type: ignore[arg-type]
    return enc


def _built(spec: str | Mapping[str, Any], num_heads: int, head_dim: int) -> Encoding:
    """``registry.build(spec)`` with ``num_heads`` / ``head_dim`` filled in, cached."""
    key = _key(spec, num_heads, head_dim)
    if key is not None and key in _BUILT:
        _BUILT.move_to_end(key)
        return _BUILT[key]
    enc = registry.build(spec, fill={"num_heads": num_heads, "head_dim": head_dim})
    if key is not None and not any(True for _ in enc.parameters()):
        _BUILT[key] = enc
        if len(_BUILT) > _BUILT_MAX:
            _BUILT.popitem(last=False)
    return enc


def attention_encoding(encoding: Any, *, num_heads: int, head_dim: int) -> Encoding | None:
    """The encoding attention acts with (rotary, or a bias, contextual or gated one), or
    None for ``None`` / ``"none"``.

    Names and configs are built by :func:`posenc.registry.build` (with ``num_heads`` and
    ``head_dim`` filled in); additive encodings raise ``PosEncError``.
    """
    if encoding is None:
        return None
    cls = registry.class_of(encoding)
    if cls.kind == "additive":
        raise PosEncError(
            f"encoding {cls.name!r} is additive: add it to the token embeddings before the "
            "first layer; attention takes rotary, bias or 'none' encodings"
        )
    if cls.kind == "none":
        return None
    enc = encoding if isinstance(encoding, Encoding) else _built(encoding, num_heads, head_dim)
    if not isinstance(enc, _ATTENTION_PROTOCOLS):
        raise PosEncError(
            f"encoding must be rotary, bias or 'none', got kind {enc.kind!r} ({enc.name!r})"
        )
    return enc


_ATTENTION_PROTOCOLS = (RotaryEncoding, *LOGIT_PROTOCOLS)


def heads_of(enc: Encoding | None) -> int | None:
    """The query heads a logit encoding is built for (None: any, or not a logit encoding)."""
    return enc.num_heads if isinstance(enc, LOGIT_PROTOCOLS) else None


def check_heads(enc: Encoding | None, num_heads: int) -> None:
    """Raise unless ``enc`` serves ``num_heads`` query heads."""
    heads = heads_of(enc)
    if enc is not None and heads is not None and heads != num_heads:
        raise PosEncError(
            f"encoding {enc.name!r} has num_heads={heads}; it must equal the number of "
            f"query heads, {num_heads}"
        )


# --- the prepared state -----------------------------------------------------------


class PreparedEncoding:
    """A rotary, bias, contextual or gated encoding with its positions resolved, and the
    tensors derived from them computed at most once (see the module docs). Build one with
    :func:`prepare_encoding` (or directly from positions already resolved by
    :func:`posenc.positions.resolve_pair`); pass it as ``encoding=`` to
    :func:`posenc.attention` (with no positions: they are part of it) for any number of
    ``q [b, h, q_len, d]`` / ``k [b, h_kv, k_len, d]``, or rotate with :meth:`rotate`.

    Attributes:
        encoding: the :class:`~posenc._base.RotaryEncoding`,
            :class:`~posenc._base.BiasEncoding`, :class:`~posenc._base.ContextualEncoding`
            or :class:`~posenc._base.GatedEncoding` module.
        q_positions, k_positions: ``[q]`` / ``[k]`` or ``[b, q]`` / ``[b, k]`` (a trailing
            coordinate axis for N-D rotary encodings).
        q_len, k_len: the lengths it was prepared for.
    """

    def __init__(
        self,
        encoding: Encoding,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
    ) -> None:
        if not isinstance(encoding, _ATTENTION_PROTOCOLS):
            raise PosEncError(
                "encoding must be a rotary, bias, contextual or gated encoding, got "
                f"{type(encoding).__name__}"
            )
        coords = getattr(encoding, "position_coords", None)
        for name, p in (("k_positions", k_positions), ("q_positions", q_positions)):
            if not isinstance(p, torch.Tensor):
                raise PosEncError(f"{name} must be a torch.Tensor, got {type(p).__name__}")
            if coords is not None and (p.ndim not in (2, 3) or p.shape[-1] != coords):
                raise PosEncError(
                    f"{name} must be [s, {coords}] or [b, s, {coords}] ({coords} coordinates "
                    f"per position) for encoding {encoding.name!r}, got shape {tuple(p.shape)}"
                )
        self._set(encoding, q_positions, k_positions, coords)

    @classmethod
    def _resolved(
        cls, encoding: Encoding, q_positions: torch.Tensor, k_positions: torch.Tensor, coords
    ) -> PreparedEncoding:
        """One of positions :func:`posenc.positions.resolve_pair` resolved for ``encoding``
        (of ``coords`` coordinates a position): nothing to check again."""
        self = cls.__new__(cls)
        self._set(encoding, q_positions, k_positions, coords)
        return self

    def _set(self, encoding: Encoding, q_positions, k_positions, coords) -> None:
        self.encoding = encoding
        self.q_positions, self.k_positions = q_positions, k_positions
        self._lead = 2 if coords is None else 3  # rank of batched positions
        seq = -1 if coords is None else -2
        # sizes as they are: int() of a symbolic one (torch.export) would fix the length
        self.q_len, self.k_len = q_positions.shape[seq], k_positions.shape[seq]
        self._rotations: dict[tuple[torch.dtype, torch.device], Any] = {}
        self._bias: torch.Tensor | None = None
        self._score_mod: Callable[..., torch.Tensor] | None = None
        # SDPA masks: (dtype, causal) -> (the attn_mask object they were made for, mask, empty)
        self._masks: dict[tuple[torch.dtype, bool], tuple[Any, torch.Tensor, Any]] = {}

    def check(self, b: int, q_len: int, k_len: int) -> None:
        """Raise unless ``q_len`` queries and ``k_len`` keys of batch ``b`` fit."""
        if (q_len, k_len) != (self.q_len, self.k_len):
            raise PosEncError(
                f"the prepared encoding is for q_len={self.q_len}, k_len={self.k_len}, got "
                f"q_len={q_len}, k_len={k_len}"
            )
        for name, p in (("q_positions", self.q_positions), ("k_positions", self.k_positions)):
            if p.ndim == self._lead and p.shape[0] not in (1, b):
                raise PosEncError(
                    f"the prepared encoding's {name} have batch size {p.shape[0]}; q has {b}"
                )

    @property
    def value_dependent(self) -> bool:
        """Whether the encoding adds a term to ``probs @ v`` (:meth:`value_bias`)."""
        return isinstance(self.encoding, BiasEncoding) and self.encoding.value_dependent

    def _kind(self, cls: type[Encoding], what: str) -> Any:
        if not isinstance(self.encoding, cls):
            raise PosEncError(
                f"{what} needs a {cls.kind} encoding, got kind {self.encoding.kind!r}"
            )
        return self.encoding

    # --- rotary -------------------------------------------------------------------

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``q [b, h, q_len, d]`` and ``k [b, h_kv, k_len, d]`` rotated at the prepared
        positions; the rotation is computed once per dtype and device (float32, or float64
        for float64 inputs, as :class:`~posenc.RotaryEmbedding` chooses)."""
        self._kind(RotaryEncoding, "rotate")
        self.check(q.shape[0], q.shape[-2], k.shape[-2])
        return self.rotate_at(q, k)

    def rotate_at(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`rotate` for :func:`posenc.attention`, which has checked that q and k fit
        (a rotary encoding it prepared for them, or :meth:`check` passed)."""
        enc: RotaryEncoding = self.encoding  # type: ignore[assignment]
        dtype = torch.float64 if torch.float64 in (q.dtype, k.dtype) else torch.float32
        key = (dtype, q.device)
        if key not in self._rotations:
            qpos = self.q_positions.to(q.device)
            kpos = qpos if self.k_positions is self.q_positions else self.k_positions.to(q.device)
            self._rotations[key] = enc.rotation_at(qpos, kpos, dtype=dtype)
        return enc.rotate_at(q, k, self._rotations[key])

    # --- bias ---------------------------------------------------------------------

    def _bias_at(self, enc: BiasEncoding, q: torch.Tensor, scale: float) -> torch.Tensor:
        """The encoding's bias, checked to fit ``[b|1, h, q, k]`` (or ``[h, q, k]``)."""
        if enc.query_dependent:
            bias = enc.bias_at(self.q_positions, self.k_positions, q=q * scale)
        else:
            bias = enc.bias_at(self.q_positions, self.k_positions)
        h = q.shape[1]
        if bias.ndim not in (3, 4) or tuple(bias.shape[-3:]) != (h, self.q_len, self.k_len):
            raise PosEncError(
                f"encoding {enc.name!r} returned a bias of shape {tuple(bias.shape)}, "
                f"expected [b, {h}, {self.q_len}, {self.k_len}] or [{h}, {self.q_len}, {self.k_len}]"
            )
        return bias

    def bias(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        """The bias ``[b|1, h, q, k]`` or ``[h, q, k]`` (float32); query-dependent encodings
        get ``q * scale`` and are computed per call, the others once."""
        enc: BiasEncoding = self._kind(BiasEncoding, "a bias")
        if enc.query_dependent:
            return self._bias_at(enc, q, scale)
        if self._bias is None:
            self._bias = self._bias_at(enc, q, scale)
        return self._bias

    def value_bias(self, probs: torch.Tensor) -> torch.Tensor:
        """A value-dependent encoding's term added to ``probs @ v`` (computed per call)."""
        enc: BiasEncoding = self._kind(BiasEncoding, "a value bias")
        return enc.value_bias_at(probs, self.q_positions, self.k_positions)

    def sdpa_mask(
        self,
        q: torch.Tensor,
        scale: float,
        *,
        keep: torch.Tensor | None,
        causal: bool,
        mask_id: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """SDPA's float mask (the bias in ``q``'s dtype, ``-inf`` where neither ``causal`` nor
        ``keep``, the validated bool mask ``[b|1, h|1, q|1, k]``, allows) and the rows that
        see no key. Kept per dtype and ``causal`` while ``mask_id`` (the caller's
        ``attn_mask`` object, of which ``keep`` is a view) stays the same: the layers of one
        forward pass."""
        enc: BiasEncoding = self._kind(BiasEncoding, "an SDPA mask")
        cacheable = not enc.query_dependent
        key = (q.dtype, causal)
        if cacheable and key in self._masks and self._masks[key][0] is mask_id:
            return self._masks[key][1], self._masks[key][2]
        allowed, empty = allowed_pairs(keep, causal, self.q_len, self.k_len, q.device)
        mask = self.bias(q, scale).to(q.dtype)
        if allowed is not None:
            mask = mask.masked_fill(~allowed, float("-inf"))
        if mask.ndim == 3:  # [h, q, k] -> [1, h, q, k]: SDPA's fused CPU kernel takes a 4-D
            mask = mask[None]  # mask (a 3-D one sends it to the math path, 2x slower)
        if cacheable:
            self._masks[key] = (mask_id, mask, empty)
        return mask, empty

    def score_mod(self, q: torch.Tensor, scale: float) -> Callable[..., torch.Tensor]:
        """A FlexAttention ``score_mod``: the encoding's own (from indices), or one reading
        the materialised bias; the same function for every call when it depends on no ``q``."""
        enc: BiasEncoding = self._kind(BiasEncoding, "a score_mod")
        if self._score_mod is not None:
            return self._score_mod
        score_mod = None
        if not enc.query_dependent:
            score_mod = enc.score_mod_at(self.q_positions, self.k_positions)
        if score_mod is None:  # no index formula: fall back to the materialised bias
            bias = self.bias(q.float(), scale)
            if bias.ndim == 4 and bias.shape[0] == 1:
                bias = bias[0]
            score_mod = bias_score_mod(bias.float())
        if not enc.query_dependent:
            self._score_mod = score_mod
        return score_mod


def _check_has_values(enc: Encoding) -> None:
    """Refuse an encoding whose tensors are on the meta device (built there, never
    ``to_empty``-ed): they hold no values, and a bias from them would be garbage."""
    for t in itertools.chain(enc.parameters(), enc.buffers()):
        if t.is_meta:
            raise PosEncError(
                f"encoding {enc.name!r} has its tensors on the meta device (no values); move "
                "it with to_empty(device=...) and initialise it first"
            )
        return


def prepare_encoding(
    encoding: str | Mapping[str, Any] | Encoding | None,
    *,
    q_len: int,
    k_len: int | None = None,
    num_heads: int,
    head_dim: int,
    batch: int | None = None,
    q_positions: torch.Tensor | None = None,
    k_positions: torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> PreparedEncoding | None:
    """Resolve an encoding and its positions once for many attention calls.

    Args:
        encoding: as :func:`posenc.attention` takes it (names and configs are built with
            ``num_heads`` / ``head_dim``); additive encodings raise ``PosEncError``.
        q_len, k_len: numbers of queries and keys of every call (``k_len`` default
            ``q_len``).
        num_heads, head_dim: of the queries.
        batch: the batch size ``[b, s]`` positions must fit (or 1); None: any.
        q_positions, k_positions: as in :func:`posenc.attention`, resolved (and validated,
            once each) by :func:`posenc.positions.resolve_pair`; N-D rotary encodings
            (M-RoPE, axial) take ``[s, n]`` / ``[b, s, n]`` coordinates. A bias of
            positions needs them less than ``2**63`` apart
            (:func:`posenc.positions.check_distances`).
        device: where the positions (and what is derived from them) live.

    Returns:
        A :class:`PreparedEncoding`, or None for no encoding (``None`` / ``"none"``; the
        positions are validated all the same).

    Shape:
        positions ``[q]`` / ``[k]`` or ``[b, q]`` / ``[b, k]``.

    Examples:
        >>> import torch, posenc
        >>> from posenc.attend import prepare_encoding
        >>> q, k, v = torch.randn(3, 2, 4, 6, 8).unbind(0)
        >>> prep = prepare_encoding("alibi", q_len=6, num_heads=4, head_dim=8)
        >>> out = posenc.attention(q, k, v, encoding=prep, causal=True)
        >>> torch.equal(out, posenc.attention(q, k, v, encoding=prep.encoding, causal=True))
        True
    """
    num_heads = check_int("num_heads", num_heads, min=1)
    head_dim = check_int("head_dim", head_dim, min=1)
    enc = attention_encoding(encoding, num_heads=num_heads, head_dim=head_dim)
    if enc is None and q_positions is None and k_positions is None:
        return None  # nothing to resolve or check
    coords = _check_encoding(enc, num_heads)
    qpos, kpos = _positions.resolve_pair(
        q_len, k_len, q_positions, k_positions, batch=batch, device=device, coords=coords
    )  # validated even when no encoding reads them
    return _prepared(enc, qpos, kpos, q_positions is not None or k_positions is not None, coords)


def prepare_at(
    encoding: Any,
    *,
    q_len: int,
    k_len: int,
    num_heads: int,
    head_dim: int,
    batch: int,
    q_positions: Any,
    k_positions: Any,
    device: torch.device,
) -> PreparedEncoding | None:
    """:func:`prepare_encoding` for :func:`posenc.attention`, whose sizes and device are read
    off ``q`` and ``k`` it has validated: the encoding and the positions are checked here,
    the sizes trusted."""
    enc = _cached(encoding, num_heads, head_dim)  # checked when it was built
    if enc is None:
        enc = attention_encoding(encoding, num_heads=num_heads, head_dim=head_dim)
        if enc is None and q_positions is None and k_positions is None:
            return None
        coords = _check_encoding(enc, num_heads)
    else:
        coords = enc.position_coords if isinstance(enc, RotaryEncoding) else None
    qpos, kpos = _positions.resolve_pair_at(
        q_len, k_len, q_positions, k_positions, batch, device, coords
    )
    return _prepared(enc, qpos, kpos, q_positions is not None or k_positions is not None, coords)


def _check_encoding(enc: Encoding | None, num_heads: int) -> int | None:
    """Refuse an encoding that does not serve ``num_heads`` or holds no values; its
    positions' coordinates (None: one number a position)."""
    if enc is None:
        return None
    check_heads(enc, num_heads)
    _check_has_values(enc)
    return enc.position_coords if isinstance(enc, RotaryEncoding) else None


def _prepared(enc: Encoding | None, qpos, kpos, given: bool, coords) -> PreparedEncoding | None:
    """The prepared encoding of positions :func:`~posenc.positions.resolve_pair` resolved
    (None: no encoding), the distances checked for a bias of given positions."""
    if isinstance(enc, BiasEncoding) and given:
        _positions.check_distances(qpos, kpos)  # a bias of positions forms k - q
    return None if enc is None else PreparedEncoding._resolved(enc, qpos, kpos, coords)
