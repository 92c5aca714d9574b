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

import torch

from posenc._errors import PosEncError, check_int, check_positions, check_tensor

__all__ = [
    "arange",
    "as_tensor",
    "from_attention_mask",
    "from_cu_seqlens",
    "from_seq_lens",
    "grid",
    "randomized",
    "resolve",
]


def arange(
    seq_len: int,
    offset: int = 0,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.long,
) -> torch.Tensor:
    """Positions ``offset, offset + 1, ..., offset + seq_len - 1``.

    Shape: ``[seq_len]``.
    """
    seq_len = check_int("seq_len", seq_len, min=0)
    offset = check_int("offset", offset)
    return torch.arange(offset, offset + seq_len, device=device, dtype=dtype)


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
    if not isinstance(positions, torch.Tensor):
        try:
            positions = torch.as_tensor(positions)
        except (TypeError, ValueError, RuntimeError) as e:
            raise PosEncError(f"{name} must be a tensor of numbers, got {positions!r}") from e
    check_positions(name, positions, ndims=None)
    return positions if device is None else positions.to(device)


def _lengths(name: str, values: Sequence[int] | torch.Tensor) -> torch.Tensor:
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
    total = int(lens.sum())
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
    if mask.ndim != 2:
        raise PosEncError(f"mask must be [b, s], got shape {tuple(mask.shape)}")
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise PosEncError("mask must hold only 0 and 1 (or booleans)")
    m = mask.to(torch.long)
    return ((torch.cumsum(m, dim=-1) - 1) * m).clamp_min(0)


def grid(shape: Sequence[int], *, device: torch.device | str | None = None) -> torch.Tensor:
    """Integer coordinates of an N-D grid, axis 0 first.

    Shape: ``shape = (n_0, ..., n_{k-1})`` -> ``[n_0, ..., n_{k-1}, k]``;
    ``grid((H, W))[i, j] == [i, j]``. Flatten with ``.reshape(-1, k)`` for a token sequence.
    """
    if isinstance(shape, (int, torch.Tensor)) or len(shape) == 0:
        raise PosEncError(f"shape must be a non-empty sequence of sizes, got {shape!r}")
    sizes = [check_int(f"shape[{i}]", n, min=1) for i, n in enumerate(shape)]
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
    """The positions a module uses: validated ``positions``, or ``arange(seq_len) + offset``.

    Given positions are moved to ``device`` (when given) and shifted by ``offset``.
    Shape: ``[s]`` or ``[b, s]`` (``b`` equal to ``batch``, or 1).
    """
    offset = check_int("offset", offset)
    if positions is None:
        return arange(seq_len, offset, device=device)
    check_positions(name, positions, seq_len=seq_len, batch=batch)
    if device is not None:
        positions = positions.to(device)
    if offset:
        positions = positions + offset
    return positions
