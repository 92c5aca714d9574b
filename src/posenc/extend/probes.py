"""RULER-style probes for ``posenc extend``: haystacks with needles of several tasks, the
questions asked of them, and RULER's scoring (Hsieh et al. 2024, "RULER: What's the real
context size of your long-context language models?"; the tasks of NVIDIA/RULER
``scripts/data/synthetic/niah.py`` and ``variable_tracking.py``, in posenc's own words).

A *haystack* is the instruction (with the model's BOS), then the filler (the perplexity
document's tokens, special tokens left out, repeated as needed, from a seeded phase) with
every task's needles inserted, each on a line of its own. Its *probes* are questions put
after it; one prefill of the haystack answers them all (:mod:`posenc.extend.asking`).
The tasks, with the counts of :data:`COUNTS`:

- ``passkey``: one pass key (five digits), asked once;
- ``multikey``: several keys (``adjective-noun``) with a seven-digit number each, every
  key asked once (one probe per key);
- ``multivalue``: one key with several numbers, asked once for all of them;
- ``vartrack``: chains ``VAR ABCDE = 12345``, ``VAR FGHIJ = VAR ABCDE``, ...; a probe per
  chain asks which variables hold its value (every name of the chain).

**Where needles go.** A task's needles of one key or chain form a group; a group of ``k``
needles sits at fractions ``(phase + e) / k`` of the haystack (``e = 0 .. k - 1``), in
order, so a chain's hops spread over the whole text; single-needle groups take one phase
per stratum (the passkey and the keys never cluster). Fractions map through the quantile
function of ``depths`` (evenly spaced ``depths`` spread needles evenly between the least
and the greatest; one depth puts them all there), then to a token of the filler, moved to
just after a newline token if one is within :data:`SNAP` tokens. Everything random comes
from ``random.Random(f"{seed}-{length}-{index}")``: the same arguments give the same
haystacks (the same prompts for every scaling at one length).

**Scoring** is RULER's ``string_match_all``: the fraction of a probe's answers found in
its output, ignoring case.
"""

from __future__ import annotations

import dataclasses
import math
import random
import string
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from posenc._errors import (
    PosEncError,
    check_alloc,
    check_choice,
    check_float,
    check_int,
    describe,
)

__all__ = [
    "CHANCE",
    "COUNTS",
    "TASKS",
    "Haystack",
    "Probe",
    "haystacks",
    "score",
    "summarize",
    "wilson",
]

#: The probe tasks, in the order results show them.
TASKS = ("passkey", "multikey", "multivalue", "vartrack")

#: The score of an answer that ignores the haystack. Every answer is drawn afresh from a
#: space far larger than any guess covers (five- and seven-digit numbers; variable names
#: of five capital letters, 26**5 of them), so a guess that did not read the needles
#: matches with probability at most 1e-5: chance is 0 for every task.
CHANCE: Mapping[str, float] = {task: 0.0 for task in TASKS}

#: Needles per haystack: keys of ``multikey`` (one probe each), keys and values per key of
#: ``multivalue`` (one probe per key), chains and hops per chain of ``vartrack`` (one
#: probe per chain; a chain of ``h`` hops names ``h + 1`` variables). 8 probes in all.
COUNTS: Mapping[str, int] = {
    "multikey_keys": 4,
    "multivalue_keys": 1,
    "multivalue_values": 4,
    "vartrack_chains": 2,
    "vartrack_hops": 4,
}

#: How far (tokens) a needle may move to sit just after a newline of the filler.
SNAP = 48

#: Tokens a probe may decode past the length of its answers written out.
MARGIN = 4

