"""The counting and flip-flop tasks: every row is checked against a plain-Python reading of
the rule it encodes (an interpreter of the statements; a scan for the last written bit)."""

from __future__ import annotations

import math
import re

import pytest
import torch
from tests.experiments._task_checks import check_train_batch, whole_eval_set

from posenc import PosEncError
from posenc.experiments.tasks import (
    COUNTING_WORDS,
    FLIPFLOP_WORDS,
    IGNORE,
    CountingTask,
    FlipFlopTask,
    make_task,
)

PAD = 0  # both tasks' vocabularies start with <pad>


def _interpret(words: list[str], num_vars: int) -> tuple[int, str, int]:
    """(the value ``print v`` prints, ``v``, the number of statements) of a program in the
    paper's words; fails on anything that is not a well-formed program."""
    names = "abcde"[:num_vars]
    assert words[-2] == "print" and words[-1] in names
    state: dict[str, int] = {}
    i, statements = 0, 0
    body = words[:-2]
    while i < len(body):
        statements += 1
        if body[i] == "pass;":
            i += 1
        elif body[i + 1] == "++;":
            assert body[i] in state  # an increment of a set variable
            state[body[i]] += 1
            assert state[body[i]] <= 10  # the paper's MAX_VAL
            i += 2
        else:
            assert body[i] in names and body[i + 1 : i + 4] == ["=", "0", ";"]
            state[body[i]] = 0
            i += 4
    return state[words[-1]], words[-1], statements


def _counting_expected(task: CountingTask, tokens: torch.Tensor) -> tuple[torch.Tensor, list]:
    """The targets a batch should have, read from its tokens by :func:`_interpret` (each
    answer from the tokens up to the one predicting it only); and per row (variable asked,
    statements, fed length)."""
    targets = torch.full_like(tokens, IGNORE)
    rows = []
    for i, row in enumerate(tokens.tolist()):
        fed = row.index(PAD) if PAD in row else len(row)
        words = [COUNTING_WORDS[t] for t in row[:fed]]
        assert PAD not in row[:fed] and set(row[fed:]) <= {PAD}  # right padding only
        value, name, statements = _interpret(words, task.num_vars)
        targets[i, fed - 1] = COUNTING_WORDS.index(str(value))
        rows.append((name, statements, fed))
    return targets, rows


@pytest.mark.parametrize("num_vars", [1, 3, 5])
@pytest.mark.parametrize("seq_len", [6, 17, 64, 200])
def test_counting_train_answers_are_the_interpreted_values(num_vars: int, seq_len: int) -> None:
    task = CountingTask(num_vars=num_vars)
    batch = task.train_batch(2, 96, seq_len, seed=5)
    check_train_batch(task, batch, 96, seq_len, COUNTING_WORDS)
    want, rows = _counting_expected(task, batch.tokens)
    assert torch.equal(batch.targets, want)  # one scored token a row: the answer
    statements = [n for _, n, _ in rows]
    assert max(statements) <= task.size_for(seq_len) and min(statements) >= 1
    assert max(fed for *_, fed in rows) <= seq_len


@pytest.mark.parametrize("num_vars", [1, 2, 5])
@pytest.mark.parametrize("length", [12, 100, 300])
def test_counting_eval_rows_fill_the_length(num_vars: int, length: int) -> None:
    task = CountingTask(num_vars=num_vars, eval_examples=40)
    _, tokens, targets = whole_eval_set(task, length, [16, 16, 8])
    want, rows = _counting_expected(task, tokens)
    assert torch.equal(targets, want)
    # cut after the last statement that fits: at most a set's 4 tokens short, minus one
    assert all(length - 3 <= fed <= length for *_, fed in rows)


def test_counting_uses_the_first_num_vars_names() -> None:
    for num_vars in range(1, 6):
        task = CountingTask(num_vars=num_vars)
        batch = task.train_batch(0, 64, 256, seed=0)
        used = {COUNTING_WORDS[t] for t in batch.tokens.unique().tolist()} & set("abcde")
        assert used == set("abcde"[:num_vars])
        asked = {name for name, _, _ in _counting_expected(task, batch.tokens)[1]}
        assert asked == set("abcde"[:num_vars])


def test_counting_longer_eval_lengths_hold_more_statements() -> None:
    task = CountingTask(eval_examples=16)
    means = []
    for length in (64, 256, 1024):
        tokens = next(task.eval_batches(length, seed=0, max_tokens=10**9)).tokens
        means.append(sum(n for _, n, _ in _counting_expected(task, tokens)[1]) / 16)
    assert means[0] < means[1] < means[2]


