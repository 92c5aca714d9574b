"""``posenc extend``'s answer, names, page and memory without a model: the bar, the
effective length of each setting and the recommendation per length (whole answers for
hand-built records), better / level by ``experiments.comparisons``' rule (probe scores
paired by probe id, perplexity by document or, with one document, by bucket), the scaling
names from the rotary registry, the page stating the rule, and the peak memory read by
psutil."""

from __future__ import annotations

import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import PosEncError
from posenc._pages import escape
from posenc.experiments.comparisons import paired_verdict
from posenc.extend import measure, probes
from posenc.extend.answer import RULE, answer, compare, paired, paired_scores
from posenc.extend.settings import (
    CONFIG,
    FACTOR_SCALINGS,
    NONE,
    SCALING_NAMES,
    UNSCALED,
    ExtendSettings,
)
from posenc.rotary.frequencies import SCALINGS

YARN = {"ppl_by_document": {"a.py": 5.4, "b.py": 5.1, "c.py": 6.0}}
NTK = {"ppl_by_document": {"a.py": 5.5, "b.py": 5.0, "c.py": 6.1}}
LINEAR = {"ppl_by_document": {"a.py": 20.1, "b.py": 19.0, "c.py": 22.3}}
DYNAMIC = {"ppl_by_document": {"a.py": 5.61, "b.py": 5.26, "c.py": 6.04}}
ONE = {"ppl_by_document": {"a.py": 5.0}}
HALF = {"ppl_by_document": {"a.py": 2.5}}


# --- better / level: the comparisons' rule, paired by document ------------------------------


@pytest.mark.parametrize(
    ("a", "b", "verdict"),
    [
        (YARN, NTK, "level"),  # lower on two documents of three
        (YARN, LINEAR, "better"),
        (LINEAR, YARN, "worse"),
        (YARN, DYNAMIC, "level"),  # lower on every document, but the spread holds 0
        (HALF, ONE, "level"),  # one document and no buckets: no interval, whatever the margin
        (ONE, {"ppl_by_document": {"b.py": 9.0}}, "level"),  # no document in common
    ],
    ids=["mixed", "clearly-lower", "clearly-higher", "lower-everywhere-spread", "one", "none"],
)
def test_compare_is_the_paired_rule(a: dict, b: dict, verdict: str) -> None:
    assert compare(a, b) == verdict


def test_paired_holds_the_differences_by_document_and_their_interval() -> None:
    got = paired(YARN, LINEAR)
    differences = [5.4 - 20.1, 5.1 - 19.0, 6.0 - 22.3]
    mean, interval, verdict = paired_verdict(differences)
    assert got == {
        "documents": ["a.py", "b.py", "c.py"],
        "pairing": "document",
        "differences": differences,
        "mean": mean,
        "interval": interval,
        "verdict": verdict,
    }
    assert verdict == "better" and interval is not None and interval[1] < 0


def test_no_document_in_common_has_no_mean() -> None:
    assert paired(ONE, {"ppl_by_document": {}}) == {
        "documents": [],
        "pairing": None,
        "differences": [],
        "mean": None,
        "interval": None,
        "verdict": "level",
    }


def test_one_document_pairs_by_its_buckets() -> None:
    a = {"ppl_by_document": {"a.py": 5.5}, "ppl_by_bucket_document": {"a.py": [3, 4, 5, 6]}}
    b = {"ppl_by_document": {"a.py": 5.6}, "ppl_by_bucket_document": {"a.py": [3.1, 4.2, 5.1, 6.3]}}
    differences = [3 - 3.1, 4 - 4.2, 5 - 5.1, 6 - 6.3]
    mean, interval, verdict = paired_verdict(differences)
    assert paired(a, b) == {
        "documents": ["a.py"],
        "pairing": "bucket",
        "differences": differences,
        "mean": mean,
        "interval": interval,
        "verdict": "better",
    }
    assert verdict == "better" and compare({"ppl_by_document": {"a.py": 5.5}}, b) == "level"


