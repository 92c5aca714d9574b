"""Checks every task's batches meet, shared by the task tests."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from posenc.experiments.tasks import Batch, Task


def check_train_batch(
    task: Task, batch: Batch, rows: int, seq_len: int, words: Sequence[str] | None = None
) -> None:
    """``[rows, seq_len]`` int64 tokens and targets, the tokens in the task's vocabulary
    (``words``: the task's words, one per token, where it has its own)."""
    assert batch.tokens.shape == batch.targets.shape == (rows, seq_len)
    assert batch.tokens.dtype == batch.targets.dtype == torch.int64
    assert 0 <= int(batch.tokens.min()) and int(batch.tokens.max()) < task.vocab_size
    assert words is None or task.vocab_size == len(words)


def whole_eval_set(
    task: Task, length: int, sizes: list[int], *, seed: int = 1
) -> tuple[list[Batch], torch.Tensor, torch.Tensor]:
    """The eval batches at ``length`` cut ``sizes[0]`` rows at a time, checked to hold
    ``sizes`` rows and to number the rows of the eval set in order; with all their tokens
    and targets."""
    batches = list(task.eval_batches(length, seed=seed, max_tokens=sizes[0] * length))
    assert [b.tokens.shape[0] for b in batches] == sizes
    index = torch.cat([b.index for b in batches if b.index is not None])
    assert torch.equal(index, torch.arange(sum(sizes)))
    tokens = torch.cat([b.tokens for b in batches])
    return batches, tokens, torch.cat([b.targets for b in batches])