def test_counting_answer_does_not_depend_on_later_tokens() -> None:
    task = CountingTask(num_vars=3)
    batch = task.train_batch(9, 32, 80, seed=2)
    scored = batch.targets != IGNORE
    assert torch.equal(scored.sum(1), torch.ones(32, dtype=torch.long))
    where = scored.long().argmax(1)
    # the answer predicted at p is read from tokens[: p + 1]; after p only padding
    for row, p in zip(batch.tokens, where.tolist()):
        assert torch.equal(row[p + 1 :], torch.full((80 - p - 1,), PAD))
        words = [COUNTING_WORDS[t] for t in row[: p + 1].tolist()]
        assert words[-2] == "print"
    assert torch.equal(_counting_expected(task, batch.tokens)[0], batch.targets)


def test_counting_answers_reach_the_maximum_value() -> None:
    # one variable over long programs: increments stop at MAX_VAL = 10 (the interpreter
    # asserts it), and 10 itself is a common answer
    task = CountingTask(num_vars=1, eval_examples=200)
    batch = next(task.eval_batches(600, seed=3, max_tokens=10**9))
    answers = batch.targets[batch.targets != IGNORE]
    assert int(answers.max()) == COUNTING_WORDS.index("10")
    assert int(answers.min()) == COUNTING_WORDS.index("0")
    assert torch.equal(_counting_expected(task, batch.tokens)[0], batch.targets)


def _flipflop_expected(tokens: torch.Tensor) -> torch.Tensor:
    """Targets by a scan: after each ``r``, the bit of the latest ``w``; nothing else."""
    targets = torch.full_like(tokens, IGNORE)
    for i, row in enumerate(tokens.tolist()):
        words = [FLIPFLOP_WORDS[t] for t in row]
        assert words[0] == "<bos>"
        n = (len(words) - 1) // 2
        assert set(words[2 * n + 1 :]) <= {"<pad>"}
        ops, bits = words[1 : 2 * n + 1 : 2], words[2 : 2 * n + 2 : 2]
        assert ops[0] == "w" and ops[-1] == "r"
        assert set(ops) <= {"w", "i", "r"} and set(bits) <= {"0", "1"}
        latest = None
        for j, (op, bit) in enumerate(zip(ops, bits)):
            if op == "w":
                latest = bit
            elif op == "r":
                assert bit == latest
                targets[i, 2 * j + 1] = FLIPFLOP_WORDS.index(bit)
    return targets


@pytest.mark.parametrize("p_ignore", [0.0, 0.5, 0.8, 0.99])
@pytest.mark.parametrize("seq_len", [5, 6, 64, 129])
def test_flipflop_train_reads_are_the_last_written_bits(p_ignore: float, seq_len: int) -> None:
    task = FlipFlopTask(train_p_ignore=p_ignore)
    batch = task.train_batch(4, 50, seq_len, seed=11)
    check_train_batch(task, batch, 50, seq_len, FLIPFLOP_WORDS)
    assert torch.equal(batch.targets, _flipflop_expected(batch.tokens))
    # every row full length: 2 T + 1 tokens, one pad when the length is even
    full = 2 * task.size_for(seq_len) + 1
    assert full in (seq_len, seq_len - 1)
    assert bool((batch.tokens[:, :full] != PAD).all())


@pytest.mark.parametrize("split", ["train", "sparse", "dense"])
@pytest.mark.parametrize("length", [9, 64, 301])
def test_flipflop_eval_reads_are_the_last_written_bits(split: str, length: int) -> None:
    task = FlipFlopTask(eval_split=split, eval_examples=10)
    _, tokens, targets = whole_eval_set(task, length, [4, 4, 2])
    assert torch.equal(targets, _flipflop_expected(tokens))


@pytest.mark.parametrize(("split", "p_ignore"), [("train", 0.8), ("sparse", 0.98), ("dense", 0.1)])
def test_flipflop_ignore_fraction_is_the_splits(split: str, p_ignore: float) -> None:
    task = FlipFlopTask(eval_split=split, eval_examples=400)
    assert task.eval_p_ignore == p_ignore
    tokens = next(task.eval_batches(257, seed=0, max_tokens=10**9)).tokens
    middle = tokens[:, 3 : 257 - 2 : 2]  # instructions 2 .. T - 1, drawn with p_ignore
    n = middle.numel()
    se = math.sqrt(p_ignore * (1 - p_ignore) / n)
    ignored = (middle == FLIPFLOP_WORDS.index("i")).double().mean().item()
    assert abs(ignored - p_ignore) < 4 * se
    written = (middle == FLIPFLOP_WORDS.index("w")).double().mean().item()
    q = (1 - p_ignore) / 2
    assert abs(written - q) < 4 * math.sqrt(q * (1 - q) / n)
    # training draws with train_p_ignore whatever the split
    train = task.train_batch(0, 400, 257, seed=0).tokens[:, 3 : 257 - 2 : 2]
    ignored = (train == FLIPFLOP_WORDS.index("i")).double().mean().item()
    assert abs(ignored - 0.8) < 4 * math.sqrt(0.8 * 0.2 / n)


