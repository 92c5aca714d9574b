"""The four synthetic tasks on one small vocabulary: ``copy``, ``reverse``, ``recall``,
``addition``.

- ``copy``: ``BOS x_1..x_n SEP x_1..x_n`` (letters), the second copy scored.
- ``reverse``: ``BOS x_1..x_n SEP x_n..x_1``.
- ``recall`` (associative recall): ``BOS k_1 v_1 .. k_n v_n SEP q v``: keys are
  letters, values digits; the query key ``q`` occurs exactly once among the
  keys (the others may repeat), so the answer ``v`` is unambiguous at any ``n``.
- ``addition``: ``BOS a PLUS b EQ c`` with ``a``, ``b`` of ``n`` digits and
  ``c = a + b`` of ``n + 1`` digits, all written least-significant digit first
  (the order in which carries are computed), ``c`` scored.

Training draws each row's size ``n`` uniformly from ``1..n_max(L)`` (the largest that fits
the training length ``L``) and pads on the right; evaluation at length ``E`` uses the
largest size that fits ``E``. Right padding never changes a causal model's predictions
before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import torch

from posenc._errors import check_int
from posenc.experiments.seeding import generator
from posenc.experiments.tasks.base import IGNORE, PAD, Batch, Task, eval_shards

__all__ = [
    "BOS",
    "DIGIT0",
    "EQ",
    "LETTER_A",
    "PAD",
    "PLUS",
    "SEP",
    "SYNTHETIC_TASKS",
    "SYNTHETIC_VOCAB",
    "AdditionTask",
    "CopyTask",
    "RecallTask",
    "ReverseTask",
]

# Synthetic vocabulary: specials (PAD = 0 first), then digits, then letters.
BOS, SEP, PLUS, EQ = 1, 2, 3, 4
DIGIT0 = 5
LETTER_A = DIGIT0 + 10
SYNTHETIC_VOCAB = LETTER_A + 26


class _SyntheticTask(Task):
    """Shared machinery: instances of size ``n`` as full sequences, scored spans, padding."""

    metric: ClassVar[str] = "accuracy"
    # sequence length (tokens fed to the model) = slope * n + intercept
    slope: ClassVar[int]
    intercept: ClassVar[int]

    def __init__(self, *, eval_examples: int = 256) -> None:
        self.eval_examples = check_int("eval_examples", eval_examples, min=1)
        self.vocab_size = SYNTHETIC_VOCAB

    def min_length(self) -> int:
        return self.slope + self.intercept

    def num_eval_rows(self, length: int) -> int:
        return self.eval_examples

    def size_for(self, length: int) -> int:
        """The largest instance size ``n`` whose sequence fits ``length``."""
        return (length - self.intercept) // self.slope

    def _instances(self, n: int, rows: int, g: torch.Generator) -> tuple[torch.Tensor, int]:
        """``rows`` full sequences of size ``n`` ``[rows, slope * n + intercept + 1]`` and the
        index in the sequence where the scored answer starts."""
        raise NotImplementedError

    def _pad(self, seq: torch.Tensor, answer_start: int, length: int) -> Batch:
        rows, total = seq.shape  # total = fed length + 1
        tokens = torch.full((rows, length), PAD, dtype=torch.long)
        targets = torch.full((rows, length), IGNORE, dtype=torch.long)
        tokens[:, : total - 1] = seq[:, :-1]
        targets[:, answer_start - 1 : total - 1] = seq[:, answer_start:]
        return Batch(tokens, targets)

    def train_batch(self, step: int, batch_size: int, seq_len: int, *, seed: int) -> Batch:
        g = generator(seed, f"{self.name}-train", step)
        sizes = torch.randint(1, self.size_for(seq_len) + 1, (batch_size,), generator=g)
        tokens = torch.empty(batch_size, seq_len, dtype=torch.long)
        targets = torch.empty(batch_size, seq_len, dtype=torch.long)
        for n in sizes.unique().tolist():  # sorted, so the draw order is fixed
            rows = (sizes == n).nonzero().flatten()
            part = self._pad(*self._instances(n, rows.numel(), g), seq_len)
            tokens[rows], targets[rows] = part.tokens, part.targets
        return Batch(tokens, targets)

    def eval_batches(
        self, length: int, *, seed: int, max_tokens: int, rank: int = 0, world_size: int = 1
    ) -> Iterator[Batch]:
        g = generator(seed, f"{self.name}-eval", length)
        full = self._pad(*self._instances(self.size_for(length), self.eval_examples, g), length)
        yield from eval_shards(full, length, max_tokens, rank, world_size)


def _letters(rows: int, n: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(LETTER_A, LETTER_A + 26, (rows, n), generator=g)


def _column(rows: int, value: int) -> torch.Tensor:
    return torch.full((rows, 1), value, dtype=torch.long)


class CopyTask(_SyntheticTask):
    """``BOS x SEP x``: repeat a string of letters."""

    name: ClassVar[str] = "copy"
    slope, intercept = 2, 1

    def _instances(self, n: int, rows: int, g: torch.Generator) -> tuple[torch.Tensor, int]:
        x = _letters(rows, n, g)
        return torch.cat([_column(rows, BOS), x, _column(rows, SEP), self._answer(x)], 1), n + 2

    def _answer(self, x: torch.Tensor) -> torch.Tensor:
        return x


class ReverseTask(CopyTask):
    """``BOS x SEP reversed(x)``."""

    name: ClassVar[str] = "reverse"

    def _answer(self, x: torch.Tensor) -> torch.Tensor:
        return x.flip(-1)


class RecallTask(_SyntheticTask):
    """``BOS k_1 v_1 .. k_n v_n SEP q v``: the value stored under the query key."""

    name: ClassVar[str] = "recall"
    slope, intercept = 2, 3

    def _instances(self, n: int, rows: int, g: torch.Generator) -> tuple[torch.Tensor, int]:
        query = torch.randint(0, 26, (rows, 1), generator=g)
        # Other keys avoid the query: draw from 25 letters and skip over it.
        others = torch.randint(0, 25, (rows, n), generator=g)
        keys = others + (others >= query).long()
        slot = torch.randint(0, n, (rows, 1), generator=g)
        keys.scatter_(1, slot, query)
        values = torch.randint(DIGIT0, DIGIT0 + 10, (rows, n), generator=g)
        pairs = torch.stack([keys + LETTER_A, values], dim=-1).reshape(rows, 2 * n)
        answer = values.gather(1, slot)
        seq = torch.cat(
            [_column(rows, BOS), pairs, _column(rows, SEP), query + LETTER_A, answer], 1
        )
        return seq, 2 * n + 3


class AdditionTask(_SyntheticTask):
    """``BOS a PLUS b EQ c``, digits least-significant first, ``c`` with ``n + 1`` digits."""

    name: ClassVar[str] = "addition"
    slope, intercept = 3, 3

    def _instances(self, n: int, rows: int, g: torch.Generator) -> tuple[torch.Tensor, int]:
        a = torch.randint(0, 10, (rows, n), generator=g)
        b = torch.randint(0, 10, (rows, n), generator=g)
        c = torch.empty(rows, n + 1, dtype=torch.long)
        carry = torch.zeros(rows, dtype=torch.long)
        for i in range(n):  # least-significant digit first
            total = a[:, i] + b[:, i] + carry
            c[:, i], carry = total % 10, total // 10
        c[:, n] = carry
        seq = torch.cat(
            [
                _column(rows, BOS),
                a + DIGIT0,
                _column(rows, PLUS),
                b + DIGIT0,
                _column(rows, EQ),
                c + DIGIT0,
            ],
            1,
        )
        return seq, 2 * n + 3


#: The synthetic tasks by name; each takes ``eval_examples=``.
SYNTHETIC_TASKS: dict[str, type[_SyntheticTask]] = {
    "copy": CopyTask,
    "reverse": ReverseTask,
    "recall": RecallTask,
    "addition": AdditionTask,
}
