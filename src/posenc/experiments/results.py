"""The results of a study: the ``results.json`` record and its per-encoding summary.

``summary`` holds, per run label (``rope``, ``rope+yarn``, ...) and eval length, the
``mean``, ``min`` and ``max`` of the study's metric (and of ``loss`` and, for ``lm``,
``ppl_past``) over the seeds whose cell has a value, and ``seeds``, how many those are;
a cell that errored for every seed (a learned table too short for the length) holds its
``error`` instead.
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

from posenc.experiments.checkpoint import atomic_write
from posenc.experiments.distributed import Dist
from posenc.experiments.settings import StudySettings
from posenc.experiments.tasks import LMTask, Task

__all__ = ["results_record", "summarize", "write_results"]

_SUMMARY_KEYS = ("loss", "ppl", "ppl_past", "accuracy")


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


def results_record(
    study: StudySettings,
    task: Task,
    runs: list[dict[str, Any]],
    dist: Dist,
    device: str,
    seconds: float,
    jobs: int = 1,
    threads: int | None = None,
) -> dict[str, Any]:
    """The results dict of a finished study (see :mod:`posenc.experiments.lengthgen`);
    ``jobs``: the worker processes it ran in (the numbers do not depend on it), ``threads``
    the torch threads of each (None: this process's)."""
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
    return {
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
