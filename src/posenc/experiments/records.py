"""A study record (``results.json``) and its comparisons' rows, checked before anything
reads them: every key the comparisons and the summary read, each refused by name when it
is not what it must be."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from posenc._errors import PosEncError
from posenc._fields import At, choice, fail, integer, mapping, number, sequence, string

__all__ = [
    "MAX_RUNS",
    "METRIC_NAMES",
    "RECORD_KEYS",
    "ROW_KEYS",
    "check_metric",
    "check_record",
    "check_row",
    "check_rows",
    "is_int",
    "is_number",
]

#: The keys of a study record (``run_study``'s, of this release and earlier ones).
RECORD_KEYS = (
    "task",
    "train_len",
    "eval_lens",
    "metric",
    "seeds",
    "settings",
    "environment",
    "runs",
    "summary",
    "seconds",
    "comparisons",
)
ROW_KEYS = (
    "a",
    "b",
    "metric",
    "b_metric",
    "length",
    "times_L",
    "expect",
    "source",
    "seeds",
    "a_values",
    "b_values",
    "differences",
    "mean",
    "interval",
    "verdict",
)

#: The comparisons' metrics (``posenc.experiments.comparisons.METRICS`` holds their values).
METRIC_NAMES = ("ppl", "ppl_past", "ppl_growth", "error", "read_error")

MAX_RUNS = 1_000_000
_CELL_NUMBERS = ("loss", "ppl", "ppl_past", "accuracy", "token_accuracy")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) or value is None


def check_record(
    results: Any, where: str = "results", *, full: bool = True, summary: bool = False
) -> None:
    """Refuse ``results`` unless it is a study record the comparisons can read: its
    ``train_len``, ``eval_lens`` and ``runs`` (each with its ``encoding``, ``seed`` and
    ``eval`` cells of numbers), with ``full`` its ``task`` and ``metric``, with ``summary``
    its ``summary``; the message names ``where`` and the first key that is not right."""
    at = At(where)
    rule = "a JSON object (a results.json of posenc lengthgen)"
    mapping(at, results, rule, allowed=RECORD_KEYS)
    if full:
        string(at["task"], results.get("task"))
        string(at["metric"], results.get("metric"))
        if results["metric"] not in ("ppl", "accuracy"):
            raise fail(at["metric"], "'ppl' or 'accuracy'", results["metric"])
    if summary:
        mapping(at["summary"], results.get("summary"), "an object of run labels")
    integer(at["train_len"], results.get("train_len"), 1)
    lens = results.get("eval_lens")
    if not isinstance(lens, list) or not lens or not all(is_int(n) and n >= 1 for n in lens):
        raise fail(at["eval_lens"], "a non-empty list of integers >= 1", lens)
    runs = results.get("runs")
    rule = f"a non-empty list of at most {MAX_RUNS} runs"
    sequence(at["runs"], runs, rule, low=1, high=MAX_RUNS)
    for i, run in enumerate(runs):
        mapping(at["runs"][i], run)
        string(at["runs"][i]["encoding"], run.get("encoding"), "a run label", empty=False)
        integer(at["runs"][i]["seed"], run.get("seed"))
        cells = mapping(at["runs"][i]["eval"], run.get("eval"), "an object of eval lengths")
        for length, cell in cells.items():
            _check_cell(cell, at["runs"][i]["eval"][length])
            for split, inner in (cell.get("splits") or {}).items():
                _check_cell(inner, at["runs"][i]["eval"][length]["splits"][split])
    if len({(r["encoding"], r["seed"]) for r in runs}) != len(runs):
        raise PosEncError(f"{at['runs']} must hold each (encoding, seed) once")
    settings = results.get("settings", {})
    split = (
        settings.get("task_options", {}).get("eval_split")
        if isinstance(settings, Mapping)
        else None
    )
    if split is not None:
        string(at["settings"]["task_options"]["eval_split"], split, "a split's name")


def _check_cell(cell: Any, at: At) -> None:
    mapping(at, cell)
    for name in _CELL_NUMBERS:
        if name in cell:
            number(at[name], cell[name], finite=False, null=True)
    if "splits" in cell:
        mapping(at["splits"], cell["splits"])


def check_metric(name: str, value: Any) -> str:
    string(name, value, "a metric's name")
    base, _, split = value.partition("@")
    if base not in METRIC_NAMES or (split and base != "read_error"):
        rule = f"one of {', '.join(METRIC_NAMES)} (read_error@SPLIT for a flip-flop split)"
        raise fail(name, rule, value)
    return value


_ROW_KEYS = ("a", "b", "metric", "b_metric", "times_L", "seeds", "mean", "interval", "verdict")


def check_rows(rows: Any, name: str = "rows") -> list[Mapping[str, Any]]:
    """``rows`` (what :func:`compare` returns), refused by key when one is not a row."""
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise fail(name, "a list of compare()'s rows", rows)
    for i, row in enumerate(rows):
        check_row(row, f"{name}[{i}]")
    return list(rows)


def check_row(row: Any, name: str) -> None:
    at = At(path=name)
    rule = f"a row of compare() (with {', '.join(_ROW_KEYS)})"
    mapping(at, row, rule, allowed=ROW_KEYS)
    if any(k not in row for k in _ROW_KEYS):
        raise fail(at, rule, row)
    for key in ("a", "b"):
        string(at[key], row[key], "a run label")
    for key in ("metric", "b_metric"):
        check_metric(str(at[key]), row[key])
    choice(at["verdict"], row["verdict"], ("better", "worse", "level"))
    if row.get("expect") is not None:
        choice(at["expect"], row["expect"], ("better", "worse", None))
    sequence(at["seeds"], row["seeds"], types=(Sequence,))
    number(at["mean"], row["mean"], finite=False)
    number(at["times_L"], row["times_L"], finite=False)
    interval = row["interval"]
    if interval is not None and not (
        isinstance(interval, Sequence)
        and len(interval) == 2
        and all(is_number(x) and x is not None for x in interval)
    ):
        raise fail(at["interval"], "[low, high] or None", interval)
