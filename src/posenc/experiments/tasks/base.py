"""What every task shares: the :class:`Batch`, the :class:`Task` interface, ``IGNORE``,
``PAD`` and the cutting of an eval set into this rank's batches.

A batch is ``tokens [b, s]`` (int64) and ``targets [b, s]`` (int64; ``IGNORE`` where no
prediction is scored): ``targets[:, i]`` is what the model should predict after reading
``tokens[:, : i + 1]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import ClassVar

import torch

from posenc._errors import check_int

__all__ = ["IGNORE", "PAD", "Batch", "Task", "eval_row_chunks", "eval_shards"]

IGNORE = -100  # torch.nn.functional.cross_entropy's default ignore_index
PAD = 0  # the padding token of every synthetic vocabulary (its first word)


@dataclasses.dataclass(frozen=True)
class Batch:
    """``tokens`` and ``targets``, both int64 ``[b, s]``; ``IGNORE`` marks unscored targets.

    ``index`` (int64 ``[b]``, evaluation only) numbers the rows within the whole eval
    set, so per-row draws (randomized positions) do not depend on how rows are split.
    """

    tokens: torch.Tensor
    targets: torch.Tensor
    index: torch.Tensor | None = None

    def rows(self, index: torch.Tensor) -> Batch:
        """The batch restricted to some rows (a rank's shard); ``index`` is kept."""
        return Batch(self.tokens[index], self.targets[index], index)


class Task:
    """A task: batches from seeds, and the metric it is judged by."""

    def num_eval_rows(self, length: int) -> int:
        """How many rows (windows or examples) the eval set at ``length`` holds."""
        raise NotImplementedError

    name: ClassVar[str]
    metric: ClassVar[str]  # "ppl" (lm) or "accuracy" (synthetic)
    vocab_size: int

    def min_length(self) -> int:
        """The shortest sequence the task can produce."""
        raise NotImplementedError

    def check_length(self, name: str, length: int) -> int:
        return check_int(name, length, min=self.min_length())

    def extra_splits(self) -> dict[str, Task]:
        """Other eval sets of the same trained model, by name (flip-flop's other splits):
        :func:`~posenc.experiments.evaluate.evaluate` reports each under ``"splits"``."""
        return {}

    def train_batch(self, step: int, batch_size: int, seq_len: int, *, seed: int) -> Batch:
        """The global training batch of ``step``: ``[batch_size, seq_len]``."""
        raise NotImplementedError

    def eval_batches(
        self, length: int, *, seed: int, max_tokens: int, rank: int = 0, world_size: int = 1
    ) -> Iterator[Batch]:
        """This rank's evaluation batches at ``length`` (``[b, length]``, ``b * length``
        at most ``max_tokens`` or one row); the ranks together cover the eval set once."""
        raise NotImplementedError


def eval_row_chunks(
    rows: int, length: int, max_tokens: int, rank: int, world: int
) -> Iterator[torch.Tensor]:
    """This rank's rows of an eval set of ``rows`` (every ``world``-th from ``rank``), in
    chunks of ``max_tokens // length`` rows (at least one)."""
    mine = torch.arange(rank, rows, world)
    per = max(1, max_tokens // length)
    yield from mine.split(per)


def eval_shards(
    full: Batch, length: int, max_tokens: int, rank: int, world: int
) -> Iterator[Batch]:
    """This rank's batches of a whole eval set ``full`` drawn at once (see
    :func:`eval_row_chunks`)."""
    for rows in eval_row_chunks(full.tokens.shape[0], length, max_tokens, rank, world):
        yield full.rows(rows)
