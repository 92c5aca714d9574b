"""Evaluation: each metric recomputed by hand from the model's own logits."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from posenc.experiments.data import Corpus
from posenc.experiments.evaluate import evaluate, perplexity
from posenc.experiments.tasks import IGNORE, LETTER_A, SEP, LMTask, make_task
from posenc.models import TinyTransformer


def _lm_task() -> LMTask:
    g = torch.Generator().manual_seed(0)
    train = torch.randint(0, 256, (500,), generator=g, dtype=torch.uint8)
    validation = torch.randint(0, 256, (70,), generator=g, dtype=torch.uint8)
    return LMTask(Corpus(train, validation, "toy", (1, 1)), eval_tokens=64)


@pytest.mark.parametrize("encoding", ["sinusoidal", "rope", "alibi"])
def test_lm_metrics_are_window_losses(encoding: str) -> None:
    torch.manual_seed(0)
    model = TinyTransformer(256, dim=16, num_layers=1, num_heads=2, encoding=encoding)
    task = _lm_task()
    train_len = 6
    results = evaluate(model, task, [4, 6, 16], train_len=train_len, max_tokens=20)
    stream = task.corpus.validation.long()
    for length in (4, 6, 16):
        windows = 64 // length  # non-overlapping windows over the first 64 (+1) bytes
        nll = []
        with torch.no_grad():
            for w in range(windows):
                chunk = stream[w * length : (w + 1) * length + 1]
                logits = model(chunk[None, :-1])[0]
                nll.append(F.cross_entropy(logits.double(), chunk[1:], reduction="none"))
        nll = torch.stack(nll)  # [windows, E]
        cell = results[str(length)]
        assert cell["tokens"] == windows * length
        assert cell["loss"] == pytest.approx(float(nll.mean()), rel=1e-5)
        assert cell["ppl"] == pytest.approx(math.exp(float(nll.mean())), rel=1e-5)
        if length > train_len:
            past = nll[:, train_len:]
            assert cell["tokens_past"] == past.numel()
            assert cell["loss_past"] == pytest.approx(float(past.mean()), rel=1e-5)
            assert cell["ppl_past"] == pytest.approx(math.exp(float(past.mean())), rel=1e-5)
        else:
            assert cell["loss_past"] is None and cell["ppl_past"] is None
            assert cell["tokens_past"] == 0


class _FlawedCopier(nn.Module):
    """Copies perfectly, except that it never writes the letter ``blind``."""

    def __init__(self, blind: int) -> None:
        super().__init__()
        self.blind = blind

    def forward(self, tokens: torch.Tensor, positions=None) -> torch.Tensor:
        b, s = tokens.shape
        logits = torch.zeros(b, s, 41)
        for row in range(b):
            seq = tokens[row].tolist()
            sep = seq.index(SEP)
            for i in range(sep, min(s, 2 * sep - 1)):
                want = seq[i - sep + 1]  # the copy of x_(i - sep + 1)
                logits[row, i, want if want != self.blind else LETTER_A] = 1.0
        return logits


def test_accuracy_is_exact_match_and_matches_greedy_decoding() -> None:
    task = make_task("copy", eval_examples=40)
    blind = LETTER_A + 3
    model = _FlawedCopier(blind)
    cell = evaluate(model, task, [13], train_len=13, max_tokens=13 * 7)["13"]
    batch = next(task.eval_batches(13, seed=0, max_tokens=10**6))
    n = task.size_for(13)
    x = batch.tokens[:, 1 : n + 1]  # the strings to copy
    exact = ~(x == blind).any(-1)
    assert cell["examples"] == 40
    assert cell["accuracy"] == float(exact.double().mean())
    assert cell["token_accuracy"] == float((x != blind).double().mean())
    # Greedy decoding, token by token, agrees with the one teacher-forced pass.
    greedy = []
    for row in batch.tokens:
        seq = row[: n + 2].tolist()
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
        greedy.append(seq[n + 2 :] == row[1 : n + 1].tolist())
    assert torch.equal(torch.tensor(greedy), exact)
    scored = batch.targets != IGNORE
    logits = model(batch.tokens)
    want = F.cross_entropy(logits[scored].double(), batch.targets[scored])
    assert cell["loss"] == pytest.approx(float(want), rel=1e-6)


def test_a_learned_table_too_short_is_an_error_cell_and_the_rest_continue() -> None:
    torch.manual_seed(0)
    model = TinyTransformer(41, dim=16, num_layers=1, num_heads=2, encoding="learned", max_len=12)
    results = evaluate(model, make_task("reverse", eval_examples=8), [12, 24, 7], train_len=12)
    assert set(results) == {"12", "24", "7"}
    assert results["24"] == {
        "error": "positions must be in [0, max_len) with max_len=12, got values from 0 to 23"
    }
    assert 0.0 <= results["12"]["accuracy"] <= 1.0 and 0.0 <= results["7"]["accuracy"] <= 1.0


class _Spy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor | None] = []

    def forward(self, tokens, positions=None):
        self.seen.append(positions)
        return torch.zeros(*tokens.shape, 41)


def test_randomized_positions_at_eval_are_seeded_sorted_and_in_range() -> None:
    task = make_task("copy", eval_examples=6)
    spy = _Spy()
    evaluate(spy, task, [9, 20], train_len=9, seed=3, random_positions=16, max_tokens=9 * 4)
    first = torch.cat([p for p in spy.seen[:2]])  # length 9: rows 0-3, then 4-5
    assert first.shape == (6, 9)
    assert bool((first[:, 1:] > first[:, :-1]).all())  # distinct and sorted
    assert int(first.min()) >= 0 and int(first.max()) < 16
    assert spy.seen[2] is None  # length 20 > L_max: positions 0 .. 19
    again = _Spy()
    evaluate(again, task, [9], train_len=9, seed=3, random_positions=16, max_tokens=9 * 6)
    assert torch.equal(again.seen[0], first)  # the draw does not depend on batching


def test_perplexity() -> None:
    assert perplexity(math.log(7.0)) == pytest.approx(7.0)
    assert perplexity(None) is None
    assert perplexity(800.0) is None


@pytest.mark.parametrize("task_name", ["lm", "copy"])
def test_a_loss_that_overflows_is_an_error_cell_not_nan(task_name: str) -> None:
    """Weights whose logits overflow float32 give NaN losses: each length is then an error
    cell (results.json holds no NaN, which json refuses), not a NaN metric."""
    import json

    torch.manual_seed(0)
    task = _lm_task() if task_name == "lm" else make_task("copy", eval_examples=4)
    model = TinyTransformer(task.vocab_size, dim=16, num_layers=1, num_heads=2, encoding="rope")
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(3e38)  # every product overflows to inf, inf - inf to NaN
    results = evaluate(model, task, [8, 16], train_len=8)
    assert list(results) == ["8", "16"]
    for length, cell in results.items():
        assert list(cell) == ["error"], cell
        assert cell["error"].startswith("the model's loss is nan at length " + length)
    json.dumps(results, allow_nan=False)
