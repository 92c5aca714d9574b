"""``lm``: next-byte prediction on the stdlib corpus (:mod:`posenc.experiments.data`).

Training windows start at random offsets of the train stream; evaluation cuts the
validation stream into non-overlapping windows of the eval length (Press et al., 2022),
every position scored.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import torch

from posenc._errors import PosEncError, check_int
from posenc.experiments.data import VOCAB_SIZE, Corpus, load_stdlib_corpus
from posenc.experiments.seeding import generator
from posenc.experiments.tasks.base import Batch, Task, eval_row_chunks

__all__ = ["LMTask"]


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
        for rows in eval_row_chunks(
            self.num_eval_rows(length), length, max_tokens, rank, world_size
        ):
            window = stream[rows[:, None] * length + torch.arange(length + 1)].long()  # [b, E + 1]
            yield Batch(window[:, :-1], window[:, 1:], rows)
