"""The tasks of a length-generalization study: ``lm`` and six synthetic ones.

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
- ``counting`` (CoPE's counting task, Golovneva et al., 2024): a program of
  ``v = 0 ;``, ``v ++;`` and ``pass;`` statements, then ``print v`` and the
  value, scored (:class:`CountingTask`; its own word vocabulary).
- ``flipflop`` (Liu et al., 2023): ``BOS`` then write/ignore/read instructions
  with bits, each read bit (the latest written one) scored
  (:class:`FlipFlopTask`; its own vocabulary).

Synthetic training draws each row's size ``n`` uniformly from ``1..n_max(L)``
(the largest that fits the training length ``L``) and pads on the right;
evaluation at length ``E`` uses the largest size that fits ``E``. Right padding
never changes a causal model's predictions before it. (``counting`` draws its
sizes with the paper's weights and cuts a program to fit; ``flipflop`` rows are
always full length: see their classes.)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import ClassVar

import torch

from posenc._errors import PosEncError, check_choice, check_float, check_int
from posenc.experiments.data import VOCAB_SIZE, Corpus, load_stdlib_corpus
from posenc.experiments.seeding import generator

__all__ = [
    "COUNTING_WORDS",
    "FLIPFLOP_SPLITS",
    "FLIPFLOP_WORDS",
    "IGNORE",
    "TASKS",
    "AdditionTask",
    "Batch",
    "CopyTask",
    "CountingTask",
    "FlipFlopTask",
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


# --- counting (Golovneva et al., 2024, CoPE, section 4.2) -------------------------------

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
    the program. As the paper's generator, ``projects/cope/scripts/count_data_gen.py`` of
    facebookresearch/RAM, draws it:

    - each statement is ``v = 0 ;`` (set: weight 1, ``v`` uniform over the ``num_vars``
      names, an already set one reset to 0), ``pass;`` (weight 50) or ``v ++;``
      (increment: weight 7, ``v`` uniform over the variables set so far); a draw that
      cannot be done (an increment before any set, or of a variable already at
      ``MAX_VAL = 10``) is drawn again (``OP_WEIGHTS``, ``MAX_VAL``, ``generate_op``,
      ``generate_statement``). Here that rejection is done exactly in one draw: weights 1,
      50 and ``7 m / k`` with ``k`` variables set, ``m`` of them below 10;
    - the question ``print v`` asks a variable uniform over those set, so a program with
      no set is discarded whole and drawn again, size included (``try_generate_sample``,
      ``generate_sample``). Here the size is drawn with weight ``1 - (50/51)^n`` (the
      chance that ``n`` statements set something) and the first set's place from its
      truncated geometric law (only ``pass;`` and sets can come before it), which is the
      same distribution without the retries;
    - sizes: ``n`` uniform in ``3..max_steps`` (``--max-steps 512``) there; ``--nvars``
      defaults to 3 (``run.sh`` trains 3 and 5 variables); no BOS (the word tokenizer of
      ``src/data/tokenizer.py`` ignores ``add_bos``); training scores the answer only
      (``--train-on answer``).

    Length: statements take 1, 4 or 2 tokens, so a program's length is random. Training
    at length ``L`` draws ``n`` in ``1..n_max(L)`` (``n_max(L) = L - 5``: ``n`` statements
    all ``pass;`` but one set, plus ``print v``), and evaluation at ``E`` draws
    ``n_max(E)`` statements (more statements at longer lengths: the generalization axis);
    a program is cut after its last statement that fits (the paper's loader cuts rows
    past its ``block_size`` 512 too, from the left; cutting from the right keeps the set
    the answer depends on, which always fits) and padded on the right.

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
        rows, n_max, v = sizes.numel(), int(sizes.max()), self.num_vars
        q = _PASS_WEIGHT / (_PASS_WEIGHT + _SET_WEIGHT)
        # The first set's index t < n: P(t) ~ q^t (inverse CDF of the truncated geometric);
        # only pass; comes before it.
        u = torch.rand(rows, generator=g, dtype=torch.float64)
        first = torch.floor(torch.log1p(-u * (1 - q ** sizes.double())) / math.log(q)).long()
        first = torch.minimum(first, sizes - 1)
        first_var = torch.randint(0, v, (rows,), generator=g)
        # After it, the paper's retries are a stream of i.i.d. candidates of which the
        # increments of a variable at the maximum are dropped: draw enough of them.
        need = sizes - first - 1
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
                break
        # statements: t passes, the first set, then the accepted candidates
        j = torch.arange(n_max)
        idx = (j - first[:, None] - 1).clamp(min=0)
        op_s = torch.where(
            j < first[:, None],
            _OP_PASS,
            torch.where(j == first[:, None], _OP_SET, op_c.gather(1, idx)),
        )
        var_s = torch.where(j == first[:, None], first_var[:, None], var_c.gather(1, idx))
        # keep the statements that fit (a prefix: the first set always does)
        width = _WIDTH[op_s]
        keep = (j < sizes[:, None]) & (width.cumsum(1) <= length - 2)  # then print v
        op_s = torch.where(keep, op_s, _OP_NONE)
        width = _WIDTH[op_s]
        used = width.sum(1)
        # the value of each variable after the program: increments since its last set
        names = torch.arange(v)
        sets = (op_s == _OP_SET)[..., None] & (var_s[..., None] == names)  # [rows, n, v]
        incs = (op_s == _OP_INC)[..., None] & (var_s[..., None] == names)
        last_set = torch.where(sets, j[:, None], -1).amax(1)  # [rows, v]
        value = (incs & (j[:, None] > last_set[:, None, :])).sum(1)
        is_set = last_set >= 0
        # the question: a variable uniform over those set
        k = is_set.sum(1)
        u_ask = torch.rand(rows, generator=g, dtype=torch.float64)
        r = (u_ask * k.double()).long().clamp(max=k - 1)
        asked = _nth_true(is_set, r)
        answer = value.gather(1, asked[:, None])[:, 0]
        # lay the statements out: [rows, n, 4] words, of which the first width are real
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
        for rows in _chunks(self.eval_examples, length, max_tokens, rank, world_size):
            yield full.rows(rows)


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


# --- flip-flop (Liu et al., 2023) ---------------------------------------------------------

#: The flip-flop task's words, indexed by token.
FLIPFLOP_WORDS: tuple[str, ...] = ("<pad>", "<bos>", "w", "i", "r", "0", "1")
_F_BOS, _F_W, _F_I, _F_R, _F_BIT0 = 1, 2, 3, 4, 5

#: The ignore probability of each flip-flop eval split ("train" is the task's own).
FLIPFLOP_SPLITS: dict[str, float | None] = {"train": None, "sparse": 0.98, "dense": 0.1}


class FlipFlopTask(Task):
    """Flip-flop language modelling (Liu et al., 2023, "Exposing Attention Glitches with
    Flip-Flop Language Modeling").

    ``BOS x_1 b_1 .. x_T b_T``: instructions ``w`` (write), ``i`` (ignore), ``r`` (read),
    each followed by a bit. ``x_1`` is ``w`` and ``x_T`` is ``r``; in between each is ``i``
    with probability ``p_ignore`` and ``w`` or ``r`` with ``(1 - p_ignore) / 2`` each. The
    bits after ``w`` and ``i`` are uniform; the bit after ``r`` is the bit of the latest
    ``w``, and only those read bits are scored: exact match is "every read right" and
    token accuracy is one minus the read error rate.

    The paper trains on FFL(0.8) (``p_ignore = 0.8``) at a fixed length and measures read
    errors in distribution and on a sparse split (FFL(0.98), long stretches of ``i``
    between a write and its read) and a dense one (FFL(0.1)): Transformers make rare,
    sporadic read errors, most of all on the sparse split ("attention glitches"), which
    a 1-layer LSTM trained the same way does not make (no errors).

    Length: a row of ``L`` tokens holds ``T = (L - 1) // 2`` instructions (``2 T + 1``
    tokens with BOS; one pad when ``L`` is even). Every training row is full length
    (the paper trains at a fixed length), and evaluation at a longer ``E`` holds more
    instructions, drawn with the ``eval_split``'s ``p_ignore``.

    Args:
        train_p_ignore: ``p_ignore`` of training, in ``[0, 1)`` (the paper's 0.8).
        eval_split: ``"sparse"`` (0.98), ``"dense"`` (0.1) or ``"train"`` (``train_p_ignore``).
        eval_examples: rows of each eval set.
    """

    name: ClassVar[str] = "flipflop"
    metric: ClassVar[str] = "accuracy"
    words: ClassVar[tuple[str, ...]] = FLIPFLOP_WORDS

    def __init__(
        self, *, train_p_ignore: float = 0.8, eval_split: str = "sparse", eval_examples: int = 256
    ) -> None:
        self.train_p_ignore = _check_p_ignore("train_p_ignore", train_p_ignore)
        self.eval_split = check_choice("eval_split", eval_split, tuple(FLIPFLOP_SPLITS))
        split_p = FLIPFLOP_SPLITS[eval_split]
        self.eval_p_ignore = self.train_p_ignore if split_p is None else split_p
        self.eval_examples = check_int("eval_examples", eval_examples, min=1)
        self.vocab_size = len(FLIPFLOP_WORDS)

    def min_length(self) -> int:
        return 5  # BOS w b r b

    def extra_splits(self) -> dict[str, Task]:
        return {
            split: FlipFlopTask(
                train_p_ignore=self.train_p_ignore,
                eval_split=split,
                eval_examples=self.eval_examples,
            )
            for split in FLIPFLOP_SPLITS
            if split != self.eval_split
        }

    def num_eval_rows(self, length: int) -> int:
        return self.eval_examples

    def size_for(self, length: int) -> int:
        """How many instructions a row of ``length`` tokens holds."""
        return (length - 1) // 2

    def _rows(self, rows: int, length: int, p_ignore: float, g: torch.Generator) -> Batch:
        t = self.size_for(length)
        u = torch.rand(rows, t, generator=g, dtype=torch.float64)
        ops = torch.where(
            u < p_ignore, _F_I, torch.where(u < p_ignore + (1 - p_ignore) / 2, _F_W, _F_R)
        )
        ops[:, 0], ops[:, -1] = _F_W, _F_R
        bits = torch.randint(0, 2, (rows, t), generator=g)
        is_w = ops == _F_W
        latest = torch.where(is_w, torch.arange(t), -1).cummax(1).values  # >= 0: x_1 is w
        is_r = ops == _F_R
        bits = torch.where(is_r, bits.gather(1, latest), bits)
        tokens = torch.full((rows, length), PAD, dtype=torch.long)
        targets = torch.full((rows, length), IGNORE, dtype=torch.long)
        tokens[:, 0] = _F_BOS
        tokens[:, 1 : 2 * t + 1 : 2] = ops
        tokens[:, 2 : 2 * t + 2 : 2] = bits + _F_BIT0
        # the r token predicts its bit
        targets[:, 1 : 2 * t + 1 : 2] = torch.where(is_r, bits + _F_BIT0, IGNORE)
        return Batch(tokens, targets)

    def train_batch(self, step: int, batch_size: int, seq_len: int, *, seed: int) -> Batch:
        g = generator(seed, f"{self.name}-train", step)
        return self._rows(batch_size, seq_len, self.train_p_ignore, g)

    def eval_batches(
        self, length: int, *, seed: int, max_tokens: int, rank: int = 0, world_size: int = 1
    ) -> Iterator[Batch]:
        g = generator(seed, f"{self.name}-eval-{self.eval_split}", length)
        full = self._rows(self.eval_examples, length, self.eval_p_ignore, g)
        for rows in _chunks(self.eval_examples, length, max_tokens, rank, world_size):
            yield full.rows(rows)


def _check_p_ignore(name: str, value: float) -> float:
    value = check_float(name, value, min=0.0)
    if value >= 1.0:
        raise PosEncError(f"{name} must be < 1, got {value}")
    return value


TASKS: dict[str, type[Task]] = {
    "lm": LMTask,
    "copy": CopyTask,
    "reverse": ReverseTask,
    "recall": RecallTask,
    "addition": AdditionTask,
    "counting": CountingTask,
    "flipflop": FlipFlopTask,
}


def make_task(
    name: str,
    *,
    eval_tokens: int = 32768,
    eval_examples: int = 256,
    num_vars: int | None = None,
    eval_split: str | None = None,
) -> Task:
    """The task called ``name`` (one of :data:`TASKS`).

    ``num_vars`` (``counting``) and ``eval_split`` (``flipflop``) are passed to the task
    that takes them, None meaning its default; given to another task, they are an error.

    Examples:
        >>> task = make_task("copy")
        >>> batch = task.train_batch(0, 2, 9, seed=0)
        >>> batch.tokens.shape, task.size_for(9)
        (torch.Size([2, 9]), 4)
        >>> make_task("flipflop", eval_split="dense").eval_p_ignore
        0.1
    """
    check_choice("task", name, tuple(TASKS))
    for option, value, owner in (
        ("num_vars", num_vars, "counting"),
        ("eval_split", eval_split, "flipflop"),
    ):
        if value is not None and name != owner:
            raise PosEncError(f"{option} is an option of the {owner!r} task, got task {name!r}")
    if name == "lm":
        return LMTask(eval_tokens=eval_tokens)
    if name == "counting":
        return CountingTask(
            num_vars=3 if num_vars is None else num_vars, eval_examples=eval_examples
        )
    if name == "flipflop":
        return FlipFlopTask(
            eval_split="sparse" if eval_split is None else eval_split, eval_examples=eval_examples
        )
    return TASKS[name](eval_examples=eval_examples)  # type: ignore[call-arg]