def test_probe_scores_pair_by_probe_id_on_the_tasks_asked() -> None:
    a = {
        "probes": [
            _probe("h0-passkey-0", "passkey", 1.0),
            _probe("h1-passkey-0", "passkey", 1.0),
            _probe("h0-vartrack-0", "vartrack", 0.0),
            _probe("h9-passkey-0", "passkey", 0.0),
        ]
    }
    b = {
        "probes": [
            _probe("h0-passkey-0", "passkey", 0.0),
            _probe("h1-passkey-0", "passkey", 0.5),
            _probe("h0-vartrack-0", "vartrack", 1.0),
        ]
    }
    mean, interval, verdict = paired_verdict([0.0 - 1.0, 0.5 - 1.0])  # b - a: lower is better
    assert paired_scores(a, b, ["passkey"]) == {
        "probes": 2,
        "mean": mean,
        "interval": interval,
        "verdict": verdict,
    }
    assert paired_scores(a, b, []) == {
        "probes": 0,
        "mean": None,
        "interval": None,
        "verdict": "level",
    }


# --- hand-built records: the tasks, the settings, the ranges and the lead ---------------------

L = 100
TASKS = ("passkey", "vartrack")
OK = [1.0, 1.0, 1.0, 1.0]
ZERO = [0.0, 0.0, 0.0, 0.0]
VT = [1.0, 1.0, 0.5, 1.0]  # vartrack unscaled at L: 0.875, its bar 0.7875
BOTH = {"passkey": OK, "vartrack": OK}
NEITHER = {"passkey": ZERO, "vartrack": ZERO}


def _probe(pid: str, task: str, score: float) -> dict[str, Any]:
    return {
        "id": pid,
        "task": task,
        "haystack": int(pid[1]),
        "depth": 0.5,
        "answers": ["12345"],
        "output": "12345" if score else "",
        "score": score,
    }


def _summary(scores: dict[str, list[float]]) -> dict[str, Any]:
    """The record's ``scores``: mean and its Wilson interval (H1's) per task."""
    out = {}
    for task, values in scores.items():
        mean = sum(values) / len(values)
        low, high = probes.wilson(mean, len(values))
        out[task] = {"score": mean, "probes": len(values), "low": low, "high": high}
    return out


def _unit(
    scaling: str,
    length: int,
    factor: float,
    ppl: float,
    scores: dict[str, list[float]] | None = None,
    *,
    docs: dict[str, float] | None = None,
    buckets: list[float] | None = None,
    same_as: str | None = None,
) -> dict[str, Any]:
    """A unit record as run.py writes it; by default three documents at ``ppl`` -0.5, 0,
    +0.5 (two units' differences are then the same on each: ordered unless equal)."""
    docs = {"a": ppl - 0.5, "b": ppl, "c": ppl + 0.5} if docs is None else docs
    scores = {} if scores is None else scores
    rows = [
        _probe(f"h{j}-{t}-0", t, s) for t, values in scores.items() for j, s in enumerate(values)
    ]
    record = {
        "key": f"{scaling}-{length}-{factor:g}",
        "scaling": scaling,
        "factor": factor,
        "length": length,
        "rope": None,
        "same_as": same_as,
        "ppl": ppl,
        "ppl_last_quarter": ppl,
        "by_bucket": [{"start": 0, "stop": length, "ppl": ppl}],
        "ppl_by_document": docs,
        "ppl_by_bucket_document": {d: [v] for d, v in docs.items()},
        "tokens": 3 * (length - 1),
        "seconds": 1.0,
        "seconds_ppl": 0.5,
        "seconds_probes": 0.5,
        "peak_bytes": 2**30,
        "base_bytes": 2**29,
        "shared_pass": None,
        "probes": rows,
        "scores": _summary(scores),
    }
    if buckets is not None:
        record["ppl_by_bucket_document"] = {next(iter(docs)): buckets}
    return record


def _units(scaling: str, factor: float, ppl: dict[int, float]) -> list[dict[str, Any]]:
    """``scaling`` at ``factor``: a unit at each length of ``ppl`` (its perplexity there),
    every probe of both tasks right."""
    return [_unit(scaling, n, factor, p, BOTH) for n, p in ppl.items()]


