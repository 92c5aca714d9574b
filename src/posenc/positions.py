"""Position tensors: the one way posenc is told where tokens are.

Every encoding takes explicit positions. Packing, padding, KV caches and N-D inputs
are all expressed here as position tensors, never as hidden state:

>>> import torch, posenc
>>> posenc.positions.arange(4, offset=10)
tensor([10, 11, 12, 13])
>>> posenc.positions.from_seq_lens([3, 2])
tensor([0, 1, 2, 0, 1])
>>> posenc.positions.from_attention_mask(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]))
tensor([[0, 0, 0, 1],
        [0, 1, 2, 3]])
>>> posenc.positions.grid((2, 3)).shape
torch.Size([2, 3, 2])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from posenc._errors import (
    PosEncError,
    check_alloc,
    check_device,
    check_dtype,
    check_int,
    check_positions,
    check_tensor,
    check_traced,
    tracing,
)

__all__ = [
    "MAX_DISTANCE",
    "arange",
    "as_tensor",
    "check_distances",
    "from_attention_mask",
    "from_cu_seqlens",
    "from_seq_lens",
    "grid",
    "randomized",
    "resolve",
    "resolve_pair",
]


def arange(
    seq_len: int,
    offset: int = 0,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.long,
) -> torch.Tensor:
    """Positions ``offset, offset + 1, ..., offset + seq_len - 1``: ``[seq_len]``."""
    seq_len = check_int("seq_len", seq_len, min=0)
    offset = check_int("offset", offset)
    device = check_device("device", device)
    check_dtype("dtype", dtype, floating=False)
    if dtype == torch.bool or dtype.is_complex:
        raise PosEncError(f"dtype must be an integer or floating dtype, got {dtype}")
    if not _symbolic(seq_len, offset) and offset + seq_len > _INT64_MAX + 1:
        raise PosEncError(
            f"offset + seq_len must be <= 2**63 (positions are int64), got offset={offset} "
            f"and seq_len={seq_len}"
        )
    check_alloc("seq_len", seq_len, (seq_len,), dtype, device)
    return torch.arange(offset, offset + seq_len, device=device, dtype=dtype)


_INT64_MAX = (1 << 63) - 1


def _symbolic(*values: object) -> bool:
    return tracing() or any(not isinstance(v, int) for v in values)


def as_tensor(
    positions: torch.Tensor | Sequence[float],
    *,
    device: torch.device | str | None = None,
    name: str = "positions",
) -> torch.Tensor:
    """Positions of any shape, from a tensor or a (nested) sequence of numbers, validated:
    integer or floating, finite. Moved to ``device`` when given.

    Shape: ``[*P]`` -> ``[*P]``.

    >>> as_tensor([0, 1.5])
    tensor([0.0000, 1.5000])
    """
    device = check_device("device", device)
    if not isinstance(positions, torch.Tensor):
        if isinstance(positions, (str, bytes, dict, set, frozenset)):
            raise PosEncError(
                f"{name} must be a tensor or a sequence of numbers, got {positions!r}"
            )
        try:
            positions = torch.as_tensor(positions)
        except (TypeError, ValueError, RuntimeError) as e:
            raise PosEncError(f"{name} must be a tensor of numbers, got {positions!r}") from e
    check_positions(name, positions, ndims=None)
    return positions if device is None else positions.to(device)


def _lengths(name: str, values: Sequence[int] | torch.Tensor) -> torch.Tensor:
    if not isinstance(values, (torch.Tensor, list, tuple)):
        raise PosEncError(
            f"{name} must be a 1-D sequence of integers (a list, tuple or tensor), got {values!r}"
        )
    if isinstance(values, torch.Tensor) and values.device.type == "meta":
        raise PosEncError(f"{name} must hold values, got a tensor on the meta device")
    if not isinstance(values, torch.Tensor) and any(isinstance(v, bool) for v in values):
        raise PosEncError(f"{name} must be a 1-D sequence of integers, got {values!r}")
    try:
        t = values if isinstance(values, torch.Tensor) else torch.as_tensor(list(values))
    except (TypeError, ValueError, RuntimeError) as e:
        raise PosEncError(f"{name} must be a 1-D sequence of integers, got {values!r}") from e
    if t.ndim != 1 or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise PosEncError(f"{name} must be a 1-D sequence of integers, got {values!r}")
    return t.to(torch.long)


def from_seq_lens(seq_lens: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Positions of packed sequences that restart at 0 for each sequence.

    ``seq_lens`` are the lengths of the sequences laid end to end.
    Shape: ``[n]`` lengths -> ``[sum(seq_lens)]``.
    """
    lens = _lengths("seq_lens", seq_lens)
    if lens.numel() and bool((lens < 0).any()):
        raise PosEncError(f"seq_lens must be >= 0, got {lens.tolist()}")
    total = sum(lens.tolist())  # exact: a sum of int64 lengths may wrap
    check_alloc("sum(seq_lens)", total, (total,), torch.long, lens.device)
    starts = torch.cumsum(lens, 0) - lens  # [n] start offset of each sequence
    return torch.arange(total, device=lens.device) - torch.repeat_interleave(starts, lens)