_INSTRUCTION = (
    "The long text below hides a few facts among its lines: a pass key, special magic "
    "numbers, and chains of variable assignments. Memorize them all; questions about "
    "them follow the text.\n\n"
)
_PASSKEY = "The pass key is {0}. Remember it. {0} is the pass key."
_NUMBER = "A special magic number for {0} is: {1}."
_VALUE = "VAR {0} = {1}."
_HOP = "VAR {0} = VAR {1}."
_QUESTIONS = {
    "passkey": "\n\nWhat is the pass key? The pass key is",
    "multikey": (
        "\n\nQuestion: What is the special magic number for {0} in the text above?\n"
        "Answer: The special magic number for {0} is"
    ),
    "multivalue": (
        "\n\nQuestion: What are all the special magic numbers for {0} in the text above?\n"
        "Answer: The special magic numbers for {0} are"
    ),
    "vartrack": (
        "\n\nQuestion: Which variables in the text above are assigned the value {0}, "
        "directly or through another variable?\nAnswer: The variables assigned the value "
        "{0} are"
    ),
}
_ADJECTIVES = (
    "amber", "brave", "calm", "dusty", "eager", "faint", "gentle", "hollow", "icy",
    "jolly", "keen", "lucky", "mellow", "noble", "odd", "proud", "quiet", "rapid",
    "silent", "tidy", "upbeat", "vivid", "witty", "young",
)  # fmt: skip
_NOUNS = (
    "anchor", "badger", "candle", "dragon", "engine", "falcon", "garden", "harbor",
    "island", "jacket", "kettle", "lantern", "meadow", "needle", "orchid", "pepper",
    "quarry", "ribbon", "saddle", "tunnel", "umbrella", "violin", "walnut", "yacht",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Probe:
    """One question about a haystack: ``question`` (token ids put after the haystack,
    ending where the answer starts), the ``answers`` all expected in the output, the
    ``depth`` of its first needle (the fraction of the filler before it), and
    ``max_new_tokens`` (enough to write every answer out)."""

    id: str
    task: str
    question: tuple[int, ...]
    answers: tuple[str, ...]
    depth: float
    max_new_tokens: int


@dataclasses.dataclass(frozen=True)
class Haystack:
    """One haystack: its ``index``, its token ``ids`` (the model's BOS first, if it takes
    one) with every needle in place, the ``probes`` asked after it, and ``needles``: the
    ``[start, stop)`` spans of ``ids`` that are not the filler's text (the instruction and
    each needle), which the haystack's perplexity leaves out."""

    index: int
    ids: tuple[int, ...]
    probes: tuple[Probe, ...]
    needles: tuple[tuple[int, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class _Group:
    """The needles of one probe (one key, one chain), in the order they must appear."""

    task: str
    key: str  # what the question names
    needles: tuple[str, ...]
    answers: tuple[str, ...]


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _numbers(rng: random.Random, digits: int, count: int, used: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < count:
        value = str(rng.randrange(10 ** (digits - 1), 10**digits))
        if value not in used:
            used.add(value)
            out.append(value)
    return out


def _names(rng: random.Random, count: int) -> list[str]:
    out: list[str] = []
    while len(out) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in out:
            out.append(name)
    return out


def _groups(rng: random.Random, tasks: Sequence[str]) -> list[_Group]:
    """Every task's needles, grouped per probe, in :data:`TASKS` order."""
    used: set[str] = set()
    groups: list[_Group] = []
    if "passkey" in tasks:
        (key,) = _numbers(rng, 5, 1, used)
        groups.append(_Group("passkey", key, (_PASSKEY.format(key),), (key,)))
    n_keys = COUNTS["multikey_keys"] * ("multikey" in tasks)
    n_keys += COUNTS["multivalue_keys"] * ("multivalue" in tasks)
    words = [f"{a}-{n}" for a in _ADJECTIVES for n in _NOUNS]
    keys = iter(rng.sample(words, n_keys))
    if "multikey" in tasks:
        for key in (next(keys) for _ in range(COUNTS["multikey_keys"])):
            (value,) = _numbers(rng, 7, 1, used)
            groups.append(_Group("multikey", key, (_NUMBER.format(key, value),), (value,)))
    if "multivalue" in tasks:
        for key in (next(keys) for _ in range(COUNTS["multivalue_keys"])):
            values = _numbers(rng, 7, COUNTS["multivalue_values"], used)
            needles = tuple(_NUMBER.format(key, v) for v in values)
            groups.append(_Group("multivalue", key, needles, tuple(values)))
    if "vartrack" in tasks:
        hops, chains = COUNTS["vartrack_hops"], COUNTS["vartrack_chains"]
        names = _names(rng, chains * (hops + 1))
        for c in range(chains):
            chain = names[c * (hops + 1) : (c + 1) * (hops + 1)]
            (value,) = _numbers(rng, 5, 1, used)
            lines = [_VALUE.format(chain[0], value)]
            lines += [_HOP.format(chain[j + 1], chain[j]) for j in range(hops)]
            groups.append(_Group("vartrack", value, tuple(lines), tuple(chain)))
    return groups


def _fractions(rng: random.Random, groups: Sequence[_Group]) -> list[list[float]]:
    """Each group's needle fractions in ``[0, 1)``: ``(phase + e) / k``, the phase drawn
    in a stratum of its own (in a random order) among the single-needle groups, and
    likewise among the others, so that no two groups' needles fall together."""
    phases: dict[int, float] = {}
    for single in (True, False):
        members = [i for i, g in enumerate(groups) if (len(g.needles) == 1) == single]
        strata = rng.sample(range(len(members)), len(members))
        for i, s in zip(members, strata, strict=True):
            phases[i] = (s + rng.random()) / len(members)
    return [
        [(phases[i] + e) / len(g.needles) for e in range(len(g.needles))]
        for i, g in enumerate(groups)
    ]


def _quantile(depths: Sequence[float], u: float) -> float:
    """The quantile function of ``depths`` (sorted) at ``u``, linear between them."""
    if len(depths) == 1:
        return depths[0]
    x = u * (len(depths) - 1)
    i = min(int(x), len(depths) - 2)
    return depths[i] + (x - i) * (depths[i + 1] - depths[i])


def _snap(stream: Sequence[int], at: int, newlines: frozenset[int]) -> int:
    """``at`` moved to just after the nearest newline token within :data:`SNAP` tokens
    (the earlier of two as near), or left where it is."""
    for step in range(SNAP + 1):
        for j in (at - step, at + step):
            if 0 < j <= len(stream) and stream[j - 1] in newlines:
                return j
    return at


def _questions(tokenizer: Any, groups: Sequence[_Group]) -> list[list[int]]:
    return [_ids(tokenizer, _QUESTIONS[g.task].format(g.key)) for g in groups]


def _budget(tokenizer: Any, answers: Sequence[str]) -> int:
    return len(_ids(tokenizer, " " + ", ".join(answers) + ".")) + MARGIN


def _assemble(
    stream: Sequence[int],
    needles: Sequence[Sequence[list[int]]],
    fractions: Sequence[Sequence[float]],
    plan: Mapping[str, Any],
) -> tuple[list[int], list[float], list[tuple[int, int]]]:
    """The haystack's ids (the instruction, then the filler with the ``needles`` of each
    group in place), the depth of each group's first needle, and the spans of the
    instruction and of every needle."""
    head, depths, newlines = plan["head"], plan["depths"], plan["newlines"]
    at = []  # (token of the filler, fraction, group, needle)
    for g, group in enumerate(needles):
        for e in range(len(group)):
            u = fractions[g][e]
            at.append((_snap(stream, round(_quantile(depths, u) * len(stream)), newlines), u, g, e))
    at.sort()
    ids, done, first = list(head), 0, [math.nan] * len(needles)
    spans = [(0, len(head))]
    for cut, _, g, e in at:
        ids += stream[done:cut]
        done = cut
        if e == 0:
            first[g] = round(cut / len(stream), 4)
        spans.append((len(ids), len(ids) + len(needles[g][e])))
        ids += needles[g][e]
    ids += stream[done:]
    return ids, first, spans


def _brief(value: Any) -> str:
    """``value`` as a message shows it, a long container by its type and length alone (a
    document's tokens are not dumped into a message)."""
    shown = describe(value)
    if len(shown) <= 80:
        return shown
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    if hasattr(value, "__len__"):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"{shown[:60]}... (a {type(value).__name__})"


def _sequence(name: str, value: Any, what: str) -> None:
    """Refuse anything but a list or tuple (a set has no order; a string, a dict, ... are
    no sequence of ``what``)."""
    if not isinstance(value, (list, tuple)):
        raise PosEncError(f"{name} must be a list or tuple of {what}, got {_brief(value)}")


def _check_tasks(tasks: Sequence[str]) -> tuple[str, ...]:
    _sequence("tasks", tasks, "task names")
    names = tuple(tasks)
    for name in names:
        check_choice("tasks", name, TASKS)
    if not names or len(set(names)) != len(names):
        raise PosEncError(
            f"tasks must name each task at most once, and one at least, got {describe(names)}"
        )
    return tuple(t for t in TASKS if t in names)


def _check_depths(depths: Sequence[float]) -> tuple[float, ...]:
    _sequence("depths", depths, "fractions")
    out = tuple(sorted(check_float("depths", d, min=0.0, max=1.0) for d in depths))
    if not out:
        raise PosEncError("depths must hold one fraction at least, got none")
    return out


def _vocabulary(tokenizer: Any) -> int | None:
    """How many token ids ``tokenizer`` has (its added tokens too), if it says."""
    for size in (getattr(tokenizer, "__len__", None), getattr(tokenizer, "vocab_size", None)):
        size = size() if callable(size) else size
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size
    return None


def _token(i: int, value: Any) -> int:
    try:
        return check_int(f"filler[{i}]", value)
    except PosEncError:
        raise PosEncError(f"filler[{i}] must be an integer token id, got {_brief(value)}") from None


def _check_filler(filler: Any, tokenizer: Any) -> list[int]:
    """``filler`` as a list of token ids, each an integer id of ``tokenizer``."""
    _sequence("filler", filler, "token ids")
    ids = [t if type(t) is int else _token(i, t) for i, t in enumerate(filler)]
    vocabulary = _vocabulary(tokenizer)
    top = (1 << 63) if vocabulary is None else vocabulary
    if ids and not (0 <= min(ids) and max(ids) < top):
        i, bad = next((i, t) for i, t in enumerate(ids) if not 0 <= t < top)
        held = "in 0..2**63 - 1" if vocabulary is None else f"in 0..{top - 1} (the tokenizer's)"
        raise PosEncError(f"filler[{i}] must be a token id {held}, got {bad}")
    return ids


def _one(tokenizer: Any, stream: Sequence[int], length: int, rng: random.Random, plan: Any) -> Any:
    """One haystack's ids, probes' questions, groups and first-needle depths."""
    groups = _groups(rng, plan["tasks"])
    fractions = _fractions(rng, groups)
    questions = _questions(tokenizer, groups)
    needles = [[_ids(tokenizer, f"\n{n}\n") for n in g.needles] for g in groups]
    size = sum(len(n) for group in needles for n in group)
    room = length - max(len(q) for q in questions) - len(plan["head"]) - size
    if room < size:
        need = length - room + size
        raise PosEncError(
            f"length must leave room for probes of {', '.join(plan['tasks'])} (the "
            f"instruction, the needles, the longest question, and as much filler as "
            f"needles: {need} tokens), got {length}"
        )
    phase = rng.randrange(len(stream))
    filler = (list(stream) * (room // len(stream) + 2))[phase : phase + room]
    ids, first, spans = _assemble(filler, needles, fractions, plan)
    return ids, questions, groups, first, spans


def haystacks(
    tokenizer: Any,
    filler: Sequence[int],
    length: int,
    *,
    seed: int,
    tasks: Sequence[str],
    count: int,
    depths: Sequence[float],
) -> list[Haystack]:
    """``count`` haystacks whose every prompt (haystack and question) has at most
    ``length`` tokens (the longest exactly), each with needles of every task of ``tasks``
    spread over ``depths``, on ``filler`` (token ids; its special tokens left out).
    Refused (``PosEncError``) where ``length`` leaves less filler than needles."""
    length = check_int("length", length, min=1)
    seed = check_int("seed", seed, min=0)
    count = check_int("count", count, min=0)
    # the token ids held: every haystack's, as Python's pointers (8 bytes each)
    check_alloc("length", length, (length,), torch.int64)
    check_alloc("count", count, (count, length), torch.int64)
    names = _check_tasks(tasks)
    plan: dict[str, Any] = {
        "tasks": names,
        "depths": _check_depths(depths),
        "head": list(tokenizer(_INSTRUCTION)["input_ids"]),  # the model's BOS, if it takes one
    }
    specials = set(getattr(tokenizer, "all_special_ids", ()) or ())
    stream = [t for t in _check_filler(filler, tokenizer) if t not in specials]
    if not stream:
        raise PosEncError(
            f"filler must hold a token that is not a special token, got {len(filler)} tokens"
        )
    plan["newlines"] = frozenset(t for t in set(stream) if tokenizer.decode([t]).endswith("\n"))
    out = []
    for index in range(count):
        rng = random.Random(f"{seed}-{length}-{index}")
        ids, questions, groups, first, spans = _one(tokenizer, stream, length, rng, plan)
        seen: dict[str, int] = {}
        probes = []
        for group, question, depth in zip(groups, questions, first, strict=True):
            k = seen[group.task] = seen.get(group.task, -1) + 1
            probes.append(
                Probe(
                    id=f"h{index}-{group.task}-{k}",
                    task=group.task,
                    question=tuple(question),
                    answers=group.answers,
                    depth=depth,
                    max_new_tokens=_budget(tokenizer, group.answers),
                )
            )
        out.append(Haystack(index, tuple(ids), tuple(probes), tuple(spans)))
    return out


def score(output: str, answers: Sequence[str]) -> float:
    """RULER's string match: the fraction of ``answers`` found in ``output``, ignoring
    case (``"1234567"`` in ``" 1234567."`` counts)."""
    if not isinstance(output, str):
        raise PosEncError(f"output must be a string, got {_brief(output)}")
    if (
        not isinstance(answers, (list, tuple))
        or not answers
        or not all(isinstance(a, str) and a for a in answers)
    ):
        raise PosEncError(
            f"answers must be a non-empty list or tuple of non-empty strings, got {_brief(answers)}"
        )
    text = output.lower()
    return sum(a.lower() in text for a in answers) / len(answers)


def wilson(mean: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval ``(low, high)`` of a proportion ``mean`` over ``n`` trials
    (95 % at the default ``z``): ``(p + z^2 / 2n -+ z sqrt(p (1 - p) / n + z^2 / 4n^2)) /
    (1 + z^2 / n)``, within ``[0, 1]`` and holding ``mean``."""
    mean = check_float("mean", mean, min=0.0, max=1.0)
    n = check_int("n", n, min=1)
    z = check_float("z", z, min=0.0, min_exclusive=True)
    z2 = z * z
    centre = (mean + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(mean * (1 - mean) / n + z2 / (4 * n * n))
    return max(0.0, min(mean, centre - half)), min(1.0, max(mean, centre + half))


def summarize(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task of ``rows`` (probe records, each with ``task`` and ``score``), in
    :data:`TASKS` order: ``{"score": mean, "probes": n, "low", "high"}`` (the Wilson
    interval of the mean over the probes)."""
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Iterable):
        raise PosEncError(f"rows must be a list of probe records, got {_brief(rows)}")
    scores: dict[str, list[float]] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise PosEncError(
                f"rows[{i}] must be a probe record (a dict with 'task' and 'score'), got "
                f"{_brief(row)}"
            )
        where = f"rows[{i}]" + (f" (probe {row['id']})" if isinstance(row.get("id"), str) else "")
        task = check_choice(f"{where} task", row.get("task"), TASKS)
        value = check_float(f"{where} score", row.get("score"), min=0.0, max=1.0)
        scores.setdefault(task, []).append(value)
    out = {}
    for task in (t for t in TASKS if t in scores):
        values = scores[task]
        mean = sum(values) / len(values)
        low, high = wilson(mean, len(values))
        out[task] = {"score": mean, "probes": len(values), "low": low, "high": high}
    return out