def test_flipflop_scores_only_read_bits() -> None:
    batch = FlipFlopTask().train_batch(0, 32, 65, seed=0)
    scored = batch.targets != IGNORE
    is_read = batch.tokens == FLIPFLOP_WORDS.index("r")
    assert torch.equal(scored, is_read)
    # a read's target is the bit fed right after it
    assert torch.equal(batch.targets[:, :-1][scored[:, :-1]], batch.tokens[:, 1:][scored[:, :-1]])


@pytest.mark.parametrize("name", ["counting", "flipflop"])
def test_eval_sets_depend_on_seed_and_length_only(name: str) -> None:
    task = make_task(name, eval_examples=12)

    def whole(length: int, seed: int, max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        batches = list(task.eval_batches(length, seed=seed, max_tokens=max_tokens))
        return torch.cat([b.tokens for b in batches]), torch.cat([b.targets for b in batches])

    a = whole(50, 0, 10**6)
    b = whole(50, 0, 3 * 50)  # however the rows are split
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], whole(50, 1, 10**6)[0])
    ranks = [
        torch.cat(
            [x.index for x in task.eval_batches(50, seed=0, max_tokens=100, rank=r, world_size=3)]
        )
        for r in range(3)
    ]
    assert sorted(torch.cat(ranks).tolist()) == list(range(12))


def test_flipflop_splits_are_different_eval_sets() -> None:
    sparse = next(make_task("flipflop").eval_batches(99, seed=0, max_tokens=10**6))
    dense = next(
        make_task("flipflop", eval_split="dense").eval_batches(99, seed=0, max_tokens=10**6)
    )
    assert not torch.equal(sparse.tokens, dense.tokens)


def test_make_task_passes_the_options() -> None:
    counting = make_task("counting", eval_examples=7)
    assert isinstance(counting, CountingTask) and counting.num_vars == 3
    assert counting.eval_examples == 7
    assert make_task("counting", num_vars=5).num_vars == 5  # type: ignore[attr-defined]
    flipflop = make_task("flipflop")
    assert isinstance(flipflop, FlipFlopTask)
    assert (flipflop.eval_split, flipflop.train_p_ignore, flipflop.eval_p_ignore) == (
        "sparse",
        0.8,
        0.98,
    )
    dense = make_task("flipflop", eval_split="dense")
    assert dense.eval_p_ignore == 0.1  # type: ignore[attr-defined]
    same = FlipFlopTask(train_p_ignore=0.5, eval_split="train")
    assert same.eval_p_ignore == 0.5


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: CountingTask(num_vars=0), "num_vars must be >= 1, got 0"),
        (lambda: CountingTask(num_vars=6), "num_vars must be <= 5, got 6"),
        (lambda: make_task("counting", num_vars=6), "num_vars must be <= 5, got 6"),
        (lambda: CountingTask(eval_examples=0), "eval_examples must be >= 1, got 0"),
        (lambda: FlipFlopTask(train_p_ignore=1.0), "train_p_ignore must be < 1, got 1.0"),
        (lambda: FlipFlopTask(train_p_ignore=-0.1), "train_p_ignore must be >= 0.0, got -0.1"),
        (
            lambda: FlipFlopTask(eval_split="medium"),
            "eval_split must be one of 'train', 'sparse', 'dense', got 'medium'",
        ),
        (
            lambda: make_task("flipflop", eval_split="medium"),
            "eval_split must be one of 'train', 'sparse', 'dense', got 'medium'",
        ),
        (
            lambda: make_task("copy", eval_split="dense"),
            "eval_split is an option of the 'flipflop' task, got task 'copy'",
        ),
        (
            lambda: make_task("flipflop", num_vars=3),
            "num_vars is an option of the 'counting' task, got task 'flipflop'",
        ),
        (
            lambda: make_task("counting").check_length("train_len", 5),
            "train_len must be >= 6, got 5",
        ),
        (
            lambda: make_task("flipflop").check_length("train_len", 4),
            "train_len must be >= 5, got 4",
        ),
    ],
    ids=[
        "num_vars=0",
        "num_vars=6",
        "make_task num_vars=6",
        "eval_examples=0",
        "p_ignore=1",
        "p_ignore<0",
        "unknown split",
        "make_task unknown split",
        "split for copy",
        "num_vars for flipflop",
        "counting too short",
        "flipflop too short",
    ],
)
def test_bad_inputs(make, message: str) -> None:
    with pytest.raises(PosEncError, match=re.escape(message)):
        make()
