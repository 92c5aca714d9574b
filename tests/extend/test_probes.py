"""The RULER-style probes of ``posenc extend``: haystacks (deterministic, within their
length, every needle in place), RULER's string-match score and the Wilson interval
against hand-worked values, and answering from one shared prefill: the same logits as a
fresh prefill of each prompt, on tiny random Llama and Gemma 3, with no ``[s, s]``
tensor built."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")

from tests._shapes import Shapes
from tests.extend._tiny import VOCAB, byte_tokenizer, tiny_gemma3, tiny_llama

from posenc import PosEncError
from posenc.extend import asking, probes
from posenc.extend.model import load_model, scaled, scaling_for

TEXT = (Path(__file__).resolve().parents[2] / "src" / "posenc" / "rotary" / "module.py").read_text()
LENGTH = 3000  # byte tokens: room for every task's needles with as much filler
DEPTHS = (0.1, 0.5, 0.9)
TASK_SETS = [(t,) for t in probes.TASKS] + [probes.TASKS]
BOS = 256


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return byte_tokenizer()


@pytest.fixture(scope="module")
def filler(tokenizer: Any) -> list[int]:
    return list(tokenizer(TEXT)["input_ids"])


def make(tokenizer: Any, filler: list[int], **changes: Any) -> list[probes.Haystack]:
    kwargs: dict[str, Any] = {
        "seed": 0,
        "tasks": probes.TASKS,
        "count": 2,
        "depths": DEPTHS,
        "length": LENGTH,
    }
    kwargs.update(changes)
    return probes.haystacks(tokenizer, filler, kwargs.pop("length"), **kwargs)


# --- haystacks -------------------------------------------------------------------------


def test_same_arguments_give_the_same_haystacks(tokenizer: Any, filler: list[int]) -> None:
    assert make(tokenizer, filler) == make(tokenizer, filler)


@pytest.mark.parametrize("change", [{"seed": 1}, {"length": LENGTH + 100}], ids=["seed", "length"])
def test_another_seed_or_length_gives_other_haystacks(
    tokenizer: Any, filler: list[int], change: dict[str, Any]
) -> None:
    first, other = make(tokenizer, filler), make(tokenizer, filler, **change)
    assert [h.ids for h in first] != [h.ids for h in other]
    assert [p.answers for h in first for p in h.probes] != [
        p.answers for h in other for p in h.probes
    ]


def test_haystacks_of_one_call_differ(tokenizer: Any, filler: list[int]) -> None:
    first, second = make(tokenizer, filler)
    assert (first.index, second.index) == (0, 1)
    assert first.ids != second.ids


@pytest.mark.parametrize("tasks", TASK_SETS, ids="+".join)
def test_every_prompt_fits_the_length(
    tokenizer: Any, filler: list[int], tasks: tuple[str, ...]
) -> None:
    for haystack in make(tokenizer, filler, tasks=tasks):
        sizes = [len(haystack.ids) + len(p.question) for p in haystack.probes]
        assert max(sizes) == LENGTH  # the haystack is the length less the longest question
        assert haystack.ids[0] == BOS and BOS not in haystack.ids[1:]


EXPECTED = {  # per task: probes per haystack, answers per probe, the shape of an answer
    "passkey": (1, 1, r"\d{5}"),
    "multikey": (4, 1, r"\d{7}"),
    "multivalue": (1, 4, r"\d{7}"),
    "vartrack": (2, 5, r"[A-Z]{5}"),
}


@pytest.mark.parametrize("tasks", TASK_SETS, ids="+".join)
def test_probes_and_answers_as_specified(
    tokenizer: Any, filler: list[int], tasks: tuple[str, ...]
) -> None:
    for haystack in make(tokenizer, filler, tasks=tasks):
        got = [(p.id, len(p.answers)) for p in haystack.probes]
        want = [
            (f"h{haystack.index}-{t}-{k}", EXPECTED[t][1])
            for t in tasks
            for k in range(EXPECTED[t][0])
        ]
        assert got == want
        for probe in haystack.probes:
            pattern = EXPECTED[probe.task][2]
            assert all(re.fullmatch(pattern, a) for a in probe.answers), probe
            assert len(set(probe.answers)) == len(probe.answers)
            assert 0.0 <= probe.depth <= 1.0
            budget = len(tokenizer(" " + ", ".join(probe.answers) + ".")["input_ids"])
            assert probe.max_new_tokens == budget - 1 + probes.MARGIN  # less the BOS


@pytest.mark.parametrize("tasks", TASK_SETS, ids="+".join)
def test_every_answer_is_in_its_haystack_and_not_in_its_question(
    tokenizer: Any, filler: list[int], tasks: tuple[str, ...]
) -> None:
    for haystack in make(tokenizer, filler, tasks=tasks):
        text = tokenizer.decode(haystack.ids)
        for probe in haystack.probes:
            question = tokenizer.decode(list(probe.question))
            for answer in probe.answers:
                assert answer in text, (probe.id, answer)
                assert answer not in question, (probe.id, answer)


def test_variable_chains_appear_in_order(tokenizer: Any, filler: list[int]) -> None:
    for haystack in make(tokenizer, filler, tasks=("vartrack",)):
        text = tokenizer.decode(haystack.ids)
        for probe in haystack.probes:
            names = probe.answers
            value = re.search(rf"VAR {names[0]} = (\d{{5}})\.", text)
            assert value is not None and value.group(1) in tokenizer.decode(list(probe.question))
            at = [text.index(f"VAR {names[0]} = {value.group(1)}.")]
            at += [text.index(f"VAR {b} = VAR {a}.") for a, b in itertools.pairwise(names)]
            assert at == sorted(at), probe.id


@pytest.mark.parametrize(
    ("depths", "low", "high"),
    [((0.5,), 0.45, 0.55), ((0.2, 0.8), 0.15, 0.85), ((0.9, 0.1, 0.5), 0.05, 0.95)],
    ids=["one", "two", "three"],
)
def test_needles_spread_over_the_depths(
    tokenizer: Any, filler: list[int], depths: tuple[float, ...], low: float, high: float
) -> None:
    # a depth is the fraction of the filler before the needle, moved at most SNAP tokens
    found = [p.depth for h in make(tokenizer, filler, depths=depths, count=4) for p in h.probes]
    assert all(low <= d <= high for d in found), found


def test_single_needles_take_one_stratum_each(tokenizer: Any, filler: list[int]) -> None:
    # five single-needle groups (a passkey, four keys): one in each fifth of the filler,
    # give or take a move of SNAP tokens to a newline
    for haystack in make(tokenizer, filler, depths=(0.0, 1.0), count=4):
        singles = sorted(p.depth for p in haystack.probes if p.task in ("passkey", "multikey"))
        room = probes.SNAP / (LENGTH / 2)  # the filler is about half the haystack here
        strata = [(i / 5 - room, (i + 1) / 5 + room) for i in range(5)]
        assert all(a <= d <= b for d, (a, b) in zip(singles, strata, strict=True)), singles


@pytest.mark.parametrize("tasks", TASK_SETS, ids="+".join)
def test_a_length_too_short_is_refused(
    tokenizer: Any, filler: list[int], tasks: tuple[str, ...]
) -> None:
    with pytest.raises(PosEncError, match=r"^length must leave room .* got 300$"):
        make(tokenizer, filler, tasks=tasks, length=300)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"tasks": ("passkey", "niah")}, r"^tasks must be one of .*, got 'niah'$"),
        ({"tasks": ()}, r"^tasks must name each task at most once, and one at least"),
        ({"tasks": ("vartrack", "vartrack")}, r"^tasks must name each task at most once"),
        ({"tasks": "passkey"}, r"^tasks must be a list or tuple of task names"),
        ({"depths": (0.5, 1.5)}, r"^depths must be <= 1.0, got 1.5$"),
        ({"depths": ()}, r"^depths must hold one fraction at least"),
        ({"count": -1}, r"^count must be >= 0, got -1$"),
        ({"seed": 1.5}, r"^seed must be an integer, got 1.5$"),
        ({"length": "3000"}, r"^length must be an integer, got '3000'$"),
    ],
    ids=["task", "no-task", "twice", "string", "depth", "no-depth", "count", "seed", "length"],
)
def test_bad_arguments_are_refused(
    tokenizer: Any, filler: list[int], change: dict[str, Any], match: str
) -> None:
    with pytest.raises(PosEncError, match=match):
        make(tokenizer, filler, **change)


def test_a_filler_of_special_tokens_is_refused(tokenizer: Any) -> None:
    with pytest.raises(PosEncError, match=r"^filler must hold a token .* got 3 tokens$"):
        make(tokenizer, [BOS, BOS, 257])


def test_no_haystack_for_count_zero(tokenizer: Any, filler: list[int]) -> None:
    assert make(tokenizer, filler, count=0) == []


# --- scoring ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "answers", "expected"),
    [
        (" 86895. Remember it.", ("86895",), 1.0),
        (" 8689.", ("86895",), 0.0),
        (" npmdi, KPDIZ and snonu", ("NPMDI", "KPDIZ", "SNONU", "KTCTS"), 0.75),
        (" 8471982, 1168132", ("8471982", "1168132", "9646793", "9889219"), 0.5),
        ("", ("1234567",), 0.0),
    ],
    ids=["hit", "miss", "case", "half", "empty"],
)
def test_score_is_the_fraction_of_answers_found(
    output: str, answers: tuple[str, ...], expected: float
) -> None:
    assert probes.score(output, answers) == expected


@pytest.mark.parametrize(
    ("output", "answers", "match"),
    [
        ("x", (), r"^answers must be"),
        ("x", "12", r"^answers must be"),
        ("x", {"12"}, r"^answers must be a non-empty list or tuple"),
        ("x", ("12", ""), r"^answers must be .* of non-empty strings"),
        ("x", ("12", 3), r"^answers must be .* of non-empty strings"),
        (None, ("1",), r"^output must be a string, got None$"),
        (3, ("1",), r"^output must be a string, got 3$"),
    ],
    ids=["none", "string", "set", "empty-answer", "int-answer", "output", "output-int"],
)
def test_score_refuses_bad_input(output: Any, answers: Any, match: str) -> None:
    with pytest.raises(PosEncError, match=match):
        probes.score(output, answers)


# Worked by hand for 5 / 10 (z = 1.959964, z^2 = 3.8414588): centre (0.5 + 0.1920729) /
# 1.3841459 = 0.5, half 1.4160 * sqrt(0.025 + 0.0096037) = 0.263407; the others agree with
# scipy.stats.binomtest(k, n).proportion_ci(method="wilson") to 1e-8.
@pytest.mark.parametrize(
    ("mean", "n", "low", "high"),
    [
        (0.5, 10, 0.236593, 0.763407),
        (0.0, 10, 0.0, 0.277533),
        (1.0, 1, 0.206549, 1.0),
        (0.875, 8, 0.529112, 0.977583),
    ],
    ids=["5/10", "0/10", "1/1", "7/8"],
)
def test_wilson_against_hand_worked_values(mean: float, n: int, low: float, high: float) -> None:
    assert probes.wilson(mean, n) == pytest.approx((low, high), abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(mean=st.floats(0.0, 1.0), n=st.integers(1, 100_000))
def test_wilson_holds_the_mean_within_0_and_1(mean: float, n: int) -> None:
    low, high = probes.wilson(mean, n)
    assert 0.0 <= low <= mean <= high <= 1.0


@pytest.mark.parametrize(
    ("args", "match"),
    [((1.5, 10), r"^mean must be <= 1.0"), ((0.5, 0), r"^n must be >= 1"), ((0.5, 3, 0.0), "^z")],
    ids=["mean", "n", "z"],
)
def test_wilson_refuses_bad_input(args: tuple[Any, ...], match: str) -> None:
    with pytest.raises(PosEncError, match=match):
        probes.wilson(*args)


def test_summarize_per_task() -> None:
    rows = [
        {"id": "h0-vartrack-0", "task": "vartrack", "score": 0.6},
        {"id": "h0-passkey-0", "task": "passkey", "score": 1.0},
        {"id": "h1-passkey-0", "task": "passkey", "score": 0.0},
        {"id": "h0-vartrack-1", "task": "vartrack", "score": 1.0},
    ]
    low, high = probes.wilson(0.5, 2)
    vlow, vhigh = probes.wilson(0.8, 2)
    assert probes.summarize(rows) == {
        "passkey": {"score": 0.5, "probes": 2, "low": low, "high": high},
        "vartrack": {"score": pytest.approx(0.8), "probes": 2, "low": vlow, "high": vhigh},
    }
    assert list(probes.summarize(rows)) == ["passkey", "vartrack"]  # TASKS order
    assert probes.summarize([]) == {}


def test_summarize_refuses_a_bad_row() -> None:
    match = r"^rows\[0\] \(probe h0-passkey-0\) score must be <= 1.0, got 2.0$"
    with pytest.raises(PosEncError, match=match):
        probes.summarize([{"id": "h0-passkey-0", "task": "passkey", "score": 2.0}])


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ("ab", r"^rows must be a list of probe records, got 'ab'$"),
        ({"task": "passkey", "score": 1.0}, r"^rows must be a list of probe records"),
        ([[{"task": "passkey"}]], r"^rows\[0\] must be a probe record"),
        ([{"task": "niah", "score": 1.0}], r"^rows\[0\] task must be one of .*, got 'niah'$"),
        ([{"task": "passkey", "score": float("nan")}], r"^rows\[0\] score must be finite"),
    ],
    ids=["string", "dict", "nested", "task", "nan"],
)
def test_summarize_refuses_bad_rows(rows: Any, match: str) -> None:
    with pytest.raises(PosEncError, match=match):
        probes.summarize(rows)


# --- answering from one prefill ---------------------------------------------------------


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        "llama": tiny_llama(tmp_path_factory.mktemp("llama")),
        "gemma3": tiny_gemma3(tmp_path_factory.mktemp("gemma3")),
    }


def yarn_model(folder: Path, dtype: str) -> tuple[Any, Any]:
    """The tiny model under posenc's YaRN at factor 2, as ``posenc extend`` runs it."""
    loaded = load_model(folder, dtype=dtype, device="cpu", context=None)
    return scaled(loaded, scaling_for("yarn", 2.0, loaded)), loaded.tokenizer


