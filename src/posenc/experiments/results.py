"""The results of a study: the ``results.json`` record, its per-encoding summary and its
comparisons.

``summary`` holds, per run label (``rope``, ``rope+yarn``, ...) and eval length, the
``mean``, ``min`` and ``max`` of the study's metric (and of ``loss``, for ``lm``
``ppl_past``, for the synthetic tasks ``token_accuracy``) over the seeds whose cell has a
value, and ``seeds``, how many those are; a cell that errored for every seed (a learned
table too short for the length) holds its ``error`` instead.

``comparisons`` (:func:`comparisons_record`) holds the pairs the study exists to compare,
each measured over the seeds with a 95 % interval and a verdict (:mod:`.comparisons`),
and what they say of the study's paper.
"""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from posenc._errors import PosEncError
from posenc._files import atomic_write, parse_json, read_regular
from posenc.experiments.comparisons import (
    INTERVAL,
    Comparison,
    check_comparisons,
    compare,
    default_comparisons,
    main_metric,
    verdict,
)
from posenc.experiments.distributed import Dist
from posenc.experiments.records import check_record
from posenc.experiments.settings import StudySettings
from posenc.experiments.tasks import LMTask, Task

__all__ = [
    "RESULTS_MAX_BYTES",
    "check_results",
    "comparisons_record",
    "load_results",
    "refresh_results",
    "results_record",
    "summarize",
    "write_results",
]

#: The largest ``results.json`` :func:`load_results` reads (a study of 100 encodings and
#: 100 seeds is a few MiB).
RESULTS_MAX_BYTES = 256 << 20

_SUMMARY_KEYS = ("loss", "ppl", "ppl_past", "accuracy", "token_accuracy")


def write_results(results: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> Path:
    """Write ``results`` to ``out_dir/results.json`` atomically; returns the path."""
    path = Path(out_dir) / "results.json"
    text = json.dumps(results, indent=2, allow_nan=False) + "\n"
    atomic_write(path, text.encode("utf-8"))
    return path


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": math.fsum(values) / len(values),
        "min": min(values),
        "max": max(values),
    }


def summarize(
    runs: Sequence[Mapping[str, Any]], eval_lens: Sequence[int]
) -> dict[str, dict[str, dict[str, Any]]]:
    """Mean / min / max per run label and eval length over the runs' seeds.

    Labels keep the order they first appear in ``runs``. Examples:
        >>> runs = [{"encoding": "alibi", "seed": s, "eval": {"64": {"ppl": p}}}
        ...         for s, p in [(0, 8.0), (1, 9.0), (2, 10.0)]]
        >>> summarize(runs, [64])["alibi"]["64"]["ppl"]
        {'mean': 9.0, 'min': 8.0, 'max': 10.0}
    """
    by_label: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        by_label.setdefault(run["encoding"], []).append(run)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for label, group in by_label.items():
        cells: dict[str, dict[str, Any]] = {}
        for length in eval_lens:
            key = str(length)
            found = [r["eval"].get(key, {}) for r in group]
            ok = [c for c in found if "error" not in c]
            if not ok:
                errors = [c["error"] for c in found if "error" in c]
                cells[key] = {"seeds": 0, "error": errors[0] if errors else "not evaluated"}
                continue
            cell: dict[str, Any] = {"seeds": len(ok)}
            for name in _SUMMARY_KEYS:
                values = [c[name] for c in ok if c.get(name) is not None]
                if len(values) == len(ok):
                    cell[name] = _stats(values)
            cells[key] = cell
        out[label] = cells
    return out


def comparisons_record(
    results: Mapping[str, Any],
    comparisons: Sequence[Comparison] | None = None,
    study: str | None = None,
) -> dict[str, Any]:
    """The ``comparisons`` entry of ``results`` (a ``run_study`` record): ``{"study",
    "interval", "rows", "verdict"}``, each row a comparison at one length measured over
    the seeds (:func:`~posenc.experiments.comparisons.compare`), ``verdict`` what they say
    of the paper. ``comparisons`` None: each run label against the first, on the task's
    main metric (:func:`~posenc.experiments.comparisons.default_comparisons`)."""
    check_record(results, "results", summary=True)
    if study is not None:
        from posenc.experiments.studies import STUDIES

        if not isinstance(study, str) or study not in STUDIES:
            raise PosEncError(f"study must be one of {', '.join(STUDIES)}, got {study!r:.80}")
    if comparisons is not None:
        comparisons = check_comparisons(comparisons)
    if comparisons is None:
        metric = main_metric(results["metric"], results["task"])
        comparisons = default_comparisons(list(results["summary"]), metric)
    rows = compare(results, comparisons)
    return {
        "study": study,
        "interval": INTERVAL,
        "rows": rows,
        "verdict": verdict(rows, comparisons),
    }


