"""An encoding prepared once for many attention calls over the same tokens.

:func:`posenc.attention` turns its ``encoding`` and positions into a
:class:`PreparedEncoding`: the encoding module, the query and key positions resolved by
:func:`posenc.positions.resolve_pair`, and, computed on first use and then kept, what
depends on nothing but them: a rotary encoding's cos/sin (xPos scales included), a bias
encoding's ``[h, q, k]`` tensor, the SDPA float mask merging it with the causal / padding
mask, and its FlexAttention ``score_mod``. A direct call prepares and uses it once; a
model prepares one per forward pass and hands it to every layer, so that work is done
once, not per layer::

    prep = prepare_encoding(enc, q_len=s, k_len=s, num_heads=h, head_dim=d, q_positions=p,
                            k_positions=p, batch=b)
    for layer in layers:  # each layer: attention(q, k, v, encoding=prep, causal=True)

Query- and value-dependent terms (Shaw relative keys / values) depend on ``q`` or the
attention probabilities and are still computed per call.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from posenc import _flex as _flexattn
from posenc import positions as _positions
from posenc._base import BiasEncoding, Encoding, RotaryEncoding
from posenc._errors import PosEncError, check_int
from posenc.rotary.module import RotaryEmbedding, Rotation

__all__ = ["PreparedEncoding", "prepare_encoding"]

# --- building encodings -----------------------------------------------------------


def _spec(spec: Any) -> tuple[str, dict[str, Any]]:
    """``(name, constructor arguments)`` of a registry name or config dict."""
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, Mapping):
        if not isinstance(spec.get("name"), str):
            raise PosEncError(f"encoding config must hold a 'name' string, got keys {sorted(spec)}")
        return spec["name"], {k: v for k, v in spec.items() if k != "name"}
    raise PosEncError(
        "encoding must be None, a registry name, a config dict or an Encoding, "
        f"got {type(spec).__name__}"
    )


def _encoding_class(spec: str | Mapping[str, Any] | Encoding) -> type[Encoding]:
    """The class ``spec`` builds (its ``kind`` is known before building)."""
    from posenc.registry import get

    return type(spec) if isinstance(spec, Encoding) else get(_spec(spec)[0])


def _build_encoding(
    spec: str | Mapping[str, Any] | Encoding,
    defaults: Mapping[str, Any] | None = None,
    **supplied: Any,
) -> Encoding:
    """Build ``spec`` (name, config or instance), filling constructor arguments it leaves out.

    ``supplied`` holds values the caller knows (``num_heads``, ``head_dim``, ``dim``,
    ``max_len``); each is passed only when the class's constructor takes it and the spec
    does not set it. A spec that sets one to a different value raises ``PosEncError``.
    ``defaults`` are passed the same way but a spec may override them. Instances are
    returned as they are.
    """
    from posenc.registry import build

    if isinstance(spec, Encoding):
        return spec
    name, config = _spec(spec)
    accepted = inspect.signature(_encoding_class(spec).__init__).parameters
    extra = {}
    for key, value in supplied.items():
        if value is None or key not in accepted:
            continue
        if key in config and config[key] != value:
            raise PosEncError(
                f"encoding {name!r}: {key} must be {value} here (set by the caller), "
                f"got {config[key]!r} in its config"
            )
        extra[key] = value
    for key, value in (defaults or {}).items():
        if key in accepted and key not in config:
            extra[key] = value
    return build({"name": name, **config}, **extra)


def _attention_encoding(
    encoding: Any, *, num_heads: int, head_dim: int
) -> RotaryEncoding | BiasEncoding | None:
    """The encoding attention acts with: rotary, bias, or None for ``none``."""
    if encoding is None:
        return None
    cls = _encoding_class(encoding)
    if cls.kind == "additive":
        raise PosEncError(
            f"encoding {cls.name!r} is additive: add it to the token embeddings before the "
            "first layer; attention takes rotary, bias or 'none' encodings"
        )
    if cls.kind == "none":
        return None
    enc = _build_encoding(encoding, num_heads=num_heads, head_dim=head_dim)
    if not isinstance(enc, (RotaryEncoding, BiasEncoding)):
        raise PosEncError(
            f"encoding must be rotary, bias or 'none', got kind {enc.kind!r} ({enc.name!r})"
        )
    return enc


def _bias_tensor(
    enc: BiasEncoding, q: torch.Tensor, scale: float, qpos, kpos, q_len: int, k_len: int
) -> torch.Tensor:
    """The encoding's bias, checked to fit ``[b|1, h, q, k]`` (or ``[h, q, k]``)."""
    if enc.query_dependent:
        bias_fn: Any = enc.bias  # query-dependent encodings take q (see BiasEncoding)
        bias = bias_fn(q_len, k_len, q_positions=qpos, k_positions=kpos, q=q * scale)
    else:
        bias = enc.bias(q_len, k_len, q_positions=qpos, k_positions=kpos)
    h = q.shape[1]
    if bias.ndim not in (3, 4) or tuple(bias.shape[-3:]) != (h, q_len, k_len):
        raise PosEncError(
            f"encoding {enc.name!r} returned a bias of shape {tuple(bias.shape)}, "
            f"expected [b, {h}, {q_len}, {k_len}] or [{h}, {q_len}, {k_len}]"
        )
    return bias


