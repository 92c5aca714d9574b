"""The tasks of a length-generalization study: ``lm`` and four synthetic ones.

Every task turns ``(seed, step)`` into a training batch and ``(seed, length)``
into evaluation batches, with no hidden state (see :mod:`.seeding`). A batch is
``tokens [b, s]`` (int64) and ``targets [b, s]`` (int64; ``IGNORE`` where no
prediction is scored): ``targets[:, i]`` is what the model should predict after
reading ``tokens[:, : i + 1]``.

- ``lm``: next-byte prediction on the stdlib corpus (:mod:`.data`). Training
  windows start at random offsets of the train stream; evaluation cuts the
  validation stream into non-overlapping windows of the eval length (Press et
  al., 2022), every position scored.
- ``copy``: ``BOS x_1..x_n SEP x_1..x_n`` (letters), the second copy scored.
- ``reverse``: ``BOS x_1..x_n SEP x_n..x_1``.
- ``recall`` (associative recall): ``BOS k_1 v_1 .. k_n v_n SEP q v``: keys are
  letters, values digits; the query key ``q`` occurs exactly once among the
  keys (the others may repeat), so the answer ``v`` is unambiguous at any ``n``.
- ``addition``: ``BOS a PLUS b EQ c`` with ``a``, ``b`` of ``n`` digits and
  ``c = a + b`` of ``n + 1`` digits, all written least-significant digit first
  (the order in which carries are computed), ``c`` scored.

Synthetic training draws each row's size ``n`` uniformly from ``1..n_max(L)``
(the largest that fits the training length ``L``) and pads on the right;
evaluation at length ``E`` uses the largest size that fits ``E``. Right padding
never changes a causal model's predictions before it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import ClassVar

import torch

from posenc._errors import PosEncError, check_choice, check_int
from posenc.experiments.data import VOCAB_SIZE, Corpus, load_stdlib_corpus
from posenc.experiments.seeding import generator

__all__ = [
    "IGNORE",
    "TASKS",
    "AdditionTask",
    "Batch",
    "CopyTask",
    "LMTask",
    "RecallTask",
    "ReverseTask",
    "Task",
    "make_task",
]

IGNORE = -100  # torch.nn.functional.cross_entropy's default ignore_index

# Synthetic vocabulary: specials, then digits, then letters.
PAD, BOS, SEP, PLUS, EQ = 0, 1, 2, 3, 4
DIGIT0 = 5
LETTER_A = DIGIT0 + 10
SYNTHETIC_VOCAB = LETTER_A + 26


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

    def train_batch(self, step: int, batch_size: int, seq_len: int, *, seed: int) -> Batch:
        """The global training batch of ``step``: ``[batch_size, seq_len]``."""
        raise NotImplementedError

    def eval_batches(
        self, length: int, *, seed: int, max_tokens: int, rank: int = 0, world_size: int = 1
    ) -> Iterator[Batch]:
        """This rank's evaluation batches at ``length`` (``[b, length]``, ``b * length``
        at most ``max_tokens`` or one row); the ranks together cover the eval set once."""
        raise NotImplementedError


def _chunks(
    rows: int, length: int, max_tokens: int, rank: int, world: int
) -> Iterator[torch.Tensor]:
    mine = torch.arange(rank, rows, world)
    per = max(1, max_tokens // length)
    yield from mine.split(per)


class LMTask(Task):
    """Next-byte prediction on the stdlib corpus.

    Args:
        corpus: the byte streams (default: :func:`~posenc.experiments.data.load_stdlib_corpus`).
        eval_tokens: how many validation bytes each eval length scores (rounded down to
            whole windows; every length reads the same prefix of the validation stream).
    """

    name: ClassVar[str] = "lm"
    metric: ClassVar[str] = "ppl"

    def __init__(self, corpus: Corpus | None = None, *, eval_tokens: int = 32768) -> None:
        self.corpus = load_stdlib_corpus() if corpus is None else corpus
        self.eval_tokens = check_int("eval_tokens", eval_tokens, min=1)
        self.vocab_size = VOCAB_SIZE

    def min_length(self) -> int:
        return 1

    def check_length(self, name: str, length: int) -> int:
        length = super().check_length(name, length)
        for split, stream in (("train", self.corpus.train), ("validation", self.corpus.validation)):
            if length + 1 > stream.numel():
                raise PosEncError(
                    f"{name} must be < {stream.numel()} (the {split} corpus size), got {length}"
                )
        return length

    def train_batch(self, step: int, batch_size: int, seq_len: int, *, seed: int) -> Batch:
        stream = self.corpus.train
        g = generator(seed, "lm-train", step)
        starts = torch.randint(0, stream.numel() - seq_len, (batch_size,), generator=g)
        window = stream[starts[:, None] + torch.arange(seq_len + 1)].long()  # [b, s + 1]
        return Batch(window[:, :-1], window[:, 1:])

    def num_eval_rows(self, length: int) -> int:
        usable = min(self.eval_tokens, self.corpus.validation.numel() - 1)
        return max(1, usable // length)

    def eval_batches(
        self, length: int, *, seed: int, max_tokens: int, rank: int = 0, world_size: int = 1
    ) -> Iterator[Batch]:
        stream = self.corpus.validation
        for rows in _chunks(self.num_eval_rows(length), length, max_tokens, rank, world_size):
            window = stream[rows[:, None] * length + torch.arange(length + 1)].long()  # [b, E + 1]
            yield Batch(window[:, :-1], window[:, 1:], rows)


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
        for rows in _chunks(self.eval_examples, length, max_tokens, rank, world_size):
            yield full.rows(rows)


def _letters(rows: int, n: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(LETTER_A, LETTER_A + 26, (rows, n), generator=g)


def _column(rows: int, value: int) -> torch.Tensor:
    return torch.full((rows, 1), value, dtype=torch.long)


class CopyTask(_SyntheticTask):
    """``BOS x SEP x``: repeat a string of letters."""

    name: ClassVar[str] = "copy"
    slope, intercept = 2, 1

    def _instances(self, n, rows, g):
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

    def _instances(self, n, rows, g):
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

    def _instances(self, n, rows, g):
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


TASKS: dict[str, type[Task]] = {
    "lm": LMTask,
    "copy": CopyTask,
    "reverse": ReverseTask,
    "recall": RecallTask,
    "addition": AdditionTask,
}


def make_task(name: str, *, eval_tokens: int = 32768, eval_examples: int = 256) -> Task:
    """The task called ``name`` (one of :data:`TASKS`).

    Examples:
        >>> task = make_task("copy")
        >>> batch = task.train_batch(0, 2, 9, seed=0)
        >>> batch.tokens.shape, task.size_for(9)
        (torch.Size([2, 9]), 4)
    """
    check_choice("task", name, tuple(TASKS))
    if name == "lm":
        return LMTask(eval_tokens=eval_tokens)
    return TASKS[name](eval_examples=eval_examples)  # type: ignore[call-arg]
