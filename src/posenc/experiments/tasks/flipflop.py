"""``flipflop``: flip-flop language modelling (Liu et al., 2023).

``BOS`` then write / ignore / read instructions with bits, each read bit (the latest
written one) scored (:class:`FlipFlopTask`; its own vocabulary). Rows are always full
length; the eval splits differ in how often an instruction is ``ignore``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import torch

from posenc._errors import PosEncError, check_choice, check_float, check_int
from posenc.experiments.seeding import generator
from posenc.experiments.tasks.base import IGNORE, PAD, Batch, Task, eval_shards

__all__ = ["FLIPFLOP_SPLITS", "FLIPFLOP_WORDS", "FlipFlopTask"]

#: The flip-flop task's words, indexed by token.
FLIPFLOP_WORDS: tuple[str, ...] = ("<pad>", "<bos>", "w", "i", "r", "0", "1")
_F_BOS, _F_W, _F_I, _F_R, _F_BIT0 = 1, 2, 3, 4, 5

#: The ignore probability of each flip-flop eval split ("train" is the task's own).
FLIPFLOP_SPLITS: dict[str, float | None] = {"train": None, "sparse": 0.98, "dense": 0.1}


class FlipFlopTask(Task):
    """Flip-flop language modelling (Liu et al., 2023, "Exposing Attention Glitches with
    Flip-Flop Language Modeling").

    ``BOS x_1 b_1 .. x_T b_T``: instructions ``w`` (write), ``i`` (ignore), ``r`` (read),
    each followed by a bit. ``x_1`` is ``w`` and ``x_T`` is ``r``; in between each is ``i``
    with probability ``p_ignore`` and ``w`` or ``r`` with ``(1 - p_ignore) / 2`` each. The
    bits after ``w`` and ``i`` are uniform; the bit after ``r`` is the bit of the latest
    ``w``, and only those read bits are scored: exact match is "every read right" and
    token accuracy is one minus the read error rate.

    The paper trains on FFL(0.8) (``p_ignore = 0.8``) at a fixed length and measures read
    errors in distribution and on a sparse split (FFL(0.98), long stretches of ``i``
    between a write and its read) and a dense one (FFL(0.1)): Transformers make rare,
    sporadic read errors, most of all on the sparse split ("attention glitches"), which
    a 1-layer LSTM trained the same way does not make (no errors).

    Length: a row of ``L`` tokens holds ``T = (L - 1) // 2`` instructions (``2 T + 1``
    tokens with BOS; one pad when ``L`` is even). Every training row is full length
    (the paper trains at a fixed length), and evaluation at a longer ``E`` holds more
    instructions, drawn with the ``eval_split``'s ``p_ignore``.

    Args:
        train_p_ignore: ``p_ignore`` of training, in ``[0, 1)`` (the paper's 0.8).
        eval_split: ``"sparse"`` (0.98), ``"dense"`` (0.1) or ``"train"`` (``train_p_ignore``).
        eval_examples: rows of each eval set.
    """

    name: ClassVar[str] = "flipflop"
    metric: ClassVar[str] = "accuracy"
    words: ClassVar[tuple[str, ...]] = FLIPFLOP_WORDS

    def __init__(
        self, *, train_p_ignore: float = 0.8, eval_split: str = "sparse", eval_examples: int = 256
    ) -> None:
        self.train_p_ignore = _check_p_ignore("train_p_ignore", train_p_ignore)
        self.eval_split = check_choice("eval_split", eval_split, tuple(FLIPFLOP_SPLITS))
        split_p = FLIPFLOP_SPLITS[eval_split]
        self.eval_p_ignore = self.train_p_ignore if split_p is None else split_p
        self.eval_examples = check_int("eval_examples", eval_examples, min=1)
        self.vocab_size = len(FLIPFLOP_WORDS)

    def min_length(self) -> int:
        return 5  # BOS w b r b

    def extra_splits(self) -> dict[str, Task]:
        return {
            split: FlipFlopTask(
                train_p_ignore=self.train_p_ignore,
                eval_split=split,
                eval_examples=self.eval_examples,
            )
            for split in FLIPFLOP_SPLITS
            if split != self.eval_split
        }

    def num_eval_rows(self, length: int) -> int:
        return self.eval_examples

    def size_for(self, length: int) -> int:
        """How many instructions a row of ``length`` tokens holds."""
        return (length - 1) // 2

    def _rows(self, rows: int, length: int, p_ignore: float, g: torch.Generator) -> Batch:
        t = self.size_for(length)
        u = torch.rand(rows, t, generator=g, dtype=torch.float64)
        ops = torch.where(
            u < p_ignore, _F_I, torch.where(u < p_ignore + (1 - p_ignore) / 2, _F_W, _F_R)
        )
        ops[:, 0], ops[:, -1] = _F_W, _F_R
        bits = torch.randint(0, 2, (rows, t), generator=g)
        is_w = ops == _F_W
        latest = torch.where(is_w, torch.arange(t), -1).cummax(1).values  # >= 0: x_1 is w
        is_r = ops == _F_R
        bits = torch.where(is_r, bits.gather(1, latest), bits)
        tokens = torch.full((rows, length), PAD, dtype=torch.long)
        targets = torch.full((rows, length), IGNORE, dtype=torch.long)
        tokens[:, 0] = _F_BOS
        tokens[:, 1 : 2 * t + 1 : 2] = ops
        tokens[:, 2 : 2 * t + 2 : 2] = bits + _F_BIT0
        # the r token predicts its bit
        targets[:, 1 : 2 * t + 1 : 2] = torch.where(is_r, bits + _F_BIT0, IGNORE)
        return Batch(tokens, targets)

    def train_batch(self, step: int, batch_size: int, seq_len: int, *, seed: int) -> Batch:
        g = generator(seed, f"{self.name}-train", step)
        return self._rows(batch_size, seq_len, self.train_p_ignore, g)

    def eval_batches(
        self, length: int, *, seed: int, max_tokens: int, rank: int = 0, world_size: int = 1
    ) -> Iterator[Batch]:
        g = generator(seed, f"{self.name}-eval-{self.eval_split}", length)
        full = self._rows(self.eval_examples, length, self.eval_p_ignore, g)
        yield from eval_shards(full, length, max_tokens, rank, world_size)


def _check_p_ignore(name: str, value: float) -> float:
    value = check_float(name, value, min=0.0)
    if value >= 1.0:
        raise PosEncError(f"{name} must be < 1, got {value}")
    return value