# --- the prepared state -----------------------------------------------------------


class PreparedEncoding:
    """A rotary or bias encoding with its positions resolved, and the tensors derived from
    them computed at most once (see the module docs). Build one with
    :func:`prepare_encoding`; pass it as ``encoding=`` to :func:`posenc.attention` (with no
    positions: they are part of it) for any number of ``q [b, h, q_len, d]`` /
    ``k [b, h_kv, k_len, d]``, or rotate with :meth:`rotate`.

    Attributes:
        encoding: the :class:`~posenc._base.RotaryEncoding` or
            :class:`~posenc._base.BiasEncoding` module.
        q_positions, k_positions: ``[q]`` / ``[k]`` or ``[b, q]`` / ``[b, k]``.
        q_len, k_len: the lengths it was prepared for.
    """

    def __init__(
        self,
        encoding: RotaryEncoding | BiasEncoding,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
    ) -> None:
        self.encoding = encoding
        self.q_positions, self.k_positions = q_positions, k_positions
        self.q_len, self.k_len = int(q_positions.shape[-1]), int(k_positions.shape[-1])
        self._rotations: dict[torch.dtype, Rotation] = {}
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
            if p.ndim == 2 and p.shape[0] not in (1, b):
                raise PosEncError(
                    f"the prepared encoding's {name} have batch size {p.shape[0]}; q has {b}"
                )

    # --- rotary -------------------------------------------------------------------

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``q [b, h, q_len, d]`` and ``k [b, h_kv, k_len, d]`` rotated at the prepared
        positions; the cos/sin are computed once per dtype (float32, or float64 for float64
        inputs, as :class:`~posenc.RotaryEmbedding` chooses)."""
        enc = self.encoding
        if not isinstance(enc, RotaryEncoding):
            raise PosEncError(f"rotate needs a rotary encoding, got kind {enc.kind!r}")
        self.check(q.shape[0], q.shape[-2], k.shape[-2])
        if not isinstance(enc, RotaryEmbedding):  # another rotary module: its own forward
            return enc(q, k, self.q_positions, k_positions=self.k_positions)
        dtype = torch.float64 if torch.float64 in (q.dtype, k.dtype) else torch.float32
        if dtype not in self._rotations:
            self._rotations[dtype] = enc.rotation(
                self.q_len,
                self.k_len,
                positions=self.q_positions,
                k_positions=self.k_positions,
                device=q.device,
                dtype=dtype,
            )
        return enc.rotate(q, k, self._rotations[dtype])

    # --- bias ---------------------------------------------------------------------

    def _bias_encoding(self) -> BiasEncoding:
        enc = self.encoding
        if not isinstance(enc, BiasEncoding):
            raise PosEncError(f"a bias is computed by bias encodings, got kind {enc.kind!r}")
        return enc

    def bias(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        """The bias ``[b|1, h, q, k]`` or ``[h, q, k]`` (float32); query-dependent encodings
        get ``q * scale`` and are computed per call, the others once."""
        enc = self._bias_encoding()
        if enc.query_dependent:
            return _bias_tensor(
                enc, q, scale, self.q_positions, self.k_positions, self.q_len, self.k_len
            )
        if self._bias is None:
            self._bias = _bias_tensor(
                enc, q, scale, self.q_positions, self.k_positions, self.q_len, self.k_len
            )
        return self._bias

    def sdpa_mask(
        self,
        q: torch.Tensor,
        scale: float,
        allowed: Callable[[], tuple[torch.Tensor | None, torch.Tensor | None]],
        *,
        causal: bool,
        attn_mask: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """SDPA's float mask (the bias in ``q``'s dtype, ``-inf`` where ``allowed()`` says no)
        and the rows that see no key; kept per dtype and ``causal`` while ``attn_mask`` is the
        same object (the layers of one forward pass)."""
        enc = self.encoding
        cacheable = isinstance(enc, BiasEncoding) and not enc.query_dependent
        key = (q.dtype, causal)
        if cacheable and key in self._masks and self._masks[key][0] is attn_mask:
            return self._masks[key][1], self._masks[key][2]
        keep, empty = allowed()
        mask = self.bias(q, scale).to(q.dtype)
        if keep is not None:
            mask = mask.masked_fill(~keep, float("-inf"))
        if cacheable:
            self._masks[key] = (attn_mask, mask, empty)
        return mask, empty

    def score_mod(self, q: torch.Tensor, scale: float) -> Callable[..., torch.Tensor]:
        """A FlexAttention ``score_mod``: the encoding's own (from indices), or one reading
        the materialised bias; the same function for every call when it depends on no ``q``."""
        enc = self._bias_encoding()
        if self._score_mod is not None:
            return self._score_mod
        score_mod = None
        if not enc.query_dependent:
            score_mod = enc.score_mod(self.q_positions, self.k_positions)
        if score_mod is None:  # no index formula: fall back to the materialised bias
            bias = self.bias(q.float(), scale)
            if bias.ndim == 4 and bias.shape[0] == 1:
                bias = bias[0]
            score_mod = _flexattn.bias_score_mod(bias.float())
        if not enc.query_dependent:
            self._score_mod = score_mod
        return score_mod


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
        q_positions, k_positions: as in :func:`posenc.attention`, resolved by
            :func:`posenc.positions.resolve_pair`.
        device: where the positions (and what is derived from them) live.

    Returns:
        A :class:`PreparedEncoding`, or None for no encoding (``None`` / ``"none"``; the
        positions are validated all the same).

    Shape:
        positions ``[q]`` / ``[k]`` or ``[b, q]`` / ``[b, k]``.

    Examples:
        >>> import torch, posenc
        >>> from posenc.attention import prepare_encoding
        >>> q, k, v = torch.randn(3, 2, 4, 6, 8).unbind(0)
        >>> prep = prepare_encoding("alibi", q_len=6, num_heads=4, head_dim=8)
        >>> out = posenc.attention(q, k, v, encoding=prep, causal=True)
        >>> torch.equal(out, posenc.attention(q, k, v, encoding=prep.encoding, causal=True))
        True
    """
    num_heads = check_int("num_heads", num_heads, min=1)
    head_dim = check_int("head_dim", head_dim, min=1)
    enc = _attention_encoding(encoding, num_heads=num_heads, head_dim=head_dim)
    if enc is None and q_positions is None and k_positions is None:
        return None  # nothing to resolve or check
    if isinstance(enc, BiasEncoding) and enc.num_heads != num_heads:
        raise PosEncError(
            f"encoding {enc.name!r} has num_heads={enc.num_heads}; it must equal the number "
            f"of query heads, {num_heads}"
        )
    qpos, kpos = _positions.resolve_pair(
        q_len, k_len, q_positions, k_positions, batch=batch, device=device
    )  # validated even when no encoding reads them
    return None if enc is None else PreparedEncoding(enc, qpos, kpos)