def from_cu_seqlens(cu_seqlens: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Positions of packed sequences given cumulative lengths (flash-attention's ``cu_seqlens``).

    ``cu_seqlens = [0, l0, l0 + l1, ...]`` must start at 0 and not decrease.
    Shape: ``[n + 1]`` -> ``[cu_seqlens[-1]]``.
    """
    cu = _lengths("cu_seqlens", cu_seqlens)
    if cu.numel() == 0 or int(cu[0]) != 0:
        raise PosEncError(f"cu_seqlens must start with 0, got {cu.tolist()}")
    lens = cu[1:] - cu[:-1]
    if bool((lens < 0).any()):
        raise PosEncError(f"cu_seqlens must be non-decreasing, got {cu.tolist()}")
    return from_seq_lens(lens)


def from_attention_mask(mask: torch.Tensor) -> torch.Tensor:
    """Positions for left- (or right-) padded batches: the first real token gets 0.

    ``mask`` is 1 (or True) for real tokens and 0 for padding. Padding slots get
    position 0 (they are masked out of attention, and 0 is valid for every table).
    Shape: ``[b, s]`` -> ``[b, s]`` (int64).
    """
    check_tensor("mask", mask)
    if mask.device.type == "meta":
        raise PosEncError("mask must hold values, got a tensor on the meta device")
    if mask.is_complex():
        raise PosEncError(f"mask must be a boolean, integer or floating tensor, got {mask.dtype}")
    if mask.ndim != 2:
        raise PosEncError(f"mask must be [b, s], got shape {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        binary = (mask == 0) | (mask == 1)
        if tracing():  # torch.compile / export: the rule as a graph assertion
            check_traced(binary, "mask must hold only 0 and 1 (or booleans)")
        elif not bool(binary.all()):
            raise PosEncError("mask must hold only 0 and 1 (or booleans)")
    m = mask.to(torch.long)
    return ((torch.cumsum(m, dim=-1) - 1) * m).clamp_min(0)


def grid(shape: Sequence[int], *, device: torch.device | str | None = None) -> torch.Tensor:
    """Integer coordinates of an N-D grid, axis 0 first.

    Shape: ``shape = (n_0, ..., n_{k-1})`` -> ``[n_0, ..., n_{k-1}, k]``;
    ``grid((H, W))[i, j] == [i, j]``. Flatten with ``.reshape(-1, k)`` for a token sequence.
    """
    return grid_of(shape, device=device)


def grid_of(
    shape: Sequence[int], *, device: torch.device | str | None = None, name: str = "shape"
) -> torch.Tensor:
    """:func:`grid`, naming its sizes ``name`` in errors (``sinusoidal_table_nd``'s ``grid``)."""
    if not isinstance(shape, (list, tuple)) or len(shape) == 0:
        raise PosEncError(
            f"{name} must be a non-empty sequence of sizes (a list or tuple), got {shape!r}"
        )
    sizes = [check_int(f"{name}[{i}]", n, min=1) for i, n in enumerate(shape)]
    device = check_device("device", device)
    numel = 1
    for n in sizes:
        numel *= n
    check_alloc(name, tuple(shape), (numel, len(sizes)), torch.long, device)
    axes = [torch.arange(n, device=device) for n in sizes]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)


def randomized(
    seq_len: int,
    max_len: int,
    *,
    batch_size: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Randomized positions (Ruoss et al., 2023): ``seq_len`` distinct sorted positions
    drawn uniformly from ``[0, max_len)``, one independent draw per batch row.

    Training on these exposes a model to positions up to ``max_len`` while keeping
    the order of tokens. Shape: ``[seq_len]`` or ``[batch_size, seq_len]``.
    """
    seq_len = check_int("seq_len", seq_len, min=0)
    max_len = check_int("max_len", max_len, min=1)
    if max_len < seq_len:
        raise PosEncError(f"max_len must be >= seq_len ({seq_len}), got {max_len}")
    rows = 1 if batch_size is None else check_int("batch_size", batch_size, min=1)
    device = check_device("device", device)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise PosEncError(f"generator must be a torch.Generator, got {generator!r}")
    check_alloc("batch_size, max_len", (rows, max_len), (rows, max_len), torch.float32, device)
    # argsort of uniform noise gives a uniformly random subset; sort restores order.
    noise = torch.rand(rows, max_len, generator=generator, device=device)
    picked = noise.argsort(dim=-1)[:, :seq_len].sort(dim=-1).values
    return picked[0] if batch_size is None else picked


def resolve(
    positions: torch.Tensor | None,
    seq_len: int,
    *,
    offset: int = 0,
    batch: int | None = None,
    device: torch.device | str | None = None,
    name: str = "positions",
) -> torch.Tensor:
    """The positions a module uses: validated ``positions`` moved to ``device`` (when given)
    and shifted by ``offset``, or ``arange(seq_len) + offset``. ``batch``: the batch size
    ``[b, s]`` positions must have (or 1); None: any. Shape: ``[s]`` or ``[b, s]``.
    """
    offset = check_int("offset", offset)
    seq_len = check_int("seq_len", seq_len, min=0)
    device = check_device("device", device)
    if batch is not None:
        batch = check_int("batch", batch, min=1)
    if positions is None:
        return arange(seq_len, offset, device=device)
    check_positions(name, positions, seq_len=seq_len, batch=batch, length="seq_len")
    if device is not None:
        positions = positions.to(device)
    if offset:
        positions = add_offset(name, positions, offset)
    return positions


def add_offset(name: str, positions: torch.Tensor, offset: int) -> torch.Tensor:
    """``positions + offset``, refused where it would leave int64 (and wrap around).

    Integer positions are added in int64. The values are read (one host sync) on the CPU,
    and elsewhere only for an offset of magnitude >= 2**62; never while tracing."""
    if positions.is_floating_point():
        return positions + offset
    if positions.dtype != torch.long:
        positions = positions.long()
    if tracing() or positions.numel() == 0:
        return positions + offset
    if positions.device.type == "cpu" or abs(offset) >= (1 << 62):
        low, high = int(positions.min()), int(positions.max())
        if high + offset > _INT64_MAX or low + offset < -_INT64_MAX - 1:
            raise PosEncError(
                f"offset={offset} moves {name} out of int64 (values {low}..{high}): "
                f"positions + offset must stay within [-2**63, 2**63)"
            )
    return positions + offset


def resolve_pair(
    q_len: int,
    k_len: int | None = None,
    q_positions: torch.Tensor | None = None,
    k_positions: torch.Tensor | None = None,
    *,
    batch: int | None = None,
    device: torch.device | str | None = None,
    coords: int | None = None,
    names: tuple[str, str] = ("q_positions", "k_positions"),
) -> tuple[torch.Tensor, torch.Tensor]:
    """The query and key positions of an attention call: the one rule every encoding follows
    (the rule, and its defaults for decoding and cross-attention: ``docs/attention.md``).

    Args:
        q_len, k_len: numbers of queries and keys (``k_len`` defaults to ``q_len``).
        q_positions, k_positions: ``[s]`` or ``[b, s]``, or None: keys ``arange(k_len)``,
            queries the last ``q_len`` of them (``arange(q_len)`` when ``q_len > k_len``).
        batch: the batch size (``>= 1``) ``[b, s]`` positions must have (or 1); None: any.
        device: where the result lives (None: where the given positions are; the CPU).
        coords: N-D positions (M-RoPE, axial RoPE): ``[s, coords]`` or ``[b, s, coords]``.
        names: the names of the two position arguments in error messages.

    Raises:
        PosEncError: a length, a shape or a batch size that does not match, naming it.

    Examples:
        >>> resolve_pair(2, 5)  # decoding: queries at the end
        (tensor([3, 4]), tensor([0, 1, 2, 3, 4]))
    """
    q_len = check_int("q_len", q_len, min=1)
    k_given = k_len is not None
    k_len = check_int("k_len", k_len, min=1) if k_given else q_len
    if batch is not None:
        batch = check_int("batch", batch, min=1)
    if coords is not None:
        coords = check_int("coords", coords, min=1)
    device = check_device("device", device)
    return resolve_pair_at(
        q_len, k_len, q_positions, k_positions, batch, device, coords, names, k_given, False
    )


def resolve_pair_at(
    q_len: int,
    k_len: int,
    q_positions: torch.Tensor | None,
    k_positions: torch.Tensor | None,
    batch: int | None,
    device: torch.device | None,
    coords: int | None,
    names: tuple[str, str] = ("q_positions", "k_positions"),
    k_given: bool = True,
    sized: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`resolve_pair` with its sizes and device already checked (``sized``: read off
    tensors a caller has validated, as :func:`posenc.attention` does): the positions given
    are validated, the defaults made, by the same rule."""
    q_name, k_name = names
    default = names == ("q_positions", "k_positions")
    q_length = "q_len" if default else None
    k_length = "k_len" if default else None
    if k_positions is not None:
        if q_positions is k_positions and q_len == k_len:  # one tensor: checked once, by
            # the name of the queries (a rotary module passes its one ``positions`` as both)
            kpos = _check_sequence(q_name, k_positions, k_len, batch, coords, q_length)
            kpos = kpos.to(device)
            return kpos, kpos
        kpos = _check_sequence(k_name, k_positions, k_len, batch, coords, k_length).to(device)
    else:
        kpos = _default("k_len" if k_given else "q_len", k_len, coords, device, sized=sized)
    if q_positions is not None:
        qpos = _check_sequence(q_name, q_positions, q_len, batch, coords, q_length).to(device)
    elif q_len == k_len:
        qpos = kpos
    elif q_len < k_len:
        qpos = kpos.narrow(-1 if coords is None else -2, k_len - q_len, q_len)
    else:
        qpos = _default("q_len", q_len, coords, device, sized=sized)
    lead = 2 if coords is None else 3  # rank of batched positions
    if qpos.ndim == kpos.ndim == lead and 1 not in (qpos.shape[0], kpos.shape[0]):
        if qpos.shape[0] != kpos.shape[0]:
            raise PosEncError(
                f"{q_name} and {k_name} must have the same batch size (or 1), got shapes "
                f"{tuple(qpos.shape)} and {tuple(kpos.shape)}"
            )
    return qpos, kpos


def _default(name: str, seq_len: int, coords: int | None, device, *, sized=False) -> torch.Tensor:
    """``arange(seq_len)`` of a checked length and device (``[s]``; ``[s, coords]``, every
    coordinate the same), its size checked under the name of the length the caller passed
    (``sized``: a length read off a tensor that exists, not checked again)."""
    if not sized:
        check_alloc(name, seq_len, (seq_len,), torch.long, device)
    p = torch.arange(seq_len, device=device)  # [s]
    return p if coords is None else p[:, None].expand(seq_len, coords)  # [s, coords]


def _check_sequence(
    name: str,
    p: torch.Tensor,
    seq_len: int,
    batch: int | None,
    coords: int | None,
    length: str | None = None,
) -> torch.Tensor:
    """Validate ``[s] | [b, s]`` positions (``coords``: ``[s, c] | [b, s, c]``)."""
    if coords is None:
        return check_positions(name, p, seq_len=seq_len, batch=batch, length=length)
    check_positions(name, p, ndims=None)  # a tensor of finite numbers; the shape below
    if p.ndim not in (2, 3) or p.shape[-1] != coords or p.shape[-2] != seq_len:
        raise PosEncError(
            f"{name} must be [s, {coords}] or [b, s, {coords}] (one coordinate per axis) "
            f"with s == {seq_len}, got shape {tuple(p.shape)}"
            + ("" if length is None else f" (s is {length}={seq_len})")
        )
    if batch is not None and p.ndim == 3 and p.shape[0] not in (1, batch):
        raise PosEncError(
            f"{name} of shape [b, s, {coords}] must have b == {batch} (the batch size) or 1, "
            f"got shape {tuple(p.shape)}"
        )
    return p


#: The largest ``|k - q|`` a bias of positions takes: its distances are formed exactly
#: (int64 / float64) and rounded to float32; int64 holds them below ``2**63``.
MAX_DISTANCE = 1 << 63


def check_distances(
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    *,
    names: tuple[str, str] = ("q_positions", "k_positions"),
) -> None:
    """Raise unless every distance ``k - q`` between validated query and key positions (all
    rows) is below :data:`MAX_DISTANCE` in magnitude: the biases of positions' rule (why:
    ``docs/attention.md``). One host synchronisation; a graph assertion under compile."""
    if q_positions.numel() == 0 or k_positions.numel() == 0:
        return
    floating = q_positions.is_floating_point() or k_positions.is_floating_point()
    dtype = torch.float64 if floating else torch.long
    qr = torch.stack(torch.aminmax(q_positions.detach().to(dtype)))  # [min, max]
    kr = torch.stack(torch.aminmax(k_positions.detach().to(dtype).to(qr.device)))
    if tracing():
        span = torch.maximum(kr[1].double() - qr[0].double(), qr[1].double() - kr[0].double())
        check_traced(
            span < float(MAX_DISTANCE),
            f"{names[0]} and {names[1]} must be less than 2**63 apart",
        )
        return
    q_lo, q_hi, k_lo, k_hi = torch.cat([qr, kr]).tolist()
    span = max(k_hi - q_lo, q_hi - k_lo)  # exact for int64: Python integers
    if not span < MAX_DISTANCE:
        raise PosEncError(
            f"{names[0]} and {names[1]} must be less than 2**63 apart (a bias forms k - q "
            f"exactly, then in float32), got {names[0]} in [{q_lo}, {q_hi}] and "
            f"{names[1]} in [{k_lo}, {k_hi}]"
        )


def causal_pairs(
    q_len: int,
    k_len: int,
    *,
    rows: tuple[int, int] | None = None,
    device: Any = None,
    at: tuple[torch.Tensor, torch.Tensor] | None = None,
    keys: tuple[int, int] | None = None,
    additive: torch.dtype | None = None,
    counts: bool = False,
) -> torch.Tensor:
    """The causal rule, the one place it is written: bool ``[rows, k]``, True where query
    ``i`` may attend key ``j``, i.e. ``j <= i + (k_len - q_len)`` (the queries are the last
    ``q_len`` keys). ``rows = (start, stop)``: those query rows only; ``at = (i, j)``: at
    those pairs only; ``additive`` (a floating dtype): SDPA's additive mask (0 or ``-inf``)
    over the key columns ``keys = (lo, hi)``; ``counts=True``: the keys each row sees, int64
    ``[rows]``. Internal, no validation (``docs/attention.md`` has the rule and its forms)."""
    if at is not None:
        return at[1] <= at[0] + (k_len - q_len)
    start, stop = (0, q_len) if rows is None else rows
    if counts:  # keys 0 .. i + (k_len - q_len) of row i
        return (torch.arange(start, stop, device=device) + (k_len - q_len + 1)).clamp_(0, k_len)
    if additive is not None:
        lo, hi = (0, k_len) if keys is None else keys
        # row r (query start + r) sees column c (key lo + c) iff c <= r + seen
        seen = start - lo + (k_len - q_len)
        hidden = torch.full((stop - start, hi - lo), float("-inf"), dtype=additive, device=device)
        return hidden.triu_(seen + 1)
    i = torch.arange(start, stop, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    return j <= i + (k_len - q_len)  # [rows, k]
