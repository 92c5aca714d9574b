"""Tasks: every synthetic instance is checked against the rule it encodes."""

from __future__ import annotations

import pytest
import torch
from tests.experiments._task_checks import check_train_batch, whole_eval_set

from posenc import PosEncError
from posenc.experiments.data import Corpus
from posenc.experiments.tasks import (
    BOS,
    DIGIT0,
    EQ,
    IGNORE,
    LETTER_A,
    PAD,
    PLUS,
    SEP,
    TASKS,
    LMTask,
    make_task,
)

SYNTHETIC = ["copy", "reverse", "recall", "addition"]


def _parts(row_tokens: torch.Tensor, row_targets: torch.Tensor):
    """(fed tokens without padding, the scored answer) of one row."""
    scored = (row_targets != IGNORE).nonzero().flatten()
    answer = row_targets[scored]
    # the fed sequence ends right after the token that predicts the last answer token
    fed = row_tokens[: int(scored[-1]) + 1]
    return fed.tolist(), answer.tolist(), int(scored[0])


def _expected(task: str, fed: list[int]) -> tuple[list[int], int]:
    """(answer, index where scoring starts) computed from the rule of ``task``."""
    assert fed[0] == BOS
    if task in ("copy", "reverse"):
        sep = fed.index(SEP)
        x = fed[1:sep]
        assert all(LETTER_A <= t < LETTER_A + 26 for t in x)
        return (x if task == "copy" else x[::-1]), sep
    if task == "recall":
        sep = fed.index(SEP)
        keys, values = fed[1:sep:2], fed[2:sep:2]
        query = fed[sep + 1]
        assert keys.count(query) == 1  # the query key occurs exactly once
        return [values[keys.index(query)]], sep + 1
    plus, eq = fed.index(PLUS), fed.index(EQ)
    a = fed[1:plus]
    b = fed[plus + 1 : eq]
    assert len(a) == len(b)
    value = sum((d - DIGIT0) * 10**i for i, d in enumerate(a)) + sum(
        (d - DIGIT0) * 10**i for i, d in enumerate(b)
    )
    digits = [(value // 10**i) % 10 + DIGIT0 for i in range(len(a) + 1)]
    return digits, eq


@pytest.mark.parametrize("name", SYNTHETIC)
@pytest.mark.parametrize("seq_len", [9, 16, 33])
def test_train_batches_follow_the_task_rule(name: str, seq_len: int) -> None:
    task = make_task(name)
    batch = task.train_batch(3, 24, seq_len, seed=7)
    check_train_batch(task, batch, 24, seq_len)
    sizes = set()
    for tokens, targets in zip(batch.tokens, batch.targets):
        fed, answer, first = _parts(tokens, targets)
        want, start = _expected(name, [*fed, answer[-1]])
        assert answer == want
        assert first == start  # the token before the answer predicts its first token
        assert (tokens[len(fed) :] == PAD).all()  # right padding only
        assert torch.equal(targets[:first], torch.full((first,), IGNORE))
        sizes.add(task.size_for(len(fed)))
    assert max(sizes) <= task.size_for(seq_len) and min(sizes) >= 1


@pytest.mark.parametrize("name", SYNTHETIC)
@pytest.mark.parametrize("length", [12, 40])
def test_eval_batches_use_the_largest_size_that_fits(name: str, length: int) -> None:
    task = make_task(name, eval_examples=10)
    batches, _, _ = whole_eval_set(task, length, [4, 4, 2])
    n = task.size_for(length)
    for batch in batches:
        for tokens, targets in zip(batch.tokens, batch.targets):
            fed, answer, _ = _parts(tokens, targets)
            assert len(fed) == task.slope * n + task.intercept <= length
            assert answer == _expected(name, [*fed, answer[-1]])[0]


@pytest.mark.parametrize(
    ("name", "seq_len"),
    [*((name, 20) for name in [*SYNTHETIC, "lm"]), ("counting", 40), ("flipflop", 40)],
)
def test_batches_depend_on_seed_and_step_only(name: str, seq_len: int) -> None:
    task = make_task(name)
    a = task.train_batch(5, 8, seq_len, seed=3)
    task.train_batch(6, 8, seq_len, seed=3)  # drawing other steps in between changes nothing
    b = task.train_batch(5, 8, seq_len, seed=3)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.tokens, task.train_batch(6, 8, seq_len, seed=3).tokens)
    assert not torch.equal(a.tokens, task.train_batch(5, 8, seq_len, seed=4).tokens)


def _toy_lm() -> LMTask:
    train = torch.arange(200, dtype=torch.uint8)
    validation = torch.arange(100, 201, dtype=torch.uint8)  # 101 bytes
    return LMTask(Corpus(train, validation, "toy", (1, 1)), eval_tokens=1000)


def test_lm_train_windows_are_shifted_slices_of_the_train_stream() -> None:
    task = _toy_lm()
    batch = task.train_batch(0, 16, 10, seed=0)
    starts = batch.tokens[:, 0]
    expected = starts[:, None] + torch.arange(10)
    assert torch.equal(batch.tokens, expected)
    assert torch.equal(batch.targets, expected + 1)
    assert int(starts.max()) + 10 < 200


@pytest.mark.parametrize("world", [1, 2, 3])
def test_lm_eval_windows_do_not_overlap_and_ranks_split_them(world: int) -> None:
    task = _toy_lm()
    length = 7
    seen = []
    for rank in range(world):
        for batch in task.eval_batches(
            length, seed=0, max_tokens=3 * length, rank=rank, world_size=world
        ):
            assert batch.tokens.shape[0] <= 3
            for i, row in zip(batch.index.tolist(), batch.tokens):
                start = 100 + i * length
                assert torch.equal(row, torch.arange(start, start + length))
                assert i % world == rank
            assert torch.equal(batch.targets, batch.tokens + 1)
            seen.extend(batch.index.tolist())
    assert sorted(seen) == list(range(100 // length))  # 14 whole windows of 100 targets


def test_every_task_is_registered() -> None:
    assert sorted(TASKS) == [
        "addition",
        "copy",
        "counting",
        "flipflop",
        "lm",
        "recall",
        "reverse",
    ]


def test_bad_inputs() -> None:
    with pytest.raises(PosEncError, match=r"task must be one of 'lm', 'copy'.*got 'sort'"):
        make_task("sort")
    with pytest.raises(PosEncError, match="eval_examples must be >= 1, got 0"):
        make_task("copy", eval_examples=0)
    with pytest.raises(PosEncError, match="train_len must be >= 6, got 5"):
        make_task("addition").check_length("train_len", 5)
    with pytest.raises(PosEncError, match=r"eval length must be < 101 \(the validation"):
        _toy_lm().check_length("eval length", 150)
