"""The blocks of query rows a remapped attention runs, the keys each branch reads in each,
and the queries and keys rotated once per branch.

When the key positions are sorted, a block whose queries sit at positions ``[qmin, qmax]``
meets the pairs of a branch whose offsets lie in ``[lo, hi]``
(:meth:`~posenc._base.PositionMap.offset_bounds`) only at the keys with positions in
``[qmin - hi, qmax - lo]``: one contiguous range of key indices per branch (found for every
block with one host synchronisation). A Self-Extend or STRING block then reads its
neighbours' band in one branch and the keys before it in the other, about one product per
pair instead of one per branch. Unsorted keys (or a traced call) read every key.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from posenc._base import PositionMap
from posenc._errors import tracing

__all__ = ["Block", "plan", "rotated"]


@dataclasses.dataclass(frozen=True)
class Block:
    """Query rows ``start:stop``; keys ``:end`` hold every key they may see, and branch
    ``i`` reads keys ``ranges[i][0]:ranges[i][1]`` of them (an empty range: none)."""

    start: int
    stop: int
    end: int
    ranges: tuple[tuple[int, int], ...]
    #: Per branch, keys ``a:b`` (inside its range) that every row of the block sees in that
    #: branch: their pairs need no mask (empty when the keys are not sorted).
    whole: tuple[tuple[int, int], ...] = ()


def plan(pmap: PositionMap, q_positions: torch.Tensor, k_positions: torch.Tensor, rows: int):
    """The blocks of ``rows`` query rows (int64 positions ``[sq]``, ``[sk]``)."""
    sq, sk = q_positions.shape[0], k_positions.shape[0]
    starts = list(range(0, sq, rows))
    whole = tuple((0, sk) for _ in range(pmap.branches))
    if tracing() or sk == 1:
        return [Block(s, min(s + rows, sq), sk, whole) for s in starts]
    pad = starts[-1] + rows - sq  # the last block's rows repeated to fill a [blocks, rows] view
    padded = torch.cat([q_positions, q_positions[-1:].expand(pad)]).view(len(starts), rows)
    low, top = padded.amin(dim=1), padded.amax(dim=1)
    found = []
    for branch in range(pmap.branches):
        lo, hi = pmap.offset_bounds(branch)
        # keys a row may meet in the branch: kpos in [low - hi, top - lo]; keys every row
        # meets in it: kpos in [top - hi, low - lo]
        zero = torch.zeros_like(low)
        found += [
            zero if hi is None else torch.searchsorted(k_positions, low - hi),
            torch.searchsorted(k_positions, top - lo, right=True),
            zero if hi is None else torch.searchsorted(k_positions, top - hi),
            torch.searchsorted(k_positions, low - lo, right=True),
        ]
    ordered = (k_positions[1:] >= k_positions[:-1]).all().long()[None]
    flat = torch.cat([*found, ordered]).tolist()  # one host sync
    if not flat[-1]:
        return [Block(s, min(s + rows, sq), sk, whole) for s in starts]
    n = len(starts)
    blocks = []
    for i, s in enumerate(starts):
        at = [flat[j * n + i] for j in range(4 * pmap.branches)]
        ranges = tuple((at[4 * b], at[4 * b + 1]) for b in range(pmap.branches))
        sure = tuple(
            (at[4 * b + 2], max(at[4 * b + 2], at[4 * b + 3])) for b in range(pmap.branches)
        )
        end = max(hi for _, hi in ranges)
        blocks.append(Block(s, min(s + rows, sq), end, ranges, sure))
    return blocks


def rotated(x: torch.Tensor, rotate: Any, positions: list[torch.Tensor], dtype: torch.dtype):
    """``x`` rotated at each branch's positions (``rotate(x, p)``), in ``dtype``; a branch whose
    positions are an earlier branch's tensor reuses its rotation."""
    out: list[torch.Tensor] = []
    for i, p in enumerate(positions):
        same = next((j for j in range(i) if positions[j] is p), None)
        out.append(out[same] if same is not None else rotate(x, p).to(dtype))
    return out
