"""A study record (``results.json``) and its comparisons' rows, checked before anything
reads them: every key the comparisons and the summary read, each refused by name when it
is not what it must be."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from posenc._errors import PosEncError

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

    def bad(key: str, rule: str, value: Any) -> PosEncError:
        return PosEncError(f"{where}: {key} must be {rule}, got {value!r:.80}")

    if not isinstance(results, Mapping):
        raise bad("the record", "a JSON object (a results.json of posenc lengthgen)", results)
    unknown = [k for k in results if k not in RECORD_KEYS]
    if unknown:
        raise PosEncError(
            f"{where}: keys must be among {', '.join(RECORD_KEYS)} (a results.json of posenc "
            f"lengthgen), got {unknown[0]!r:.80}"
        )
    if full:
        for key in ("task", "metric"):
            if not isinstance(results.get(key), str):
                raise bad(key, "a string", results.get(key))
        if results["metric"] not in ("ppl", "accuracy"):
            raise bad("metric", "'ppl' or 'accuracy'", results["metric"])
    if summary and not isinstance(results.get("summary"), Mapping):
        raise bad("summary", "an object of run labels", results.get("summary"))
    if not is_int(results.get("train_len")) or results["train_len"] < 1:
        raise bad("train_len", "an integer >= 1", results.get("train_len"))
    lens = results.get("eval_lens")
    if not isinstance(lens, list) or not lens or not all(is_int(n) and n >= 1 for n in lens):
        raise bad("eval_lens", "a non-empty list of integers >= 1", lens)
    runs = results.get("runs")
    if not isinstance(runs, list) or not runs or len(runs) > MAX_RUNS:
        raise bad("runs", f"a non-empty list of at most {MAX_RUNS} runs", runs)
    for i, run in enumerate(runs):
        if not isinstance(run, Mapping):
            raise bad(f"runs[{i}]", "an object", run)
        if not isinstance(run.get("encoding"), str) or not run["encoding"]:
            raise bad(f"runs[{i}].encoding", "a run label", run.get("encoding"))
        if not is_int(run.get("seed")):
            raise bad(f"runs[{i}].seed", "an integer", run.get("seed"))
        cells = run.get("eval")
        if not isinstance(cells, Mapping):
            raise bad(f"runs[{i}].eval", "an object of eval lengths", cells)
        for length, cell in cells.items():
            _check_cell(cell, f"runs[{i}].eval[{length!r}]", bad)
            for split, inner in (cell.get("splits") or {}).items():
                _check_cell(inner, f"runs[{i}].eval[{length!r}].splits[{split!r}]", bad)
    if len({(r["encoding"], r["seed"]) for r in runs}) != len(runs):
        raise PosEncError(f"{where}: runs must hold each (encoding, seed) once")
    settings = results.get("settings", {})
    split = (
        settings.get("task_options", {}).get("eval_split")
        if isinstance(settings, Mapping)
        else None
    )
    if split is not None and not isinstance(split, str):
        raise bad("settings.task_options.eval_split", "a split's name", split)


def _check_cell(cell: Any, key: str, bad: Any) -> None:
    if not isinstance(cell, Mapping):
        raise bad(key, "an object", cell)
    for name in _CELL_NUMBERS:
        if name in cell and not is_number(cell[name]):
            raise bad(f"{key}.{name}", "a number", cell[name])
    if "splits" in cell and not isinstance(cell["splits"], Mapping):
        raise bad(f"{key}.splits", "an object", cell["splits"])


def check_metric(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise PosEncError(f"{name} must be a metric's name, got {value!r:.80}")
    base, _, split = value.partition("@")
    if base not in METRIC_NAMES or (split and base != "read_error"):
        raise PosEncError(
            f"{name} must be one of {', '.join(METRIC_NAMES)} (read_error@SPLIT for a "
            f"flip-flop split), got {value!r:.80}"
        )
    return value


_ROW_KEYS = ("a", "b", "metric", "b_metric", "times_L", "seeds", "mean", "interval", "verdict")


def check_rows(rows: Any, name: str = "rows") -> list[Mapping[str, Any]]:
    """``rows`` (what :func:`compare` returns), refused by key when one is not a row."""
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise PosEncError(f"{name} must be a list of compare()'s rows, got {rows!r:.80}")
    for i, row in enumerate(rows):
        check_row(row, f"{name}[{i}]")
    return list(rows)


def check_row(row: Any, name: str) -> None:
    if isinstance(row, Mapping):
        unknown = [k for k in row if k not in ROW_KEYS]
        if unknown:
            raise PosEncError(
                f"{name} keys must be among {', '.join(ROW_KEYS)}, got {unknown[0]!r:.80}"
            )
    if not isinstance(row, Mapping) or any(k not in row for k in _ROW_KEYS):
        raise PosEncError(
            f"{name} must be a row of compare() (with {', '.join(_ROW_KEYS)}), got {row!r:.80}"
        )
    for key in ("a", "b"):
        if not isinstance(row[key], str):
            raise PosEncError(f"{name}.{key} must be a run label, got {row[key]!r:.80}")
    for key in ("metric", "b_metric"):
        if not isinstance(row[key], str):
            raise PosEncError(f"{name}.{key} must be a metric name, got {row[key]!r:.80}")
        check_metric(f"{name}.{key}", row[key])
    if row["verdict"] not in ("better", "worse", "level"):
        raise PosEncError(
            f"{name}.verdict must be 'better', 'worse' or 'level', got {row['verdict']!r:.80}"
        )
    if row.get("expect") not in (None, "better", "worse"):
        raise PosEncError(
            f"{name}.expect must be 'better', 'worse' or None, got {row['expect']!r:.80}"
        )
    if not isinstance(row["seeds"], Sequence) or not is_number(row["mean"]) or row["mean"] is None:
        raise PosEncError(f"{name}: seeds must be a list and mean a number, got {row!r:.80}")
    if not (is_number(row["times_L"]) and row["times_L"] is not None):
        raise PosEncError(f"{name}.times_L must be a number, got {row['times_L']!r:.80}")
    interval = row["interval"]
    if interval is not None and not (
        isinstance(interval, Sequence)
        and len(interval) == 2
        and all(is_number(x) and x is not None for x in interval)
    ):
        raise PosEncError(f"{name}.interval must be [low, high] or None, got {interval!r:.80}")
