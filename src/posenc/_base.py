"""Base classes shared by every encoding module: kind, name and config round trip.

Each encoding is one of three kinds (plus ``none``), and the kind decides where it
plugs into a transformer:

- ``additive``: ``forward(x, positions=None, *, offset=0) -> x + PE`` on embeddings ``[b, s, d]``;
- ``rotary``: ``forward(q, k, positions=None, *, k_positions=None, seq_dim=-2) -> (q, k)``;
- ``bias``: a term added to the scaled attention logits. Three protocols say how attention
  gets it: :class:`BiasEncoding` from positions alone (``bias(q_len, k_len=None, *,
  q_positions=None, k_positions=None) -> [h, q, k]``, or ``[b, h, q, k]`` when positions are
  batched); :class:`ContextualEncoding` from the logits, queries and keys (CoPE);
  :class:`GatedEncoding` from per-token gates the model computes (forgetting attention).

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
from posenc._errors import PosEncError, check_embeddings, describe

__all__ = [
    "LOGIT_PROTOCOLS",
    "AdditiveEncoding",
    "BiasEncoding",
    "ContextualEncoding",
    "Encoding",
    "GatedEncoding",
    "Kind",
    "PositionMap",
    "RotaryEncoding",
]

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
    dim: int

    def _embeddings_positions(
        self, x: torch.Tensor, positions: torch.Tensor | None, offset: int
    ) -> torch.Tensor:
        """The positions of ``forward(x, positions, offset=...)``, resolved once
        (:func:`posenc.positions.resolve`: ``arange(s) + offset`` when None) on ``x``'s
        device, after ``x`` is checked to be embeddings ``[b, s, dim]``."""
        check_embeddings(x, self.dim)
        return _positions.resolve(
            positions, x.shape[1], offset=offset, batch=x.shape[0], device=x.device
        )


class RotaryEncoding(Encoding):
    """An encoding that rotates queries and keys inside attention.

    The protocol attention relies on (:mod:`posenc.attend` calls nothing else):

    - :attr:`position_coords`: ``None`` when a position is one number (``[s]`` / ``[b, s]``),
      ``n`` when it is ``n`` coordinates (``[s, n]`` / ``[b, s, n]``: M-RoPE, axial RoPE);
      :func:`posenc.positions.resolve_pair` takes it as ``coords``.
    - :meth:`rotation_at`: the rotation (cos/sin, or whatever the member needs) of positions
      already resolved by :func:`posenc.positions.resolve_pair`: no validation, no defaults;
      ``k_positions is q_positions`` means the queries and keys are the same tokens.
    - :meth:`rotate`: apply a rotation to ``q`` and ``k``; :meth:`rotate_at` the same for a
      rotation :meth:`rotation_at` made for them (attention's call: the rotation trusted).

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

    def rotate_at(
        self, q: torch.Tensor, k: torch.Tensor, rotation: Any, *, seq_dim: int = -2
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`rotate` where the caller made ``rotation`` with this module's
        :meth:`rotation_at` for these ``q`` and ``k`` and has checked them as
        :func:`posenc.attention` does (floating ``[b, h, s, d]`` tensors of one dtype and
        device): the rotation is trusted. Here :meth:`rotate` itself; members skip what
        they need not check again."""
        return self.rotate(q, k, rotation, seq_dim=seq_dim)


class BiasEncoding(Encoding):
    """An encoding that adds a bias of positions to the attention logits.

    The protocol attention relies on (:mod:`posenc.attend` calls nothing else):
    ``num_heads``; :meth:`bias_at` on positions already resolved by
    :func:`posenc.positions.resolve_pair`; :meth:`score_mod_at` (optional: a FlexAttention
    ``score_mod`` from indices); and :meth:`value_bias_at` for value-dependent encodings.
    Encodings whose bias depends on the queries (Shaw et al.'s relative keys) set
    ``query_dependent = True`` and take ``q`` (already multiplied by the attention scale);
    those that also act on the values set ``value_dependent = True``. A term that depends
    on the tokens themselves is another protocol: :class:`ContextualEncoding` (from the
    logits, queries and keys) or :class:`GatedEncoding` (from per-token gates).

    The public :meth:`bias` / :meth:`value_bias` resolve and validate the positions once,
    then call the ``*_at`` methods; families override them where they validate more (or
    on another device). Calling the module, ``enc(q_len, ...)``, is :meth:`bias` (its
    :meth:`forward`): every logit encoding's call returns its term.
    """

    kind: ClassVar[Kind] = "bias"
    query_dependent: ClassVar[bool] = False
    #: An instance may set it (Shaw's relative values are an option of the module).
    value_dependent: bool = False
    num_heads: int

    def bias(
        self,
        q_len: int,
        k_len: int | None = None,
        *,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The bias ``[h, q, k]`` (``[b, h, q, k]`` for batched positions) of ``q_len``
        queries and ``k_len`` keys, positions resolved by :func:`posenc.positions.resolve_pair`
        (keys default to ``arange(k_len)``, queries to the last ``q_len`` of them; given
        positions move to the module's device); query-dependent encodings add a keyword
        ``q``."""
        return self.bias_at(*self._resolve(q_len, k_len, q_positions, k_positions))

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``module(q_len, k_len=None, *, q_positions=None, k_positions=None)``:
        :meth:`bias`, with the same arguments (query-dependent encodings add ``q``)."""
        q_len = args[0] if args else kwargs.get("q_len")
        if isinstance(q_len, torch.Tensor) and q_len.ndim:  # called like attention, with q
            q = ", q=q * scale" if self.query_dependent else ""
            raise PosEncError(
                f"q_len must be an integer (the number of queries), got {describe(q_len)}: "
                f"{type(self).__name__} is called as module(q_len, k_len=None, *, "
                f"q_positions=None, k_positions=None{q}) and returns the bias [h, q, k]; to "
                "attend with q, k and v, use posenc.attention(q, k, v, encoding=module)"
            )
        return self.bias(*args, **kwargs)

    def _resolve(
        self,
        q_len: int,
        k_len: int | None,
        q_positions: torch.Tensor | None,
        k_positions: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The positions a :meth:`bias` call means (:func:`posenc.positions.resolve_pair`);
        a family overrides it to put them on its device and check the bias's size."""
        return _positions.resolve_pair(q_len, k_len, q_positions, k_positions)

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

    @property
    def has_score_mod(self) -> bool:
        """Whether the encoding computes its bias from indices (a Flex ``score_mod``)."""
        cls = type(self)
        return (
            cls.score_mod is not BiasEncoding.score_mod
            or cls.score_mod_at is not BiasEncoding.score_mod_at
        )


class ContextualEncoding(Encoding):
    """An encoding whose logit term is computed from the logits, queries and keys
    themselves (CoPE: positions counted by gates on ``q . k``), not from positions.

    The protocol attention relies on (:mod:`posenc.attend` calls nothing else):
    ``num_heads`` (None when any number of heads is served), :meth:`contextual_bias_at`
    and :meth:`fused_attention_at`. Attention computes the term on its eager path, or the
    query-chunked one for long sequences (SDPA and Flex take no term of the logits), or
    runs the member's own fused attention where it has one for the call (CoPE's on the
    CPU); the positions attention is given are not read.

    Calling the module returns its term: a member's :meth:`forward` takes what its pure
    function takes (CoPE: ``cope(q, k)`` is ``cope_bias`` with its table); one that defines
    none raises :class:`~posenc.PosEncError` saying so.
    """

    kind: ClassVar[Kind] = "bias"
    num_heads: int | None

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The term of ``q`` and ``k`` (a member's own); here: refused by name."""
        raise _no_forward(self, "its term from q and k")

    def contextual_bias_at(
        self,
        logits: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        allowed: torch.Tensor | None,
        scale: float,
    ) -> torch.Tensor:
        """The term ``[b, h, q, k]`` added to ``logits = q k^T * scale`` (``[b, h, q, k]``,
        float32 or wider), from ``q [b, h, q, d]``, ``k [b, h, k, d]`` (key heads repeated
        to ``h``) and ``allowed`` (bool ``[.., q, k]``, the pairs that may attend; None:
        all). A block of query rows is passed as its own ``q`` and ``logits``."""
        raise NotImplementedError

    def counted_table(self) -> tuple[torch.Tensor, bool] | None:
        """``(table, scaled)`` when the term has CoPE's counted form, which attention may
        then compute without :meth:`contextual_bias_at` (its fused CPU path,
        :mod:`posenc.contextual.cope_fused`): gates ``sigmoid(logits)`` on the allowed pairs,
        positions ``p_ij = sum_{t >= j} g_it`` clamped to ``table.shape[0] - 1``, and the
        term ``z_ij = q_i . table[p_ij]`` interpolated between ``floor p`` and ``floor p +
        1`` (times ``scale`` when ``scaled``); ``table`` is ``[npos, d]``, shared by the
        heads. None (here): attention always calls :meth:`contextual_bias_at`."""
        return None

    def fused_attention_at(self, q: torch.Tensor, dropout_p: float) -> Any:
        """The member's own fused attention for a call with queries ``q``, or None (here):
        attention computes the term with :meth:`contextual_bias_at`. A callable
        ``run(q, k, v, keep, *, causal, scale) -> [b, h, q, d_v]`` takes what
        :func:`posenc.attention` has validated (``keep``: the bool mask ``[b|1, h|1, q|1,
        k]`` or None) and returns the attention's output (CoPE's fused CPU kernel,
        :mod:`posenc.contextual.cope_fused`)."""
        return None


class GatedEncoding(Encoding):
    """An encoding whose logit term comes from per-token gates the model computes
    (forgetting attention: log forget gates summed between key and query).

    The protocol attention relies on (:mod:`posenc.attend` calls nothing else):
    ``num_heads``, :meth:`check_gates` (the ``gates`` passed to :func:`posenc.attention`),
    :meth:`gate_bias_at` and :meth:`gate_score_mod_at`, and for a ``separable`` member
    (a term ``c_i - c_j``) :meth:`gate_cumulative`. A model gives each layer that
    uses a gated encoding a projection ``dim -> num_heads`` whose output it passes as
    ``gates``. Gated encodings are causal only; the positions attention is given are not
    read.

    Calling the module returns its term: a member's :meth:`forward` takes the gates (FoX:
    ``fox(gates, q_len)`` is ``fox_bias``); one that defines none raises
    :class:`~posenc.PosEncError` saying so.
    """

    kind: ClassVar[Kind] = "bias"
    num_heads: int
    #: Whether the term is ``c_i - c_j`` of :meth:`gate_cumulative`'s ``c``: SDPA then
    #: folds it into the keys (:mod:`posenc.attend.folded`) instead of materialising it.
    separable: ClassVar[bool] = False

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The term of the gates (a member's own); here: refused by name."""
        raise _no_forward(self, "its term from the gates")

    def check_gates(self, gates: Any, b: int, k_len: int, device: torch.device) -> torch.Tensor:
        """``gates`` checked to be ``[b, num_heads, k_len]`` floating on ``device``; raises
        :class:`~posenc.PosEncError` otherwise."""
        raise NotImplementedError

    def gate_bias_at(
        self, gates: torch.Tensor, q_len: int, *, start: int = 0, stop: int | None = None
    ) -> torch.Tensor:
        """The term ``[b, h, rows, k]`` of checked ``gates [b, h, k]`` for query rows
        ``start:stop`` (default all ``q_len``; the queries are the last ``q_len`` keys),
        with no mask: attention masks the pairs its mask rule forbids."""
        raise NotImplementedError

    def gate_score_mod_at(self, gates: torch.Tensor, q_len: int) -> Callable[..., torch.Tensor]:
        """:meth:`gate_bias_at` as a FlexAttention ``score_mod(score, b, h, q_idx, kv_idx)``."""
        raise NotImplementedError

    def gate_cumulative(self, gates: torch.Tensor) -> torch.Tensor:
        """A separable member's ``c`` (float64 ``[b, h, k]``, differentiable in the gates):
        its term is ``c_i - c_j`` (the queries are the last keys)."""
        raise NotImplementedError


def _no_forward(enc: Encoding, what: str) -> PosEncError:
    return PosEncError(
        f"{type(enc).__name__} defines no forward ({what}): pass it to "
        "posenc.attention(q, k, v, encoding=module, ...), which calls its protocol"
    )


#: The protocols of encodings that add a term to the attention logits (kind ``"bias"``):
#: attention prepares each with the queries' and keys' positions.
LOGIT_PROTOCOLS = (BiasEncoding, ContextualEncoding, GatedEncoding)


class PositionMap:
    """Where a rotary attention rotates each (query, key) pair: a position map (Self-Extend,
    STRING; :mod:`posenc.remap`). Not an encoding: it remaps the positions a rotary encoding
    is given, per pair, inside attention.

    A pair of query position ``i`` and key position ``j <= i`` has the offset ``i - j``;
    :meth:`branch_at` says which of the ``branches`` it falls in, and in branch ``b`` the
    query is rotated at ``query_positions_at(b, i)`` and the key at
    ``key_positions_at(b, j)``. Every pair is in exactly one branch; attention takes one
    softmax over every visible key of a query. Members are frozen dataclasses of ints,
    validated when built; the ``*_at`` methods trust their tensors.
    """

    kind: ClassVar[str] = "position_map"
    #: How many branches the offsets fall in.
    branches: ClassVar[int]

    def branch_at(self, offsets: torch.Tensor) -> torch.Tensor:
        """The branch (int64, same shape) of each offset ``i - j`` (int64; the offsets of
        pairs attention hides may be anything)."""
        raise NotImplementedError

    def query_positions_at(self, branch: int, positions: torch.Tensor) -> torch.Tensor:
        """The positions ``[s]`` (int64, or float64 where the map gives fractions) at which
        queries at int64 ``positions [s]`` are rotated in ``branch``; the tensor itself
        when the branch keeps them."""
        raise NotImplementedError

    def key_positions_at(self, branch: int, positions: torch.Tensor) -> torch.Tensor:
        """:meth:`query_positions_at` for keys."""
        raise NotImplementedError

    def offset_bounds(self, branch: int) -> tuple[int, int | None]:
        """The offsets of ``branch``: exactly those with ``lo <= d <= hi`` (``hi`` None: no
        bound), as :meth:`branch_at` says; attention reads only the keys they reach."""
        raise NotImplementedError

    def check_trained(self, trained: int) -> None:
        """Raise :class:`~posenc.PosEncError` when the map does not fit a model trained on
        ``trained`` positions (a window larger than it)."""
        raise NotImplementedError

    def to_config(self) -> dict[str, Any]:
        """A JSON-serialisable dict, ``{"type": ..., **fields}``; ``posenc.position_map``
        of it builds an equal map."""
        raise NotImplementedError
