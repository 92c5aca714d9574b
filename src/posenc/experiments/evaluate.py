"""Evaluation at lengths beyond training.

``lm``: the validation stream is cut into non-overlapping windows of the eval
length ``E`` (Press et al., 2022, evaluate this way: every token is predicted
from at most ``E - 1`` tokens of its own window, none from the previous one).
Reported per length: mean cross-entropy ``loss`` (nats/byte) and ``ppl`` over
every position of every window, and ``loss_past`` / ``ppl_past`` over only the
positions at or past the training length (None when ``E`` is not longer).

Synthetic tasks: ``accuracy`` is exact match (every scored token right), read
from one teacher-forced forward pass. That equals greedy decoding's exact
match: if every argmax given the true prefix is right, greedy decoding produces
that prefix. Also ``token_accuracy`` and ``loss`` over scored tokens.

Tasks with other eval sets of the same model (flip-flop's splits,
:meth:`~posenc.experiments.tasks.Task.extra_splits`) add their metrics under ``"splits"``,
by name.

A length the model cannot run (a learned table shorter than ``E``), or where its loss is
NaN or infinite (logits that overflow float32), gives ``{"error": message}`` for that
length; the others are still evaluated.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from posenc import positions as _positions
from posenc._errors import PosEncError, check_int
from posenc.experiments.distributed import Dist
from posenc.experiments.seeding import generator
from posenc.experiments.tasks import IGNORE, Task

__all__ = ["evaluate", "perplexity"]

# Indices of the per-rank sums reduced over ranks.
_LOSS, _COUNT, _PAST_LOSS, _PAST_COUNT, _EXACT, _ROWS, _TOKEN_RIGHT = range(7)


def perplexity(loss: float | None) -> float | None:
    """``exp(loss)``; None for None, and for losses so large that it overflows.

    Examples:
        >>> perplexity(0.0), perplexity(None), perplexity(1e4)
        (1.0, None, None)
    """
    if loss is None or loss > 700.0:
        return None
    return math.exp(loss)


def _eval_positions(
    task: Task, length: int, index: torch.Tensor, seed: int, random_positions: int | None
) -> torch.Tensor | None:
    if random_positions is None or length > random_positions:
        return None  # 0 .. E - 1
    g = generator(seed, "eval-positions", length)
    drawn = _positions.randomized(
        length, random_positions, batch_size=task.num_eval_rows(length), generator=g
    )  # [rows, E], one draw per row of the whole eval set
    return drawn[index]


def _metrics(task: Task, sums: torch.Tensor, length: int, train_len: int) -> dict[str, Any]:
    s = sums.tolist()
    loss = s[_LOSS] / s[_COUNT]
    if not math.isfinite(loss) or not math.isfinite(s[_PAST_LOSS]):
        return {
            "error": f"the model's loss is {loss} at length {length} (its float32 logits overflow)"
        }
    if task.metric == "ppl":
        past = s[_PAST_LOSS] / s[_PAST_COUNT] if s[_PAST_COUNT] else None
        return {
            "loss": loss,
            "ppl": perplexity(loss),
            "loss_past": past,
            "ppl_past": perplexity(past),
            "tokens": int(s[_COUNT]),
            "tokens_past": int(s[_PAST_COUNT]),
        }
    return {
        "loss": loss,
        "accuracy": s[_EXACT] / s[_ROWS],
        "token_accuracy": s[_TOKEN_RIGHT] / s[_COUNT],
        "examples": int(s[_ROWS]),
    }


def evaluate(
    model: nn.Module,
    task: Task,
    lengths: Sequence[int],
    *,
    train_len: int,
    seed: int = 0,
    dist: Dist | None = None,
    random_positions: int | None = None,
    max_tokens: int = 16384,
    max_scores: int = 2**22,
) -> dict[str, dict[str, Any]]:
    """Metrics of ``model`` on ``task`` at each of ``lengths``.

    Args:
        model: maps ``tokens [b, E]`` (and positions) to logits ``[b, E, vocab]``.
        task: the task; its eval sets are fixed by ``seed``.
        lengths: eval lengths ``E``.
        train_len: the training length (``lm`` reports the positions past it separately).
        seed: the study's seed (synthetic eval sets, randomized positions).
        dist: the process's place in a distributed run; the ranks split the eval set.
        random_positions: the ``L_max`` the model was trained with, or None. Lengths up to
            ``L_max`` are then evaluated on randomized positions as in training (one draw
            per row); longer ones on ``0 .. E - 1``.
        max_tokens: tokens per forward pass (rows per batch = ``max_tokens // E``, at least 1).
        max_scores: attention scores per pass and layer, ``rows * heads * E * E`` (rows are
            cut to fit, at least 1): keeps the ``[b, h, E, E]`` bias of a bias encoding
            small (16 MiB in float32 by default), so long windows stay on SDPA.

    Returns:
        ``{str(E): metrics}``; metrics as in the module docstring, or ``{"error": message}``.
    """
    dist = Dist() if dist is None else dist
    check_int("max_tokens", max_tokens, min=1)
    check_int("max_scores", max_scores, min=1)
    heads = int(getattr(model, "num_heads", 1))
    run = _Evaluation(model, train_len, seed, dist, random_positions)
    results: dict[str, dict[str, Any]] = {}
    was_training = model.training
    model.eval()
    try:
        for length in lengths:
            rows = max(1, min(max_tokens // length, max_scores // (heads * length**2)))
            results[str(length)] = run.at_length(task, length, max_tokens=rows * length)
    finally:
        model.train(was_training)
    return results


@dataclasses.dataclass(frozen=True)
class _Evaluation:
    """One model's evaluation: what every length and eval set shares."""

    model: nn.Module
    train_len: int
    seed: int
    dist: Dist
    random_positions: int | None

    def at_length(self, task: Task, length: int, *, max_tokens: int) -> dict[str, Any]:
        """The metrics of ``task`` at ``length`` and of its other splits (under
        ``"splits"``), or ``{"error": message}`` when the model cannot run it."""
        error: str | None = None
        sums = torch.zeros(7, dtype=torch.float64)
        try:
            sums = self.sums(task, length, max_tokens=max_tokens)
        except (PosEncError, IndexError) as e:
            error = str(e).splitlines()[0] if str(e) else type(e).__name__
        # Every rank must take part in the reduction, and agree on errors.
        errors = [m for m in self.dist.gather_objects(error) if m is not None]
        if errors:
            return {"error": errors[0]}
        metrics = self.reduced(task, sums, length)
        splits = task.extra_splits()
        if splits:
            metrics["splits"] = {
                split: self.reduced(
                    split_task, self.sums(split_task, length, max_tokens=max_tokens), length
                )
                for split, split_task in splits.items()
            }
        return metrics

    def reduced(self, task: Task, sums: torch.Tensor, length: int) -> dict[str, Any]:
        """The metrics of every rank's ``sums`` together."""
        return _metrics(task, self.dist.all_reduce_sum(sums), length, self.train_len)

    @torch.no_grad()
    def sums(self, task: Task, length: int, *, max_tokens: int) -> torch.Tensor:
        """This rank's sums (indexed by ``_LOSS``, ...) over its rows of the eval set."""
        dist = self.dist
        sums = torch.zeros(7, dtype=torch.float64)
        past = torch.arange(length) >= self.train_len  # [E] positions past the training length
        batches = task.eval_batches(
            length,
            seed=self.seed,
            max_tokens=max_tokens,
            rank=dist.rank,
            world_size=dist.world_size,
        )
        for batch in batches:
            tokens = batch.tokens.to(dist.device)
            index = torch.arange(tokens.shape[0]) if batch.index is None else batch.index
            positions = _eval_positions(task, length, index, self.seed, self.random_positions)
            if positions is not None:
                positions = positions.to(dist.device)
            logits = self.model(tokens, positions).float().cpu()  # [b, E, vocab]
            _add_batch(sums, logits, batch.targets, past)
        return sums


def _add_batch(
    sums: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor, past: torch.Tensor
) -> None:
    """Add one batch's losses and counts to ``sums``."""
    scored = targets != IGNORE  # [b, E]
    nll = (
        F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            targets.reshape(-1),
            ignore_index=IGNORE,
            reduction="none",
        )
        .reshape(targets.shape)
        .double()
    )
    sums[_LOSS] += nll.sum()
    sums[_COUNT] += scored.sum()
    sums[_PAST_LOSS] += nll[:, past].sum()
    sums[_PAST_COUNT] += scored[:, past].sum()
    right = (logits.argmax(-1) == targets) & scored
    sums[_EXACT] += (right | ~scored).all(-1).sum()
    sums[_ROWS] += targets.shape[0]
    sums[_TOKEN_RIGHT] += right.sum()
