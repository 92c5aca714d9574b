"""What the analysis measures on: an encoding (built with defaults), position ranges, and
the encoding's per-position vectors, read through each kind's public forward/bias only.

Every kind is reduced to the object its properties are stated about:

- additive: the table row ``PE(p)`` (``forward`` on zero embeddings), ``[n, d]``;
- rotary: the linear map ``R(p)`` applied to a query at position ``p`` (``forward`` on the
  identity basis), ``[n, d, d]``; it holds xPos scaling and partial rotary as they are;
- bias: the bias ``b[h, q, k]`` added to the scaled logits, and its profile against the
  distance ``q - k`` of a key behind its query, ``[h, m]``. Terms that depend on the tokens
  are measured in one fixed context (:data:`CONTEXTS`), one token per integer position, by
  the encoding's own protocol: a contextual encoding with every gate open (logits ``+inf``;
  CoPE then counts one position per token, ``p = q - k + 1``: the relative encoding it
  learns from), a gated one with every log forget gate ``log(1/2)`` (the gate of an
  initialised model on a zero input; forgetting attention then adds ``-(q - k) ln 2``,
  ALiBi's form);
- none: a zero table (it adds nothing).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch

from posenc import registry
from posenc._base import BiasEncoding, ContextualEncoding, Encoding, GatedEncoding
from posenc._errors import PosEncError, check_alloc, check_dtype, check_int
from posenc.attend.paths import allowed_pairs

__all__ = [
    "CONTEXTS",
    "DEFAULT_ARGS",
    "MAX_POSITIONS",
    "additive_table",
    "bias_matrix",
    "bias_profile",
    "check_count",
    "check_dtypes",
    "encoding_dim",
    "inv_freq",
    "resolve_encoding",
    "resolve_positions",
    "rotary_matrices",
    "size",
]

# Constructor arguments the analysis supplies when an encoding is given by name and the
# class requires them: a typical head (64 channels), 8 heads, tables covering 2048 positions,
# and M-RoPE's 32 frequencies split across (time, height, width) as Qwen2-VL splits its 64.
DEFAULT_ARGS: dict[str, Any] = {
    "dim": 64,
    "head_dim": 64,
    "num_heads": 8,
    "max_len": 2048,
    "npos_max": 2049,  # CoPE: max_len + 1 positions, as its paper
    "sections": (8, 12, 12),
}

# Seed of every random draw of the analysis (learned initialisations, random queries).
SEED = 0

# The most positions (or distances) one measurement takes: pairwise measures hold n x n
# values and rotary ones n x d x d, so 65 536 positions are already ~17 GB of similarity.
MAX_POSITIONS = 1 << 16


def check_count(name: str, value: object, *, min: int = 1) -> int:
    """A number of positions or distances: an integer in ``[min, MAX_POSITIONS]``."""
    return check_int(name, value, min=min, max=MAX_POSITIONS)


def check_dtypes(dtype: object, position_dtype: object = None) -> None:
    """``dtype`` (floating) and ``position_dtype`` (None, or a real dtype positions can be
    rounded to: floating or integer, never bool or complex)."""
    check_dtype("dtype", dtype)
    if position_dtype is not None:
        rounded = cast(torch.dtype, check_dtype("position_dtype", position_dtype, floating=False))
        if rounded == torch.bool or rounded.is_complex:
            raise PosEncError(
                f"position_dtype must be a floating or integer dtype, got {position_dtype}"
            )


def resolve_encoding(encoding: str | Mapping[str, Any] | Encoding, **kwargs: Any) -> Encoding:
    """An encoding module in eval mode: an instance as it is, or built from a registry name /
    config dict, with :data:`DEFAULT_ARGS` filling required arguments the caller left out.

    Learned parameters are initialised from a fixed seed, so results repeat.
    """
    if isinstance(encoding, Encoding):
        return registry.build(encoding, **kwargs).eval()
    cls = registry.class_of(encoding)  # PosEncError listing the names when unknown
    given = set(kwargs) | (set(encoding) - {"name"} if isinstance(encoding, Mapping) else set())
    _, required = registry.parameters(cls)
    missing = sorted(required - given)
    unknown = [p for p in missing if p not in DEFAULT_ARGS]
    if unknown:
        raise PosEncError(
            f"encoding {cls.name!r} needs the argument {unknown[0]!r}, which has no "
            f"analysis default (defaults exist for {', '.join(DEFAULT_ARGS)})"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        module = registry.build(encoding, defaults={p: DEFAULT_ARGS[p] for p in missing}, **kwargs)
    return module.eval()


#: The contexts in which biases of the tokens are measured (see the module docs).
CONTEXTS = {
    "contextual": "every gate open: each token counts one position, p = q - k + 1",
    "gated": "every forget gate sigmoid(0) = 1/2: a bias of -(q - k) ln 2",
}

#: The log forget gate of the gated context: ``log sigmoid(0) = log(1/2)``.
_GATE = math.log(0.5)


def size(encoding: Encoding, name: str) -> int:
    """An integer attribute of an encoding of the kind that defines it: ``dim`` (additive),
    ``head_dim`` (rotary, Shaw), ``num_heads`` (bias; 1 for CoPE's one shared table)."""
    value = getattr(encoding, name)
    return 1 if value is None and name == "num_heads" else int(value)


def inv_freq(encoding: Encoding) -> torch.Tensor:
    """A rotary encoding's frequencies ``[r/2]`` (its ``inv_freq`` contract attribute), float64."""
    return torch.as_tensor(cast(Any, encoding).inv_freq, dtype=torch.float64)


def encoding_dim(encoding: Encoding, dim: int | None = None) -> int:
    """Channels of the analysed vectors: ``dim`` (additive), ``head_dim`` (rotary),
    ``num_heads`` (bias); ``dim`` or the default for ``none``."""
    if encoding.kind == "additive":
        return size(encoding, "dim")
    if encoding.kind == "rotary":
        return size(encoding, "head_dim")
    if encoding.kind == "bias":
        return size(encoding, "num_heads")
    return check_int("dim", dim if dim is not None else DEFAULT_ARGS["dim"], min=1)


def resolve_positions(
    positions: int | Sequence[float] | torch.Tensor | None,
    default: tuple[int, int],
    *,
    name: str = "positions",
    min_len: int = 1,
    nonnegative: bool = False,
) -> torch.Tensor:
    """A 1-D position tensor from ``None`` (``default``), a count ``n`` (``0..n-1``; a Python
    or NumPy integer), a ``(start, stop)`` range (``start..stop-1``) or explicit positions
    (list or tensor).

    Integer ranges give int64, explicit float positions float64. Raises
    :class:`PosEncError` for empty or inverted ranges and for fewer than ``min_len``
    positions.
    """
    if positions is None:
        positions = default
    if isinstance(positions, torch.Tensor):
        if positions.ndim != 1 or positions.dtype == torch.bool or positions.is_complex():
            raise PosEncError(
                f"{name} must be a 1-D tensor of numbers, got shape {tuple(positions.shape)} "
                f"and dtype {positions.dtype}"
            )
        out = positions if not positions.is_floating_point() else positions.to(torch.float64)
    elif _is_integer(positions) or isinstance(positions, tuple):
        start, stop = (
            (0, positions) if _is_integer(positions) else _pair(name, cast(tuple, positions))
        )
        start, stop = check_int(f"{name} start", start), check_int(f"{name} stop", stop)
        if stop <= start:
            raise PosEncError(
                f"{name} must be a non-empty range with start < stop, got ({start}, {stop})"
            )
        if stop - start > MAX_POSITIONS:
            raise PosEncError(
                f"{name} must hold at most {MAX_POSITIONS} positions (MAX_POSITIONS), got "
                f"{stop - start}"
            )
        out = torch.arange(start, stop)
    elif isinstance(positions, list):
        try:
            out = torch.as_tensor(positions)
        except (TypeError, ValueError, RuntimeError) as e:
            raise PosEncError(f"{name} must be numbers, got {positions!r}") from e
        return resolve_positions(out, default, name=name, min_len=min_len, nonnegative=nonnegative)
    else:
        raise PosEncError(
            f"{name} must be a count, a (start, stop) pair or a 1-D tensor, got {positions!r}"
        )
    if out.device.type == "meta":
        raise PosEncError(f"{name} must hold values, got a tensor on the meta device")
    if out.numel() > MAX_POSITIONS:
        raise PosEncError(
            f"{name} must hold at most {MAX_POSITIONS} positions (MAX_POSITIONS), got {out.numel()}"
        )
    if out.numel() < min_len:
        raise PosEncError(f"{name} must hold at least {min_len} positions, got {out.numel()}")
    if out.is_floating_point() and not bool(torch.isfinite(out).all()):
        raise PosEncError(f"{name} must be finite, got a tensor containing NaN or inf")
    if nonnegative and bool((out < 0).any()):
        raise PosEncError(f"{name} must be >= 0, got minimum {out.min().item()}")
    return out


def _is_integer(value: Any) -> bool:
    """A Python or NumPy integer (a count), never a bool (``numpy.bool_`` is no Integral)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _pair(name: str, value: tuple) -> tuple[Any, Any]:
    if len(value) != 2:
        raise PosEncError(f"{name} must be a (start, stop) pair, got {value!r}")
    return value[0], value[1]


def _round_positions(positions: torch.Tensor, position_dtype: torch.dtype | None) -> torch.Tensor:
    """Positions as a model holding them in ``position_dtype`` would see them."""
    if position_dtype is None:
        return positions
    return positions.to(position_dtype).to(torch.float64)


@torch.no_grad()
def additive_table(
    encoding: Encoding,
    positions: torch.Tensor,
    *,
    dtype: torch.dtype = torch.float32,
    position_dtype: torch.dtype | None = None,
    dim: int | None = None,
) -> torch.Tensor:
    """``PE(p)`` of an additive (or ``none``) encoding: its output on zero embeddings held in
    ``dtype``, returned as float64 ``[n, d]``."""
    n = positions.shape[0]
    if encoding.kind == "none":
        return torch.zeros(n, encoding_dim(encoding, dim), dtype=torch.float64)
    x = torch.zeros(1, n, size(encoding, "dim"), dtype=dtype)  # [b=1, s, d]
    out = encoding(x, _round_positions(positions, position_dtype))
    return out[0].to(torch.float64)


@torch.no_grad()
def rotary_matrices(
    encoding: Encoding,
    positions: torch.Tensor,
    *,
    dtype: torch.dtype = torch.float32,
    position_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The maps ``R_q(p)``, ``R_k(p)`` a rotary encoding applies to a query / key at ``p``.

    Head ``j`` of the input holds the basis vector ``e_j`` at every position, so output head
    ``j`` is column ``j`` of the map. Multi-axis encodings (M-RoPE, axial) are measured along
    the diagonal ``(p, ..., p)``, the coordinates M-RoPE gives text tokens.
    Shape: ``[n]`` -> two float64 ``[n, d, d]``.
    """
    n, d = positions.shape[0], size(encoding, "head_dim")
    eye = torch.eye(d, dtype=dtype)  # [j, i]
    basis = eye[None, :, None, :].expand(1, d, n, d).contiguous()  # [b=1, h=j, s, i]
    pos = _round_positions(positions, position_dtype)
    sections = getattr(encoding, "sections", None)
    if sections is not None:
        pos = pos[:, None].expand(n, len(sections))  # [s, n_axes]
    q, k = encoding(basis, basis.clone(), pos)
    # [1, j, p, i] -> [p, i, j]: column j of R(p)
    return q[0].permute(1, 2, 0).to(torch.float64), k[0].permute(1, 2, 0).to(torch.float64)


def _random_queries(encoding: Encoding, q_len: int) -> torch.Tensor:
    """One fixed random query per head, repeated at every position and multiplied by the
    attention scale ``head_dim ** -0.5``: ``[1, h, q_len, head_dim]``."""
    head_dim, heads = size(encoding, "head_dim"), size(encoding, "num_heads")
    gen = torch.Generator().manual_seed(SEED)
    q = torch.randn(1, heads, 1, head_dim, generator=gen)
    return (q * head_dim**-0.5).expand(1, heads, q_len, head_dim)


@torch.no_grad()
def bias_matrix(
    encoding: Encoding, q_positions: torch.Tensor, k_positions: torch.Tensor | None = None
) -> torch.Tensor:
    """The bias ``[h, q, k]`` (float64) between the given query and key positions.

    Query-dependent biases (Shaw's relative keys) are evaluated for one fixed random query
    per head (see :func:`_random_queries`), the same at every position; contextual and
    gated terms in their :data:`CONTEXTS` context.
    """
    k_positions = q_positions if k_positions is None else k_positions
    if isinstance(encoding, (ContextualEncoding, GatedEncoding)):
        return _context_bias(encoding, q_positions, k_positions)
    q_len, k_len = q_positions.shape[0], k_positions.shape[0]
    kwargs: dict[str, Any] = {"q_positions": q_positions, "k_positions": k_positions}
    if isinstance(encoding, BiasEncoding) and encoding.query_dependent:
        kwargs["q"] = _random_queries(encoding, q_len)
    out = cast(BiasEncoding, encoding).bias(q_len, k_len, **kwargs)
    if out.ndim == 4:  # [b=1, h, q, k]
        out = out[0]
    return out.to(torch.float64)


def _tokens(encoding: Encoding, positions: torch.Tensor) -> torch.Tensor:
    """Positions as token indices (int64): a token-dependent term counts tokens."""
    if positions.is_floating_point():
        if not bool((positions == positions.round()).all()):
            raise PosEncError(
                f"positions must be whole numbers for encoding {encoding.name!r} (its term "
                "depends on the tokens: one token per position), got fractional positions"
            )
        positions = positions.round()
    return positions.to(torch.long)


def _context_bias(
    encoding: ContextualEncoding | GatedEncoding,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
) -> torch.Tensor:
    """A token-dependent term in its :data:`CONTEXTS` context, ``[h, q, k]`` float64.

    The tokens are one per integer position from the lowest position given to the
    highest; the queries are the last of them from the lowest query on (attention's
    rule: queries are the last keys), and the rows and columns asked for are read out.
    """
    qpos, kpos = _tokens(encoding, q_positions), _tokens(encoding, k_positions)
    lo = int(min(qpos.min(), kpos.min()))
    hi = int(max(qpos.max(), kpos.max()))
    first = int(qpos.min())
    k_len, q_len, heads = hi - lo + 1, hi - first + 1, size(encoding, "num_heads")
    check_alloc("positions", hi - lo, (heads, q_len, k_len), torch.float64)
    if isinstance(encoding, GatedEncoding):
        gates = encoding.check_gates(
            torch.full((1, heads, k_len), _GATE, dtype=torch.float64), 1, k_len, torch.device("cpu")
        )
        term = encoding.gate_bias_at(gates, q_len)  # [1, h, q, k]
    else:
        d = size(encoding, "head_dim")
        gen = torch.Generator().manual_seed(SEED)  # the queries of _random_queries, unscaled
        q = torch.randn(1, heads, 1, d, generator=gen).to(torch.float64)
        q = q.expand(1, heads, q_len, d)
        k = q.new_zeros(1, 1, 1, d).expand(1, heads, k_len, d)  # read through the logits
        logits = q.new_full((1, heads, q_len, k_len), math.inf)  # every gate open
        allowed, _ = allowed_pairs(None, True, q_len, k_len, q.device)
        term = encoding.contextual_bias_at(logits, q, k, allowed=allowed, scale=d**-0.5)
    rows, cols = qpos - first, kpos - lo
    return term[0][:, rows][:, :, cols].to(torch.float64)


def bias_profile(encoding: Encoding, distances: torch.Tensor) -> torch.Tensor:
    """The bias against a key ``distance`` positions behind its query: ``[h, m]`` float64.

    The query sits at position ``max(distances)`` and the keys at ``query - distance``,
    so every distance is seen from one query (what a decoding step sees).
    """
    query = int(distances.max())
    k_positions = query - distances.to(torch.long)
    bias = bias_matrix(encoding, torch.tensor([query]), k_positions)  # [h, 1, m]
    return bias[:, 0, :] + 0.0  # + 0.0 turns -0.0 (ALiBi at distance 0) into 0.0


def rms(x: torch.Tensor) -> float:
    """Root mean square row norm of ``x`` ``[n, D]`` (0 for an all-zero ``x``)."""
    return math.sqrt(float((x * x).sum(-1).mean())) if x.numel() else 0.0
