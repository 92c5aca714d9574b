"""The results.json schema of a length-generalization study, checked key by key."""

from __future__ import annotations

import math
from typing import Any

RUN_KEYS = {"encoding", "seed", "config", "train", "eval"}
TRAIN_KEYS = {"steps", "final_loss", "seconds"}
LM_CELL = {"loss", "ppl", "loss_past", "ppl_past", "tokens", "tokens_past"}
SYNTHETIC_CELL = {"loss", "accuracy", "token_accuracy", "examples"}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_results(
    results: dict[str, Any],
    *,
    task: str,
    train_len: int,
    eval_lens: list[int],
    encodings: list[str],
) -> None:
    """Raise AssertionError unless ``results`` has the documented shape."""
    assert results["task"] == task
    assert results["train_len"] == train_len
    assert results["eval_lens"] == eval_lens
    assert results["metric"] == ("ppl" if task == "lm" else "accuracy")
    assert {"settings", "environment", "runs", "summary", "seeds", "seconds"} <= set(results)
    seeds = results["seeds"]
    assert seeds and results["settings"]["seeds"] == seeds
    assert [run["encoding"] for run in results["runs"]] == encodings
    _check_summary(results, seeds)
    _check_comparisons(results)
    for run in results["runs"]:
        assert run["seed"] in seeds
        assert set(run) == RUN_KEYS, run.keys()
        assert run["config"]["name"] == run["encoding"].split("+")[0]
        assert TRAIN_KEYS <= set(run["train"])
        assert isinstance(run["train"]["steps"], int) and _number(run["train"]["seconds"])
        if run["train"]["steps"]:
            assert _number(run["train"]["final_loss"])
        else:
            assert run["train"]["final_loss"] is None  # an extension without a fine-tune
        assert list(run["eval"]) == [str(n) for n in eval_lens]
        for length, cell in run["eval"].items():
            if "error" in cell:
                assert set(cell) == {"error"} and isinstance(cell["error"], str)
                continue
            assert set(cell) == (LM_CELL if task == "lm" else SYNTHETIC_CELL)
            assert _number(cell["loss"]) and cell["loss"] >= 0
            if task == "lm":
                assert cell["ppl"] == math.exp(cell["loss"])
                if int(length) > train_len:
                    assert cell["ppl_past"] == math.exp(cell["loss_past"])
                    assert 0 < cell["tokens_past"] < cell["tokens"]
                else:
                    assert cell["loss_past"] is None and cell["tokens_past"] == 0
            else:
                assert 0.0 <= cell["accuracy"] <= cell["token_accuracy"] <= 1.0
                assert cell["examples"] > 0


def _check_summary(results: dict[str, Any], seeds: list[int]) -> None:
    """``summary``: per label (first-appearance order) and length, mean / min / max of each
    metric over the runs of that label, and how many seeds gave a value."""
    labels = list(dict.fromkeys(run["encoding"] for run in results["runs"]))
    assert list(results["summary"]) == labels
    for label in labels:
        runs = [r for r in results["runs"] if r["encoding"] == label]
        assert sorted(r["seed"] for r in runs) == sorted(seeds)
        for length in results["eval_lens"]:
            cell = results["summary"][label][str(length)]
            ok = [r["eval"][str(length)] for r in runs if "error" not in r["eval"][str(length)]]
            assert cell["seeds"] == len(ok)
            if not ok:
                assert isinstance(cell["error"], str)
                continue
            metric = results["metric"]
            values = [c[metric] for c in ok]
            stats = cell[metric]
            assert stats["min"] == min(values) and stats["max"] == max(values)
            assert math.isclose(stats["mean"], sum(values) / len(values), rel_tol=1e-12)


def _check_comparisons(results: dict[str, Any]) -> None:
    """Every row a pair at one length, its differences ``a - b`` seed by seed, its verdict
    the side of 0 its interval lies on."""
    from posenc.experiments.records import ROW_KEYS

    record = results["comparisons"]
    assert set(record) == {"study", "interval", "rows", "verdict"}
    assert {"status", "sentence", "also", "holds", "level", "opposite", "untested"} <= set(
        record["verdict"]
    )
    for row in record["rows"]:
        assert set(row) == set(ROW_KEYS), row.keys()
        assert row["differences"] == [a - b for a, b in zip(row["a_values"], row["b_values"])]
        assert row["seeds"] and set(row["seeds"]) <= set(results["seeds"])
        interval = row["interval"]
        if interval is None or interval[0] <= 0 <= interval[1]:
            assert row["verdict"] == "level"
        else:
            assert row["verdict"] == ("better" if interval[1] < 0 else "worse")