def one_haystack(tokenizer: Any) -> probes.Haystack:
    (haystack,) = probes.haystacks(
        tokenizer, tokenizer(TEXT)["input_ids"], LENGTH, seed=0, tasks=probes.TASKS,
        count=1, depths=DEPTHS,
    )  # fmt: skip
    return haystack


# The shared cache's logits against one fresh forward of the whole prompt, the same up to
# rounding (measured, max |difference| over 181 steps, logits below 0.6 in magnitude):
# float32 1.8e-7 (Llama) and 4.3e-7 (Gemma 3); float64 2.2e-16 and 1.1e-16.
TOLERANCE = {"float32": {"rtol": 0.0, "atol": 2e-6}, "float64": {"rtol": 0.0, "atol": 1e-13}}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_shared_cache_gives_a_fresh_prefills_logits(
    folders: dict[str, Path], family: str, dtype: str
) -> None:
    model, tokenizer = yarn_model(folders[family], dtype)
    haystack = one_haystack(tokenizer)
    rows = []
    for probe, (row, logits) in zip(
        haystack.probes, asking.answers(model, tokenizer, haystack, keep_logits=True), strict=True
    ):
        rows.append(row)
        steps = torch.stack(logits)  # [steps, vocab]: the answer position, then each step
        produced = steps.argmax(-1).tolist()
        assert 1 <= len(produced) <= probe.max_new_tokens
        # the prompt and every token produced but the last, in one forward with no cache:
        # its logits at the answer position and after each produced token
        ids = [*haystack.ids, *probe.question, *produced[:-1]]
        with torch.inference_mode():
            fresh = model(
                input_ids=torch.tensor([ids]), use_cache=False, logits_to_keep=len(produced)
            ).logits[0]
        torch.testing.assert_close(steps, fresh, **TOLERANCE[dtype], msg=probe.id)
        assert fresh.argmax(-1).tolist() == produced, probe.id
    assert [r["id"] for r in rows] == [p.id for p in haystack.probes]
    assert rows == asking.answer_haystack(model, tokenizer, haystack)  # the cache rolled back


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_copied_cache_answers_as_the_cropped_one(
    folders: dict[str, Path], family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # transformers before 5 has no past recording: a deep copy of the cache per probe
    model, tokenizer = yarn_model(folders[family], "float64")
    haystack = one_haystack(tokenizer)
    cropped = [
        (r, torch.stack(steps))
        for r, steps in asking.answers(model, tokenizer, haystack, keep_logits=True)
    ]
    monkeypatch.setattr(asking, "_records_past", lambda cache: False)
    copied = [
        (r, torch.stack(steps))
        for r, steps in asking.answers(model, tokenizer, haystack, keep_logits=True)
    ]
    assert [r for r, _ in copied] == [r for r, _ in cropped]
    for (_, a), (_, b) in zip(copied, cropped, strict=True):
        torch.testing.assert_close(a, b, rtol=0.0, atol=0.0)  # the same arithmetic


def test_answering_builds_no_square_tensor(folders: dict[str, Path]) -> None:
    # Llama through transformers' SDPA: no [s, s] mask or scores, no [s, vocab] logits.
    # (Gemma 3's sliding-window layers get a [1, 1, s, s] boolean mask from transformers'
    # mask builder, as its perplexity pass does; see measure.estimate_bytes.)
    model, tokenizer = yarn_model(folders["llama"], "float32")
    haystack = one_haystack(tokenizer)
    s = len(haystack.ids)
    shapes = Shapes()
    with shapes:
        rows = asking.answer_haystack(model, tokenizer, haystack)
    assert len(rows) == len(haystack.probes)
    square = shapes.square(s)
    logits = {k: v for k, v in shapes.seen.items() if VOCAB in k and any(d >= s for d in k)}
    assert square == {} and logits == {}
    assert any(s in k for k in shapes.seen)  # the prefill was seen


@pytest.mark.parametrize(
    ("text", "output", "finished"),
    [
        (" 86895.", " 86895.", False),
        (" 86895.\nThe", " 86895.", True),
        ("\n 86895.\nThe", "\n 86895.", True),
        ("\n ", "\n ", False),
    ],
    ids=["open", "newline", "leading-newline", "blank"],
)
def test_an_answer_ends_at_a_newline_after_some_text(
    tokenizer: Any, text: str, output: str, finished: bool
) -> None:
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert (asking._text(tokenizer, ids), asking._finished(tokenizer, ids)) == (output, finished)


# --- the spans a haystack's perplexity leaves out, and the run's own prefill -------------


@pytest.mark.parametrize("tasks", TASK_SETS, ids="+".join)
def test_needle_spans_cover_exactly_what_is_not_filler(
    tokenizer: Any, filler: list[int], tasks: tuple[str, ...]
) -> None:
    for haystack in make(tokenizer, filler, tasks=tasks):
        spans = haystack.needles
        assert spans[0][0] == 0 and all(a < b for a, b in spans)
        assert all(b <= c for (_, b), (c, _) in itertools.pairwise(spans))  # in order, apart
        inside = [t for a, b in spans for t in haystack.ids[a:b]]
        text = tokenizer.decode(inside, skip_special_tokens=True)
        for probe in haystack.probes:  # every needle's answer is inside a span
            assert all(answer in text for answer in probe.answers), probe.id
        outside = [t for i, t in enumerate(haystack.ids) if not any(a <= i < b for a, b in spans)]
        joined = filler[1:] * 3  # the filler, special tokens left out, wrapped around
        start = next(i for i in range(len(filler)) if joined[i : i + 50] == outside[:50])
        assert outside == joined[start : start + len(outside)]


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_answers_from_the_runs_prefill_are_the_same(folders: dict[str, Path], family: str) -> None:
    from posenc.extend.measure import prefill

    model, tokenizer = yarn_model(folders[family], "float64")
    haystack = one_haystack(tokenizer)
    _, cache = prefill(model, haystack.ids)
    assert asking.answer_haystack(model, tokenizer, haystack, cache) == asking.answer_haystack(
        model, tokenizer, haystack
    )
