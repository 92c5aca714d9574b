"""``counting``: the counting task of CoPE (Golovneva et al., 2024, section 4.2).

A program of ``v = 0 ;``, ``v ++;`` and ``pass;`` statements, then ``print v`` and the
value, scored (:class:`CountingTask`; its own word vocabulary). Programs are drawn in
whole tensors: the first set, a stream of candidate statements with the paper's
rejections done exactly, the statements that fit, the values, the question, the layout
in words (one function each below).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import ClassVar

import torch

from posenc._errors import check_int
from posenc.experiments.seeding import generator
from posenc.experiments.tasks.base import IGNORE, PAD, Batch, Task, eval_shards

__all__ = ["COUNTING_WORDS", "CountingTask"]

#: The counting task's words, indexed by token (its own vocabulary, as the paper's word-level
#: tokenizer splits the statements on spaces: ``a = 0 ;``, ``a ++;``, ``pass;``).
COUNTING_WORDS: tuple[str, ...] = (
    "<pad>",
    "pass;",
    "=",
    ";",
    "++;",
    "print",
    *"abcde",
    *(str(v) for v in range(11)),
)
_C_PASS, _C_EQ, _C_SEMI, _C_INC, _C_PRINT = 1, 2, 3, 4, 5
_C_VAR = 6  # a..e
_C_VALUE = _C_VAR + 5  # "0".."10"
_C_MAX_VALUE = 10
# Ops as drawn; widths in tokens of each statement.
_OP_PASS, _OP_SET, _OP_INC, _OP_NONE = 0, 1, 2, 3
_WIDTH = torch.tensor([1, 4, 2, 0])
_SET_WEIGHT, _PASS_WEIGHT, _INC_WEIGHT = 1.0, 50.0, 7.0


class CountingTask(Task):
    """The counting task of CoPE (Golovneva et al., 2024, section 4.2, Table 3).

    A row is a program of ``n`` statements on variables ``a``, ``b``, .. (the first
    ``num_vars`` letters), then a question and its answer, word tokens::

        pass; a = 0 ; pass; a ++; b = 0 ; pass; a ++; print a 2

    The answer (the last word, the only scored token) is the asked variable's value after
    the program. Programs are drawn from the same distribution as the paper's generator
    (``count_data_gen.py`` of facebookresearch/RAM), its rejections done exactly in one
    draw. Training at length ``L`` draws up to ``L - 5`` statements, evaluation at ``E``
    exactly ``E - 5``, cut after the last statement that fits and padded on the right. How
    each is drawn, beside the paper's code: ``docs/lengthgen.md``.

    Args:
        num_vars: how many variables (1..5; the paper's default 3).
        eval_examples: rows of each eval set.
    """

    name: ClassVar[str] = "counting"
    metric: ClassVar[str] = "accuracy"
    words: ClassVar[tuple[str, ...]] = COUNTING_WORDS

    def __init__(self, *, num_vars: int = 3, eval_examples: int = 256) -> None:
        self.num_vars = check_int("num_vars", num_vars, min=1, max=5)
        self.eval_examples = check_int("eval_examples", eval_examples, min=1)
        self.vocab_size = len(COUNTING_WORDS)

    def min_length(self) -> int:
        return 6  # a = 0 ; print a

    def num_eval_rows(self, length: int) -> int:
        return self.eval_examples

    def size_for(self, length: int) -> int:
        """The most statements a row of ``length`` fed tokens is drawn with."""
        return length - 5

    def _program(self, sizes: torch.Tensor, length: int, g: torch.Generator) -> Batch:
        """Rows of ``sizes[i]`` statements, cut to fit ``length`` fed tokens."""
        v = self.num_vars
        first, first_var = _first_set(sizes, v, g)
        op_c, var_c = _candidates(sizes - first - 1, int(sizes.max()), first_var, v, g)
        op_s, var_s = _statements(first, first_var, op_c, var_c, int(sizes.max()))
        op_s = _fit(op_s, sizes, length)
        value, is_set = _values(op_s, var_s, v)
        asked, answer = _question(value, is_set, g)
        return _lay_out(op_s, var_s, asked, answer, length)

    def _sizes(self, rows: int, n_max: int, g: torch.Generator) -> torch.Tensor:
        n = torch.arange(1, n_max + 1, dtype=torch.float64)
        weight = 1 - (_PASS_WEIGHT / (_PASS_WEIGHT + _SET_WEIGHT)) ** n
        return torch.multinomial(weight, rows, replacement=True, generator=g) + 1

    def train_batch(self, step: int, batch_size: int, seq_len: int, *, seed: int) -> Batch:
        g = generator(seed, f"{self.name}-train", step)
        sizes = self._sizes(batch_size, self.size_for(seq_len), g)
        return self._program(sizes, seq_len, g)

    def eval_batches(
        self, length: int, *, seed: int, max_tokens: int, rank: int = 0, world_size: int = 1
    ) -> Iterator[Batch]:
        g = generator(seed, f"{self.name}-eval", length)
        sizes = torch.full((self.eval_examples,), self.size_for(length), dtype=torch.long)
        full = self._program(sizes, length, g)
        yield from eval_shards(full, length, max_tokens, rank, world_size)


def _nth_true(mask: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The index along the last dim of the ``r``-th (from 0) True of ``mask``."""
    return ((mask.cumsum(-1) == (r + 1)[..., None]) & mask).long().argmax(-1)


def _accepted(
    ops: torch.Tensor, picks: torch.Tensor, first_var: torch.Tensor, v: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The counting statements a stream of candidates ``[rows, N]`` gives after a first
    set of ``first_var``: (ops, variables), the accepted ones first, then ``_OP_NONE``.

    A candidate set names ``floor(pick * v)``; an increment names the ``floor(pick * k)``-th
    of the ``k`` variables set before it, and is dropped when that one is at the maximum
    (it has had 10 increments since its last set)."""
    rows, n = ops.shape
    names = torch.arange(v)
    t = torch.arange(n)
    set_var = (picks * v).long().clamp(max=v - 1)
    sets = (ops == _OP_SET)[..., None] & (set_var[..., None] == names)  # [rows, N, v]
    set_before = (sets.cumsum(1) - sets.long() > 0) | (names == first_var[:, None])[:, None]
    k = set_before.sum(-1)  # >= 1
    inc_var = _nth_true(set_before, (picks * k.double()).long().clamp(max=k - 1))
    var = torch.where(ops == _OP_SET, set_var, inc_var)
    incs = (ops == _OP_INC)[..., None] & (inc_var[..., None] == names)
    count = incs.long().cumsum(1)  # increments so far, this one included
    last_set = torch.where(sets, t[:, None], -1).cummax(1).values
    before = torch.where(last_set >= 0, count.gather(1, last_set.clamp(min=0)), 0)
    prior = (count - before).gather(-1, inc_var[..., None])[..., 0] - 1
    ok = (ops != _OP_INC) | (prior < _C_MAX_VALUE)
    # compact: the accepted candidates in order
    slot = torch.where(ok, ok.long().cumsum(1) - 1, n)
    op_c = torch.full((rows, n + 1), _OP_NONE, dtype=torch.long)
    var_c = torch.zeros(rows, n + 1, dtype=torch.long)
    op_c.scatter_(1, slot, ops)
    var_c.scatter_(1, slot, var)
    return op_c[:, :n], var_c[:, :n]


def _first_set(
    sizes: torch.Tensor, v: int, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The index and variable of each row's first set: the index ``t < n`` with ``P(t) ~ q^t``
    (the inverse CDF of the truncated geometric; only ``pass;`` comes before it)."""
    rows = sizes.numel()
    q = _PASS_WEIGHT / (_PASS_WEIGHT + _SET_WEIGHT)
    u = torch.rand(rows, generator=g, dtype=torch.float64)
    first = torch.floor(torch.log1p(-u * (1 - q ** sizes.double())) / math.log(q)).long()
    first = torch.minimum(first, sizes - 1)
    first_var = torch.randint(0, v, (rows,), generator=g)
    return first, first_var


def _candidates(
    need: torch.Tensor, n_max: int, first_var: torch.Tensor, v: int, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The statements after the first set, ``(ops, variables)`` ``[rows, N]`` with at least
    ``need`` accepted ones per row: the paper's retries are a stream of i.i.d. candidates of
    which the increments of a variable at the maximum are dropped, so enough are drawn
    (then twice as many, ...) and the accepted ones kept (:func:`_accepted`)."""
    rows = need.numel()
    ops = torch.empty(rows, 0, dtype=torch.long)
    picks = torch.empty(rows, 0, dtype=torch.float64)
    while True:
        more = max(n_max + n_max // 4 + 16, ops.shape[1])  # then doubling
        x = torch.rand(rows, more, generator=g, dtype=torch.float64) * (
            _SET_WEIGHT + _PASS_WEIGHT + _INC_WEIGHT
        )
        op = torch.where(
            x < _SET_WEIGHT,
            _OP_SET,
            torch.where(x < _SET_WEIGHT + _PASS_WEIGHT, _OP_PASS, _OP_INC),
        )
        ops = torch.cat([ops, op], 1)
        picks = torch.cat([picks, torch.rand(rows, more, generator=g, dtype=torch.float64)], 1)
        stream = [
            _accepted(ops[c], picks[c], first_var[c], v)
            for c in torch.arange(rows).split(max(1, 2**18 // ops.shape[1]))
        ]
        op_c = torch.cat([s[0] for s in stream])
        var_c = torch.cat([s[1] for s in stream])
        if bool(((op_c != _OP_NONE).sum(1) >= need).all()):
            return op_c, var_c


def _statements(
    first: torch.Tensor,
    first_var: torch.Tensor,
    op_c: torch.Tensor,
    var_c: torch.Tensor,
    n_max: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ops, variables)`` ``[rows, n_max]`` of the programs: ``first`` passes, the first
    set, then the accepted candidates."""
    j = torch.arange(n_max)
    idx = (j - first[:, None] - 1).clamp(min=0)
    op_s = torch.where(
        j < first[:, None],
        _OP_PASS,
        torch.where(j == first[:, None], _OP_SET, op_c.gather(1, idx)),
    )
    var_s = torch.where(j == first[:, None], first_var[:, None], var_c.gather(1, idx))
    return op_s, var_s


def _fit(op_s: torch.Tensor, sizes: torch.Tensor, length: int) -> torch.Tensor:
    """The ops with the statements past each row's size, or past ``length`` fed tokens with
    ``print v`` after them, made ``_OP_NONE`` (a prefix is kept: the first set always fits)."""
    j = torch.arange(op_s.shape[1])
    width = _WIDTH[op_s]
    keep = (j < sizes[:, None]) & (width.cumsum(1) <= length - 2)  # then print v
    return torch.where(keep, op_s, _OP_NONE)


def _values(op_s: torch.Tensor, var_s: torch.Tensor, v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each variable's value after the program (its increments since its last set)
    ``[rows, v]``, and whether it was set at all."""
    j = torch.arange(op_s.shape[1])
    names = torch.arange(v)
    sets = (op_s == _OP_SET)[..., None] & (var_s[..., None] == names)  # [rows, n, v]
    incs = (op_s == _OP_INC)[..., None] & (var_s[..., None] == names)
    last_set = torch.where(sets, j[:, None], -1).amax(1)  # [rows, v]
    value = (incs & (j[:, None] > last_set[:, None, :])).sum(1)
    return value, last_set >= 0


def _question(
    value: torch.Tensor, is_set: torch.Tensor, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The asked variable of each row (uniform over those set) and its value."""
    k = is_set.sum(1)
    u_ask = torch.rand(k.numel(), generator=g, dtype=torch.float64)
    r = (u_ask * k.double()).long().clamp(max=k - 1)
    asked = _nth_true(is_set, r)
    return asked, value.gather(1, asked[:, None])[:, 0]


def _lay_out(
    op_s: torch.Tensor, var_s: torch.Tensor, asked: torch.Tensor, answer: torch.Tensor, length: int
) -> Batch:
    """The rows in words: each statement's ``[rows, n, 4]`` words of which the first width
    are real, then ``print v`` and the scored answer; padded to ``length``."""
    rows = op_s.shape[0]
    width = _WIDTH[op_s]
    used = width.sum(1)
    var_tok = var_s + _C_VAR
    words = torch.stack(
        [
            torch.where(op_s == _OP_PASS, _C_PASS, var_tok),
            torch.where(op_s == _OP_SET, _C_EQ, _C_INC),
            torch.full_like(var_tok, _C_VALUE),  # "0"
            torch.full_like(var_tok, _C_SEMI),
        ],
        -1,
    )
    start = width.cumsum(1) - width
    where = start[..., None] + torch.arange(4)
    real = torch.arange(4) < width[..., None]
    flat = torch.full((rows, length + 1), PAD, dtype=torch.long)  # column length: dump
    flat.scatter_(1, torch.where(real, where, length).flatten(1), words.flatten(1))
    tokens = flat[:, :length]
    row = torch.arange(rows)
    tokens[row, used] = _C_PRINT
    tokens[row, used + 1] = asked + _C_VAR
    targets = torch.full((rows, length), IGNORE, dtype=torch.long)
    targets[row, used + 1] = answer + _C_VALUE
    return Batch(tokens, targets)