def _results(records: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    lengths = sorted({r["length"] for r in records})
    return {
        "records": records,
        "trained_context": L,
        "lengths": lengths,
        "settings": {"tasks": TASKS, "bar": 0.9, "ppl_tolerance": 0.1, "trials": 4, **options},
    }


def _task(values: list[float], *, reason: str | None = None) -> dict[str, Any]:
    s = _summary({"t": values})["t"]
    return {
        "baseline": s["score"],
        "low": s["low"],
        "high": s["high"],
        "probes": 4,
        "bar": 0.9 * s["score"],
        "included": reason is None,
        "reason": reason,
    }


def _range(up_to: int, scaling: str | None, factor: float | None, *alternatives: list) -> dict:
    return {"up_to": up_to, "scaling": scaling, "factor": factor, "or": list(alternatives)}


Case = tuple[dict[str, Any], dict[str, Any]]


def _case(
    records: list[dict[str, Any]],
    effective: dict[tuple[str, float], int | None],
    failed: dict[str, tuple[str, ...]],
    *,
    lead: str,
    ranges: list[dict[str, Any]],
    choice: tuple[str | None, float, int],
    tasks: dict[str, dict[str, Any]] | None = None,
    **options: Any,
) -> Case:
    """The results of ``records`` and the answer expected for them: ``effective`` names
    each setting in the answer's order with its effective length, and ``failed`` what each
    record (by key) fails; its lengths are its records in order. ``choice`` is (scaling,
    factor, length); ``tasks`` by default both included at their score of 1 unscaled at L."""
    assert set(failed) <= {r["key"] for r in records}, "a key of failed names no record"

    def at(r: dict[str, Any]) -> dict[str, Any]:
        fails = list(failed.get(r["key"], ()))
        return {
            "length": r["length"],
            "holds": not fails,
            "failed": fails,
            "ppl": r["ppl"],
            "scores": r["scores"],
        }

    by_length = sorted(records, key=lambda r: r["length"])
    settings = [
        {
            "scaling": scaling,
            "factor": factor,
            "effective_length": length,
            "lengths": [
                at(r) for r in by_length if (r["scaling"], r["factor"]) == (scaling, factor)
            ],
        }
        for (scaling, factor), length in effective.items()
    ]
    scaling, factor, up_to = choice
    return _results(records, **options), {
        "lead": lead,
        "ranges": ranges,
        "choice": {"scaling": scaling, "factor": factor, "length": up_to},
        "tasks": {t: _task(OK) for t in TASKS} if tasks is None else tasks,
        "settings": settings,
    }


#: What ``none`` fails past L in most cases: both tasks, and perplexity (30 against 6 at L).
NONE_FAILS = ("passkey", "vartrack", "ppl")
#: The lead, ranges and choice of the cases where none holds at L and yarn factor 2 at 2L.
NONE_THEN_YARN: dict[str, Any] = {
    "lead": "up to 100: none; up to 200: yarn factor 2",
    "ranges": [_range(100, "none", 1.0), _range(200, "yarn", 2.0)],
    "choice": ("yarn", 2.0, 200),
}


def _none_to_L_yarn_to_2L() -> Case:
    at_L = {"passkey": OK, "vartrack": VT}
    records = [
        _unit("none", 100, 1.0, 6.0, at_L),
        _unit("dynamic", 100, 2.0, 6.0, at_L, same_as="none-100-1"),
        _unit("yarn", 100, 2.0, 6.2, BOTH),
        _unit("none", 200, 1.0, 30.0, NEITHER),
        _unit("dynamic", 200, 2.0, 5.6, {"passkey": OK, "vartrack": [1.0, 0.5, 0.5, 1.0]}),
        _unit("yarn", 200, 2.0, 5.5, {"passkey": OK, "vartrack": [1.0, 1.0, 1.0, 0.5]}),
    ]
    return _case(
        records,
        {("none", 1.0): 100, ("dynamic", 2.0): 100, ("yarn", 2.0): 200},
        {"none-200-1": NONE_FAILS, "dynamic-200-2": ("vartrack",)},
        lead="up to 100: none (or dynamic factor 2); up to 200: yarn factor 2",
        ranges=[_range(100, "none", 1.0, ["dynamic", 2.0]), _range(200, "yarn", 2.0)],
        choice=("yarn", 2.0, 200),
        tasks={"passkey": _task(OK), "vartrack": _task(VT)},
    )


def _nothing_holds_at_2L() -> Case:
    half = {"passkey": OK, "vartrack": [1.0, 1.0, 0.5, 0.5]}
    records = [
        _unit("none", 100, 1.0, 6.0, BOTH),
        _unit("yarn", 100, 2.0, 6.3, BOTH),
        _unit("none", 200, 1.0, 30.0, NEITHER),
        _unit("yarn", 200, 2.0, 5.5, half),
    ]
    return _case(
        records,
        {("none", 1.0): 100, ("yarn", 2.0): 100},
        {"none-200-1": NONE_FAILS, "yarn-200-2": ("vartrack",)},
        lead="up to 100: none; at 200: no measured setting holds the bar (passkey, vartrack, ppl)",
        ranges=[_range(100, "none", 1.0), _range(200, None, None)],
        choice=("none", 1.0, 100),
    )


def _holds_at_2L_not_at_L() -> Case:
    records = [
        _unit("none", 100, 1.0, 6.0, BOTH),
        _unit("yarn", 100, 2.0, 8.0, BOTH),  # too costly at L: never effective
        _unit("none", 200, 1.0, 30.0, NEITHER),
        _unit("yarn", 200, 2.0, 5.5, BOTH),
    ]
    return _case(
        records,
        {("none", 1.0): 100, ("yarn", 2.0): None},
        {"none-200-1": NONE_FAILS, "yarn-100-2": ("ppl",)},
        lead=(
            "up to 100: none; at 200: no measured setting holds the bar (passkey, vartrack, "
            "ppl; yarn factor 2 failed at a shorter length)"
        ),
        ranges=[_range(100, "none", 1.0), _range(200, None, None)],
        choice=("none", 1.0, 100),
    )


def _near_chance_left_out() -> Case:
    done = {"passkey": OK, "vartrack": ZERO}
    records = [
        _unit("none", 100, 1.0, 6.0, done),
        _unit("yarn", 100, 2.0, 6.3, done),
        _unit("none", 200, 1.0, 30.0, NEITHER),
        _unit("yarn", 200, 2.0, 5.5, done),
    ]
    high = probes.wilson(0.0, 4)[1]
    chance = probes.CHANCE["vartrack"]
    reason = (
        f"unscaled at 100 it scores 0.00 [0.00, {high:.2f}] over 4 probes: the interval "
        f"reaches chance ({chance:g})"
    )
    return _case(
        records,
        {("none", 1.0): 100, ("yarn", 2.0): 200},
        {"none-200-1": ("passkey", "ppl")},
        **NONE_THEN_YARN,
        tasks={"passkey": _task(OK), "vartrack": _task(ZERO, reason=reason)},
    )


def _one_document_by_bucket() -> Case:
    def one(
        scaling: str, length: int, factor: float, ppl: float, buckets: list[float], scores: dict
    ) -> dict:
        return _unit(scaling, length, factor, ppl, scores, docs={"a.py": ppl}, buckets=buckets)

    records = [
        one("none", 100, 1.0, 6.0, [5.0, 6.0, 6.5, 6.5], BOTH),
        one("ntk", 100, 2.0, 6.1, [5.1, 6.1, 6.6, 6.6], BOTH),
        one("yarn", 100, 2.0, 6.2, [5.2, 6.2, 6.7, 6.7], BOTH),
        one("none", 200, 1.0, 30.0, [5.0, 6.0, 40.0, 60.0], NEITHER),
        one("ntk", 200, 2.0, 5.6, [3.1, 4.2, 5.1, 6.3], BOTH),
        one("yarn", 200, 2.0, 5.5, [3.0, 4.0, 5.0, 6.0], BOTH),
    ]
    # by the one document alone yarn and ntk would be level; by its buckets yarn is better
    return _case(
        records,
        {("none", 1.0): 100, ("ntk", 2.0): 200, ("yarn", 2.0): 200},
        {"none-200-1": NONE_FAILS},
        **NONE_THEN_YARN,
    )


def _two_settings_level() -> Case:
    yarn = {"passkey": OK, "vartrack": VT}  # a lower probe score, level by its spread
    records = [
        _unit("none", 100, 1.0, 6.0, {"passkey": OK, "vartrack": VT}),
        _unit("ntk", 100, 2.0, 6.2, BOTH),
        _unit("yarn", 100, 2.0, 6.3, BOTH),
        _unit("none", 200, 1.0, 30.0, NEITHER),
        _unit("ntk", 200, 2.0, 5.45, BOTH, docs={"a": 5.5, "b": 5.0, "c": 6.1}),
        _unit("yarn", 200, 2.0, 5.4, yarn, docs={"a": 5.4, "b": 5.1, "c": 6.0}),
    ]
    # ntk scores higher, level with yarn by probes; the tie goes to the lower perplexity
    return _case(
        records,
        {("none", 1.0): 100, ("ntk", 2.0): 200, ("yarn", 2.0): 200},
        {"none-200-1": NONE_FAILS},
        lead="up to 100: none; up to 200: yarn factor 2 (or ntk factor 2)",
        ranges=[_range(100, "none", 1.0), _range(200, "yarn", 2.0, ["ntk", 2.0])],
        choice=("yarn", 2.0, 200),
        tasks={"passkey": _task(OK), "vartrack": _task(VT)},
    )


def _ppl_tolerance_fails() -> Case:
    records = [
        _unit("none", 100, 1.0, 6.0, BOTH),
        _unit("none", 200, 1.0, 30.0, NEITHER),
        *_units("linear", 2.0, {100: 20.0, 200: 19.0}),  # every probe right, ppl 3x none's at L
        *_units("yarn", 2.0, {100: 6.3, 200: 5.5}),
    ]
    return _case(
        records,
        {("none", 1.0): 100, ("linear", 2.0): None, ("yarn", 2.0): 200},
        {"none-200-1": NONE_FAILS, "linear-100-2": ("ppl",), "linear-200-2": ("ppl",)},
        **NONE_THEN_YARN,
    )


def _non_monotone() -> Case:
    records = [
        _unit("none", 100, 1.0, 6.0, BOTH),
        _unit("none", 150, 1.0, 9.0, NEITHER),
        _unit("none", 200, 1.0, 6.5, BOTH),  # holds again at 200: its effective length stays 100
        *_units("yarn", 1.5, {150: 5.8}),
        *_units("yarn", 2.0, {100: 6.3, 200: 5.5}),
    ]
    return _case(
        records,
        {("none", 1.0): 100, ("yarn", 1.5): 150, ("yarn", 2.0): 200},
        {"none-150-1": NONE_FAILS},
        lead="up to 100: none; up to 150: yarn factor 1.5; up to 200: yarn factor 2",
        ranges=[_range(100, "none", 1.0), _range(150, "yarn", 1.5), _range(200, "yarn", 2.0)],
        choice=("yarn", 2.0, 200),
    )


def _config_preferred_and_merged() -> Case:
    records = [
        _unit("none", 100, 1.0, 6.0, BOTH),
        _unit("none", 150, 1.0, 9.0, NEITHER),
        _unit("none", 200, 1.0, 30.0, NEITHER),
        *_units("config", 1.0, {100: 6.0, 150: 6.1, 200: 6.3}),
        *_units("yarn", 1.5, {150: 5.7}),  # lower perplexity; config holds, so config
    ]
    return _case(
        records,
        {("none", 1.0): 100, ("yarn", 1.5): 150, ("config", 1.0): 200},
        {"none-150-1": NONE_FAILS, "none-200-1": NONE_FAILS},
        lead="up to 100: none (or config); up to 200: config",
        ranges=[_range(100, "none", 1.0, ["config", 1.0]), _range(200, "config", 1.0)],
        choice=("config", 1.0, 200),
    )


def _no_probe_ran() -> Case:
    records = [
        _unit("none", 100, 1.0, 6.0),
        _unit("yarn", 100, 2.0, 6.3),
        _unit("none", 200, 1.0, 30.0),
        _unit("ntk", 200, 2.0, 5.6),
        _unit("yarn", 200, 2.0, 5.5),
    ]
    none = {
        "baseline": None,
        "low": None,
        "high": None,
        "probes": 0,
        "bar": None,
        "included": False,
        "reason": "no probe of it ran unscaled at 100",
    }
    return _case(
        records,
        {("none", 1.0): 100, ("ntk", 2.0): 200, ("yarn", 2.0): 200},
        {"none-200-1": ("ppl",)},
        lead="up to 100: none; up to 200: yarn factor 2. By perplexity alone: no probe ran.",
        ranges=NONE_THEN_YARN["ranges"],
        choice=("yarn", 2.0, 200),
        tasks={"passkey": none, "vartrack": none},
        trials=0,
    )


def _no_task_done() -> Case:
    records = [
        _unit("none", 100, 1.0, 6.0, NEITHER),
        _unit("none", 200, 1.0, 30.0, NEITHER),
        _unit("yarn", 200, 2.0, 5.5, NEITHER),
    ]
    high, chance = probes.wilson(0.0, 4)[1], probes.CHANCE
    return _case(
        records,
        {("none", 1.0): 100, ("yarn", 2.0): 200},
        {"none-200-1": ("ppl",)},
        lead=(
            "up to 100: none; up to 200: yarn factor 2. By perplexity alone: the model does "
            "none of the tasks unscaled at 100."
        ),
        ranges=NONE_THEN_YARN["ranges"],
        choice=("yarn", 2.0, 200),
        tasks={
            t: _task(
                ZERO,
                reason=(
                    f"unscaled at 100 it scores 0.00 [0.00, {high:.2f}] over 4 probes: the "
                    f"interval reaches chance ({chance[t]:g})"
                ),
            )
            for t in TASKS
        },
    )


CASES: dict[str, Callable[[], Case]] = {
    "none-to-L-yarn-to-2L": _none_to_L_yarn_to_2L,
    "nothing-holds-at-2L": _nothing_holds_at_2L,
    "holds-at-2L-not-at-L": _holds_at_2L_not_at_L,
    "a-task-near-chance-left-out": _near_chance_left_out,
    "one-document-pairs-by-bucket": _one_document_by_bucket,
    "two-settings-level": _two_settings_level,
    "ppl-tolerance-fails-a-setting-whose-probes-hold": _ppl_tolerance_fails,
    "non-monotone": _non_monotone,
    "config-preferred-and-merged": _config_preferred_and_merged,
    "no-probe-ran": _no_probe_ran,
    "no-task-done": _no_task_done,
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_answer_for_hand_built_records(case: str) -> None:
    results, expected = CASES[case]()
    got = answer(results)
    assert set(got) == {
        "lead",
        "sentence",
        "ranges",
        "choice",
        "tasks",
        "settings",
        "per_length",
        "cost_at_L",
        "rule",
    }
    assert {k: got[k] for k in expected} == expected
    assert got["sentence"] == got["lead"] and got["rule"] == RULE


def test_one_document_says_bucket_in_per_length_and_cost() -> None:
    results, _ = _one_document_by_bucket()
    got = answer(results)
    assert [row["pairing"] for row in got["per_length"]] == [None, "bucket"]
    assert [row["pairing"] for row in got["cost_at_L"]] == ["bucket", "bucket"]
    # four buckets: none's rise past L is too uneven over them to order (level), ntk's
    # steady gap is not
    assert got["per_length"][1]["verdicts"] == {"ntk-200-2": "better", "none-200-1": "level"}


def test_the_bar_is_judged_against_the_wilson_interval_not_the_score(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At chance 0.1, a score of 0.25 over 4 probes (Wilson low 0.046) is left out; over
    40 probes (low 0.142) it is in: the same score, the interval decides."""
    monkeypatch.setitem(probes.CHANCE, "vartrack", 0.1)
    for n, included in ((4, False), (40, True)):
        vartrack = [1.0] * (n // 4) + [0.0] * (3 * n // 4)
        records = [_unit("none", 100, 1.0, 6.0, {"passkey": OK, "vartrack": vartrack})]
        got = answer(_results(records))["tasks"]["vartrack"]
        low, high = probes.wilson(0.25, n)
        assert (got["low"], got["high"], got["probes"]) == (low, high, n)
        assert got["included"] is included and (low > 0.1) is included


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("bar", 1.5, "bar must be <= 1.0, got 1.5"),
        ("bar", "high", "bar must be a number, got 'high'"),
        ("ppl_tolerance", -0.1, "ppl_tolerance must be >= 0.0, got -0.1"),
    ],
)
def test_a_bad_bar_or_tolerance_is_refused_by_name(option: str, value: Any, message: str) -> None:
    results, _ = _nothing_holds_at_2L()
    results["settings"][option] = value
    with pytest.raises(PosEncError, match=f"^{message}$"):
        answer(results)


def test_nothing_measured() -> None:
    got = answer({"records": [], "trained_context": L, "settings": {}})
    assert got == {
        "lead": "Nothing was measured.",
        "sentence": "Nothing was measured.",
        "ranges": [],
        "choice": None,
        "tasks": {},
        "settings": [],
        "per_length": [],
        "cost_at_L": [],
        "rule": RULE,
    }


# --- properties: the effective length -------------------------------------------------------

#: The units a random case may hold: none at each length, yarn set for 150 or 200 (at L too:
#: factor 2), ntk at 200.
_PLAN = [("none", n, 1.0) for n in (100, 150, 200)] + [
    ("yarn", 100, 2.0),
    ("yarn", 150, 1.5),
    ("yarn", 200, 2.0),
    ("ntk", 200, 2.0),
]
_SCORE = st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=4, max_size=4)


@st.composite
def _random_results(draw: st.DrawFn) -> dict[str, Any]:
    records = [
        _unit(s, n, f, draw(st.floats(1.0, 40.0)), {t: draw(_SCORE) for t in TASKS})
        for s, n, f in _PLAN
        if (s == "none" and n == 100) or draw(st.booleans())
    ]
    return _results(records)


def _effective(results: dict[str, Any]) -> dict[tuple[str, float], int | None]:
    return {(s["scaling"], s["factor"]): s["effective_length"] for s in answer(results)["settings"]}


@settings(max_examples=60, deadline=None)
@given(_random_results(), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_effective_lengths_are_measured_and_a_higher_bar_never_lengthens_one(
    results: dict[str, Any], a: float, b: float
) -> None:
    low, high = sorted((a, b))
    got = answer({**results, "settings": {**results["settings"], "bar": low}})
    for s in got["settings"]:
        measured = [n["length"] for n in s["lengths"]]
        assert s["effective_length"] is None or s["effective_length"] in measured
        holds = [n["holds"] for n in s["lengths"]]
        prefix = holds.index(False) if False in holds else len(holds)  # held at each up to here
        assert s["effective_length"] == (measured[prefix - 1] if prefix else None)
    if got["choice"] is not None:
        eff = {(s["scaling"], s["factor"]): s["effective_length"] for s in got["settings"]}
        assert eff[got["choice"]["scaling"], got["choice"]["factor"]] >= got["choice"]["length"]
    looser = _effective({**results, "settings": {**results["settings"], "bar": low}})
    stricter = _effective({**results, "settings": {**results["settings"], "bar": high}})
    assert looser.keys() == stricter.keys()
    for key, n in stricter.items():
        assert (n or 0) <= (looser[key] or 0)


# --- per length and the cost at L: perplexity, paired by document ------------------------------


def _ppl_unit(scaling: str, length: int, factor: float, docs: dict[str, float]) -> dict[str, Any]:
    return _unit(scaling, length, factor, sum(docs.values()) / len(docs), docs=docs)


def _ppl_records() -> list[dict[str, Any]]:
    return [
        _ppl_unit("none", 512, 1.0, {"a": 5.0, "b": 6.0, "c": 7.0}),
        _ppl_unit("yarn", 512, 2.0, {"a": 5.2, "b": 6.3, "c": 7.1}),
        _ppl_unit("ntk", 512, 2.0, {"a": 5.1, "b": 6.1, "c": 7.2}),
        _ppl_unit("none", 1024, 1.0, {"a": 20.0, "b": 25.0, "c": 30.0}),
        _ppl_unit("yarn", 1024, 2.0, {"a": 5.4, "b": 5.1, "c": 6.0}),
        _ppl_unit("ntk", 1024, 2.0, {"a": 5.5, "b": 5.0, "c": 6.1}),
    ]


def test_the_answer_per_length_with_its_verdicts_intervals_and_cost() -> None:
    records = _ppl_records()
    r = {x["key"]: x for x in records}
    got = answer({"records": records, "trained_context": 512, "settings": {}})
    vs = {k: paired(r["yarn-1024-2"], r[k]) for k in ("ntk-1024-2", "none-1024-1")}
    costs = {k: paired(r[k], r["none-512-1"]) for k in ("yarn-512-2", "ntk-512-2")}
    assert got["per_length"] == [
        {
            "length": 512,
            "best": "none",
            "factor": 1.0,
            "ppl": 6.0,
            "level_with_best": ["none"],
            "pairing": None,
            "verdicts": {},
            "intervals": {},
        },
        {
            "length": 1024,
            "best": "yarn",
            "factor": 2.0,
            "ppl": r["yarn-1024-2"]["ppl"],
            "level_with_best": ["yarn", "ntk"],
            "pairing": "document",
            "verdicts": {k: v["verdict"] for k, v in vs.items()},
            "intervals": {k: v["interval"] for k, v in vs.items()},
        },
    ]
    assert got["per_length"][1]["verdicts"] == {"ntk-1024-2": "level", "none-1024-1": "better"}
    assert got["cost_at_L"] == [
        {
            "scaling": name,
            "factor": 2.0,
            "ppl": r[f"{name}-512-2"]["ppl"],
            "ppl_none": 6.0,
            "verdict": costs[f"{name}-512-2"]["verdict"],
            "interval": costs[f"{name}-512-2"]["interval"],
            "pairing": "document",
        }
        for name in ("yarn", "ntk")
    ]
    # no probe ran: perplexity alone; at 512 yarn and ntk cost too little to order against
    # none over three documents (level), and at 1024 they hold within 10% of none at 512
    assert got["lead"] == (
        "up to 512: none (or ntk factor 2, yarn factor 2); up to 1024: yarn factor 2 "
        "(or ntk factor 2). By perplexity alone: no probe ran."
    )


# --- the scaling names: the registry's, beside extend's own -----------------------------------


def test_the_names_are_the_registrys_factor_scalings_and_the_maps_between_none_and_config() -> None:
    assert FACTOR_SCALINGS == ("linear", "ntk", "dynamic", "yarn")
    assert all(name in SCALINGS for name in FACTOR_SCALINGS)
    maps = ("self-extend", "string")
    assert SCALING_NAMES == (NONE, *FACTOR_SCALINGS, *maps, CONFIG)
    assert SCALING_NAMES == ("none", *FACTOR_SCALINGS, *maps, "config")
    assert UNSCALED == ("none", "config")
    assert ExtendSettings.scalings == SCALING_NAMES


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("none", None),
        ("linear", {"type": "linear", "factor": 2.0}),
        ("ntk", {"type": "ntk", "factor": 2.0}),
        ("dynamic", {"type": "dynamic", "factor": 2.0, "max_position": 512}),
        ("yarn", {"type": "yarn", "factor": 2.0, "original_max_position": 512}),
        ("config", "the model's own"),
    ],
)
def test_scaling_for_sets_the_factor_and_L_where_the_registry_takes_it(
    name: str, expected: Any
) -> None:
    pytest.importorskip("transformers")
    from posenc.extend.model import scaling_for
    from posenc.rotary.frequencies import parse_scaling

    loaded: Any = types.SimpleNamespace(trained=512, configured="the model's own")
    got = scaling_for(name, 2.0, loaded)
    assert got == expected
    if isinstance(got, dict):  # the registry builds it
        assert parse_scaling(got).type == name
    if name not in UNSCALED:
        assert scaling_for(name, 1.0, loaded) is None  # factor 1: no scaling


def test_scaling_for_refuses_a_name_extend_does_not_know() -> None:
    pytest.importorskip("transformers")
    from posenc import PosEncError
    from posenc.extend.model import scaling_for

    loaded: Any = types.SimpleNamespace(trained=512, configured=None)
    with pytest.raises(
        PosEncError,
        match=r"^scaling must be one of none, linear, ntk, dynamic, yarn, self-extend, string, "
        r"config, got 'llama3'$",
    ):
        scaling_for("llama3", 1.0, loaded)


# --- the page: the rule stated (each file written atomically: test_extend_page.py) -------------


def _page_results() -> dict[str, Any]:
    results, _ = _none_to_L_yarn_to_2L()
    results.update(
        {
            "model": {"name": "tiny", "model_type": "llama", "parameters": 10, "files": {}},
            "documents": [{"name": n, "tokens": 2000} for n in "abc"],
            "layer_types_scaled": [None],
            "device": "cpu",
            "threads": 1,
            "posenc": "0",
        }
    )
    results["settings"].update({"depths": [0.5], "scalings": ["none", "dynamic", "yarn"]})
    results["answer"] = answer(results)
    return results


def test_the_page_states_the_rule_and_embeds_its_figures(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from posenc.extend.page import write_page

    paths = write_page(_page_results(), tmp_path)
    assert paths == [
        tmp_path / "ppl_by_position.png",
        tmp_path / "probes.png",
        tmp_path / "index.html",
    ]
    html = paths[2].read_text()
    assert html.count("data:image/png;base64,") == 2
    assert escape(RULE) in html and escape(_page_results()["answer"]["lead"]) in html
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)


# --- memory: psutil's resident set ------------------------------------------------------------


def test_the_peak_resident_memory_sees_an_allocation() -> None:
    psutil = pytest.importorskip("psutil")
    size = 256 * 2**20
    with measure.measured(torch.device("cpu")) as cost:
        block = torch.ones(size // 4, dtype=torch.float32)  # touched: resident
        time.sleep(0.1)  # a few of the sampler's 5 ms ticks while it is held
        del block
    rss = psutil.Process().memory_info().rss
    assert cost.base_bytes > 0 and cost.peak_bytes >= cost.base_bytes + size * 0.9
    assert abs(cost.base_bytes - rss) < 4 * size  # the same measure as psutil's, of this process


def test_available_memory_is_psutils() -> None:
    psutil = pytest.importorskip("psutil")
    got = measure.available_bytes(torch.device("cpu"))
    assert abs(got - psutil.virtual_memory().available) < 2**30
