"""Comparisons over seeds (posenc.experiments.comparisons): paired differences, the t
interval against hand-computed values, verdicts, and a writer that never orders what the
seeds do not separate."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import PosEncError
from posenc.experiments.comparisons import (
    Comparison,
    compare,
    default_comparisons,
    describe,
    t_quantile,
    verdict,
)
from posenc.experiments.results import comparisons_record, summarize

#: Student's t, 0.975 quantile, from the printed tables.
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 9: 2.262, 29: 2.045}


@pytest.mark.parametrize("df", list(T_TABLE))
def test_t_quantile_is_the_tables(df: int) -> None:
    assert t_quantile(0.975, df) == pytest.approx(T_TABLE[df], abs=6e-4)


@pytest.mark.parametrize(("p", "df"), [(0.5, 3), (1.0, 3), (0.975, 0), (0.975, 2.5), (0.975, True)])
def test_t_quantile_refuses_what_it_cannot_give(p: float, df: Any) -> None:
    with pytest.raises(PosEncError, match=r"^(p|df) must be"):
        t_quantile(p, df)


def _results(
    values: dict[str, list[float | None]],
    *,
    metric: str = "ppl",
    key: str = "ppl",
    lengths: tuple[int, ...] = (64,),
    task: str = "lm",
) -> dict[str, Any]:
    """A study record: ``values[label][seed]`` is the cell's ``key`` at every length (None:
    the cell errored)."""
    runs = []
    for label, per_seed in values.items():
        for seed, v in enumerate(per_seed):
            cells = {
                str(n): ({"error": "cannot run"} if v is None else {key: v * (n // lengths[0])})
                for n in lengths
            }
            runs.append({"encoding": label, "seed": seed, "eval": cells})
    record = {"task": task, "metric": metric, "train_len": lengths[0], "eval_lens": list(lengths)}
    record["runs"] = runs
    record["summary"] = summarize(runs, list(lengths))
    return record


def _interval(d: list[float]) -> list[float]:
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    half = T_TABLE[n - 1] * sd / math.sqrt(n)
    return [mean - half, mean + half]


def test_differences_are_paired_by_seed_with_a_t_interval() -> None:
    results = _results({"rope": [6.0, 6.5, 6.2, 7.0], "alibi": [6.4, 6.8, 6.5, 7.5]})
    (row,) = compare(results, [Comparison("rope", "alibi", "ppl", expect="better")])
    assert row["seeds"] == [0, 1, 2, 3]
    assert row["a_values"] == [6.0, 6.5, 6.2, 7.0] and row["b_values"] == [6.4, 6.8, 6.5, 7.5]
    assert row["differences"] == pytest.approx([-0.4, -0.3, -0.3, -0.5])
    assert row["mean"] == pytest.approx(-0.375)
    assert row["interval"] == pytest.approx(_interval([-0.4, -0.3, -0.3, -0.5]), abs=1e-3)
    # unpaired, the ranges overlap (6.0-7.0 against 6.4-7.5); paired, a is below every time
    assert row["verdict"] == "better"


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([6.0, 6.1, 6.2], [7.0, 7.05, 7.3], "better"),
        ([7.0, 7.05, 7.3], [6.0, 6.1, 6.2], "worse"),
        ([6.0, 6.6, 6.2], [6.1, 6.3, 6.4], "level"),  # the sign changes with the seed
        ([6.0, 6.0, 6.0], [6.0, 6.0, 6.0], "level"),  # equal: an interval of one point, 0
        ([6.0, 6.1, 6.2], [7.0, 7.1, 7.2], "better"),  # the same gap every seed
    ],
    ids=["better", "worse", "overlapping", "equal", "constant-gap"],
)
def test_verdicts(a: list[float], b: list[float], expected: str) -> None:
    (row,) = compare(_results({"rope": a, "alibi": b}), [Comparison("rope", "alibi", "ppl")])
    assert row["verdict"] == expected


def test_one_seed_is_level_with_no_interval() -> None:
    (row,) = compare(
        _results({"rope": [1.0], "alibi": [9.0]}), [Comparison("rope", "alibi", "ppl")]
    )
    assert row["interval"] is None and row["verdict"] == "level"
    assert "1 seed: no interval, not separated" in describe(row)


def test_unpaired_seeds_and_errored_cells_are_left_out() -> None:
    results = _results({"rope": [6.0, None, 6.2, 6.1], "alibi": [7.0, 7.1, 7.2]})
    (row,) = compare(results, [Comparison("rope", "alibi", "ppl")])
    assert row["seeds"] == [0, 2]  # seed 1: a errored; seed 3: no b
    assert (
        compare(_results({"rope": [None], "alibi": [1.0]}), [Comparison("rope", "alibi", "ppl")])
        == []
    )
    assert compare(_results({"rope": [1.0]}), [Comparison("rope", "fire", "ppl")]) == []


def test_lengths_resolve_against_the_studys() -> None:
    results = _results({"rope": [1.0, 1.1], "alibi": [2.0, 2.2]}, lengths=(64, 128, 256, 512))
    lengths = {
        spec: [r["length"] for r in compare(results, [Comparison("rope", "alibi", "ppl", spec)])]
        for spec in ("L", "past", "longest", "all", (2, 8), (3,))
    }
    assert lengths == {
        "L": [64],
        "past": [128, 256, 512],
        "longest": [512],
        "all": [64, 128, 256, 512],
        (2, 8): [128, 512],
        (3,): [],
    }


def test_metrics_from_the_cells() -> None:
    cell = {
        "accuracy": 0.75,
        "token_accuracy": 0.9,
        "splits": {"train": {"token_accuracy": 0.99}, "dense": {"token_accuracy": 0.5}},
    }
    runs = [{"encoding": "rope", "seed": 0, "eval": {"64": cell}}]
    results = {"task": "flipflop", "metric": "accuracy", "train_len": 64, "eval_lens": [64]}
    results["runs"] = [*runs, {"encoding": "alibi", "seed": 0, "eval": {"64": {
        "accuracy": 1.0, "token_accuracy": 1.0, "splits": {"train": {"token_accuracy": 1.0}},
    }}}]  # fmt: skip

    def one(c: Comparison) -> float:
        return compare(results, [c])[0]["differences"][0]

    assert one(Comparison("rope", "alibi", "error")) == pytest.approx(25.0)
    assert one(Comparison("rope", "alibi", "read_error")) == pytest.approx(10.0)  # the main split
    assert one(Comparison("rope", "alibi", "read_error@sparse")) == pytest.approx(10.0)  # the same
    # the same model, two splits: sparse (the task's own) against the training split
    assert one(
        Comparison("rope", "rope", "read_error", b_metric="read_error@train")
    ) == pytest.approx(9.0)
    assert one(
        Comparison("rope", "rope", "read_error@dense", b_metric="read_error")
    ) == pytest.approx(40.0)
    ppl = _results({"rope": [2.0, 4.0], "alibi": [2.0, 2.0]}, lengths=(64, 128))
    rows = compare(ppl, [Comparison("rope", "alibi", "ppl_growth", "past")])
    assert rows[0]["a_values"] == [2.0, 2.0] and rows[0]["differences"] == [0.0, 0.0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"a": "", "b": "rope", "metric": "ppl"}, "^a must be a run label"),
        ({"a": "rope", "b": 3, "metric": "ppl"}, "^b must be a run label"),
        ({"a": "sin", "b": "rope", "metric": "ppl"}, "^a must be a run label.*'sin'"),
        ({"a": "rope+yarm", "b": "rope", "metric": "ppl"}, "^a must be a run label"),
        ({"a": "rope", "b": "alibi", "metric": "perplexity"}, "^metric must be one of ppl"),
        ({"a": "rope", "b": "alibi", "metric": "ppl@sparse"}, "^metric must be one of"),
        ({"a": "rope", "b": "alibi", "metric": 3}, "^metric must be a metric's name"),
        ({"a": "rope", "b": "alibi", "metric": "ppl", "b_metric": "acc"}, "^b_metric must be"),
        ({"a": "rope", "b": "alibi", "metric": "ppl", "expect": "lower"}, "^expect must be"),
        ({"a": "rope", "b": "alibi", "metric": "ppl", "lengths": "8L"}, "^lengths must be one"),
        ({"a": "rope", "b": "alibi", "metric": "ppl", "lengths": 3}, "^lengths must be one"),
        ({"a": "rope", "b": "alibi", "metric": "ppl", "lengths": (0,)}, "^lengths must be mul"),
        ({"a": "rope", "b": "alibi", "metric": "ppl", "lengths": ()}, "^lengths must be mul"),
        ({"a": "rope", "b": "alibi", "metric": "ppl", "source": 1}, "^source must be a string"),
        ({"a": "rope", "b": "rope", "metric": "ppl"}, "^a and b are the same cell"),
    ],
)
def test_bad_comparisons_are_refused_by_name(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(PosEncError, match=match):
        Comparison(**kwargs)


def test_default_comparisons_are_each_label_against_the_first() -> None:
    record = comparisons_record(_results({"rope": [6.0, 6.2], "alibi": [7.0, 7.3]}))
    assert record["study"] is None and "t interval" in record["interval"]
    assert [(r["a"], r["b"], r["metric"]) for r in record["rows"]] == [("alibi", "rope", "ppl")]
    assert record["verdict"]["status"] == "no claim"
    assert default_comparisons(["rope"], "ppl") == ()


# --- the writer: "reproduced" only where every comparison of the paper holds -----------

PAPER = [
    Comparison("rope", "alibi", "ppl", expect="better", source="X et al."),
    Comparison("alibi", "t5", "ppl", expect="better", source="X et al."),
]


def _verdict(a: list[float], b: list[float], c: list[float]) -> dict[str, Any]:
    rows = compare(_results({"rope": a, "alibi": b, "t5": c}), PAPER)
    return verdict(rows, PAPER)


def test_every_comparison_holding_is_reproduced() -> None:
    v = _verdict([6.0, 6.1, 6.2], [7.0, 7.2, 7.3], [9.0, 9.1, 9.5])
    assert v["status"] == "reproduced" and v["holds"] == 2
    assert v["sentence"].startswith("Reproduced. As the paper: RoPE below ALiBi at L")


def test_overlapping_intervals_claim_no_order() -> None:
    """RoPE and ALiBi overlap seed by seed (a is below on average): the writer calls them level,
    names no order between them, and does not say "reproduced"."""
    a, b, c = [6.0, 6.5, 6.2], [6.1, 6.3, 6.4], [9.0, 9.1, 9.5]
    assert sum(a) / 3 < sum(b) / 3 and min(b) < max(a)
    v = _verdict(a, b, c)
    assert v["status"] == "partly" and v["level"] == 1 and v["holds"] == 1
    sentence = v["sentence"]
    assert sentence.startswith("Reproduced in part.")
    assert "Level at this scale: RoPE level with ALiBi at L" in sentence
    for ordered in ("RoPE below ALiBi", "RoPE above ALiBi", "rope < alibi", "Reproduced."):
        assert ordered not in sentence
    assert "ALiBi below T5 at L" in sentence  # the pair the seeds do separate keeps its order


def test_nothing_separated_is_level_at_this_scale() -> None:
    v = _verdict([6.0, 6.6, 6.2], [6.1, 6.3, 6.4], [6.2, 6.1, 6.5])
    assert v["status"] == "level at this scale" and v["holds"] == 0
    assert v["sentence"].startswith("Level at this scale: RoPE level with ALiBi at L")
    assert "below" not in v["sentence"] and "above" not in v["sentence"]


def test_an_opposite_direction_is_not_reproduced() -> None:
    v = _verdict([8.0, 8.1, 8.3], [7.0, 7.2, 7.3], [9.0, 9.1, 9.5])
    assert v["status"] == "not reproduced" and v["opposite"] == 1
    assert "Against the paper: RoPE above ALiBi at L" in v["sentence"]


def test_a_comparison_the_run_cannot_make_keeps_it_from_reproduced() -> None:
    rows = compare(_results({"rope": [6.0, 6.1, 6.2], "alibi": [7.0, 7.2, 7.3]}), PAPER)
    v = verdict(rows, PAPER)
    assert v["status"] == "partly" and v["untested"] == ["ALiBi against T5"]
    assert v["sentence"].endswith("Not made here: ALiBi against T5.")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.5, 50.0), st.floats(0.5, 50.0)), min_size=2, max_size=8),
    st.floats(-10.0, 10.0),
)
def test_properties_of_the_verdict(pairs: list[tuple[float, float]], shift: float) -> None:
    """Swapping a and b flips the verdict and negates the interval; a shift of both sides
    changes nothing; the verdict is level exactly when the interval holds 0."""
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    c = [Comparison("rope", "alibi", "ppl")]
    (row,) = compare(_results({"rope": a, "alibi": b}), c)
    (swapped,) = compare(_results({"rope": b, "alibi": a}), c)
    flip = {"better": "worse", "worse": "better", "level": "level"}
    lo, hi = row["interval"]
    assert swapped["interval"] == pytest.approx([-hi, -lo], abs=1e-9)
    if min(abs(lo), abs(hi)) > 1e-9:  # away from the boundary, where rounding may decide
        assert swapped["verdict"] == flip[row["verdict"]]
        assert (row["verdict"] == "level") == (lo <= 0 <= hi)
        moved = [x + shift for x in a], [x + shift for x in b]
        if min(moved[0] + moved[1]) > 0:
            (shifted,) = compare(_results({"rope": moved[0], "alibi": moved[1]}), c)
            if min(abs(v) for v in shifted["interval"]) > 1e-6:
                assert shifted["verdict"] == row["verdict"]


def test_cells_no_mean_can_hold_are_left_out() -> None:
    """Non-finite or absurd values (a crafted file) never reach the interval or JSON."""
    results = _results({"rope": [float("nan"), 1e300, float("inf"), 6.0, 6.1], "alibi": [7.0] * 5})
    (row,) = compare(results, [Comparison("rope", "alibi", "ppl")])
    assert row["seeds"] == [3, 4] and all(math.isfinite(x) for x in row["interval"])