def results_record(
    study: StudySettings,
    task: Task,
    runs: list[dict[str, Any]],
    dist: Dist,
    device: str,
    seconds: float,
    jobs: int = 1,
    threads: int | None = None,
    comparisons: Sequence[Comparison] | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """The results dict of a finished study (see :mod:`posenc.experiments.lengthgen`);
    ``jobs``: the worker processes it ran in (the numbers do not depend on it), ``threads``
    the torch threads of each (None: this process's); ``comparisons`` and ``name`` (the
    named study, if one) make its ``comparisons`` (:func:`comparisons_record`)."""
    environment = {
        "device": device,
        "world_size": dist.world_size,
        "threads": torch.get_num_threads() if threads is None else threads,
        "jobs": jobs,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if isinstance(task, LMTask):
        environment["corpus"] = {
            "root": task.corpus.root,
            "train_bytes": int(task.corpus.train.numel()),
            "validation_bytes": int(task.corpus.validation.numel()),
            "files": list(task.corpus.num_files),
        }
    record: dict[str, Any] = {
        "task": study.task,
        "train_len": study.train_len,
        "eval_lens": list(study.eval_lens),
        "metric": task.metric,
        "seeds": list(study.seeds),
        "settings": study.to_record(),
        "environment": environment,
        "runs": runs,
        "summary": summarize(runs, study.eval_lens),
        "seconds": seconds,
    }
    record["comparisons"] = comparisons_record(record, comparisons, name)
    return record


def check_results(results: Any, where: str = "results") -> None:
    """Refuse ``results`` unless it is a study record :func:`refresh_results` can read:
    ``task``, ``metric``, ``train_len``, ``eval_lens`` and ``runs`` (each with its
    ``encoding``, ``seed`` and ``eval`` cells of numbers), naming the first key that is
    not; ``where`` names the record in the message."""
    check_record(results, where)


def load_results(results: str | os.PathLike[str]) -> dict[str, Any]:
    """The study record in ``results`` (a ``results.json``, or a folder holding one),
    checked (:func:`check_results`).

    Raises:
        PosEncError: no such file, not a regular file, over :data:`RESULTS_MAX_BYTES`,
            not UTF-8 JSON, nested too deep, or not a study record (naming the key).
        OSError: the file cannot be read.
    """
    if not isinstance(results, (str, os.PathLike)) or not str(results).strip():
        raise PosEncError(f"results must be a path to a results.json, got {results!r:.80}")
    path = Path(results)
    if path.is_dir():
        path = path / "results.json"
    raw = read_regular(path, what="results", max_bytes=RESULTS_MAX_BYTES)
    where = f"results {str(path)!r}"
    data = parse_json(raw, where)
    check_results(data, where)
    return data


def refresh_results(
    results: Mapping[str, Any],
    study: str | None = None,
    comparisons: Sequence[Comparison] | None = None,
) -> dict[str, Any]:
    """``results`` (a study record, :func:`load_results`) with its ``summary`` and
    ``comparisons`` made again from its runs, as this posenc makes them: for results of an
    earlier release, or to read a run against another study's comparisons. ``study``
    None: the one recorded, if any; ``comparisons`` in place of the study's."""
    check_results(results)
    if comparisons is not None:
        comparisons = check_comparisons(comparisons)
    if study is None:
        recorded = results.get("comparisons")
        study = recorded.get("study") if isinstance(recorded, dict) else None
        if study is not None and not isinstance(study, str):
            raise PosEncError(f"results: comparisons.study must be a study name, got {study!r:.80}")
    if study is not None:
        from posenc.experiments.studies import STUDIES

        if study not in STUDIES:
            raise PosEncError(f"study must be one of {', '.join(STUDIES)}, got {study!r:.80}")
        if comparisons is None:
            comparisons = STUDIES[study].comparisons
    out = dict(results)
    out["summary"] = summarize(out["runs"], out["eval_lens"])
    out["comparisons"] = comparisons_record(out, comparisons, study)
    return out
