"""Length-generalization studies: train at one length, evaluate at longer ones.

:func:`run_study` trains one :class:`~posenc.models.TinyTransformer` per encoding
on a task (:mod:`.tasks`) at ``train_len``, evaluates each at every eval length
(:mod:`.evaluate`), optionally extends the RoPE model's context at evaluation
time (position interpolation, NTK, YaRN; :mod:`.extension`) with and without a
short fine-tune at the longest eval length, and returns (and writes) the results:

.. code-block:: text

    {"task", "train_len", "eval_lens", "metric", "seeds", "settings", "environment",
     "runs": [{"encoding", "seed", "config",
               "train": {"steps", "final_loss", "seconds", ...},
               "eval": {"<len>": {"loss", "ppl" | "accuracy", ...} | {"error"}}}],
     "summary": {"<encoding>": {"<len>": {"seeds", "<metric>": {"mean", "min", "max"}, ...}}},
     "seconds",
     "comparisons": {"study", "interval",
                     "rows": [{"a", "b", "metric", "length", "expect", "seeds",
                               "differences", "mean", "interval", "verdict"}],
                     "verdict": {"status", "sentence", "also", ...}}}

With each seed, every model of a study starts from the same initialisation seed and sees
the same batches in the same order; only the encoding differs. Several seeds repeat the
whole comparison; ``summary`` (:func:`.results.summarize`) holds the spread, and
``comparisons`` (:mod:`.comparisons`) the pairs the study compares, each difference
paired by seed with a 95 % interval and a verdict (better, worse, level). The
``(seed, encoding)`` units run in this process or in ``jobs`` worker processes
(:mod:`.parallel`) with the same numbers either way.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from posenc._errors import PosEncError, check_bool, check_choice, check_int
from posenc._files import lock_out_dir, make_out_dir
from posenc.experiments.comparisons import Comparison, check_comparisons
from posenc.experiments.distributed import Dist, setup
from posenc.experiments.parallel import (
    UnitContext,
    default_jobs,
    run_units,
    study_units,
    validate_units,
)
from posenc.experiments.results import results_record, write_results
from posenc.experiments.runner import EVAL_MAX_TOKENS
from posenc.experiments.settings import (
    DEFAULT_ENCODINGS,
    PRESETS,
    StudySettings,
    make_study_task,
    study_bytes,
)

__all__ = [
    "DEFAULT_ENCODINGS",
    "MAX_JOBS",
    "PRESETS",
    "Event",
    "StudySettings",
    "default_jobs",
    "run_study",
    "write_results",
]

#: A progress callback receives ``(kind, fields)``; every ``fields`` has the run's
#: ``label`` and ``seed``: ``("run", {"steps"})`` before a model trains, ``("step",
#: {"info": StepInfo})`` after each step (fewer from worker processes, a few a second),
#: ``("eval", {})`` before it is evaluated and ``("done", {})`` after.
Event = Callable[[str, dict[str, Any]], None]

MAX_JOBS = 1024  # worker processes of one study


def _gb(n: float) -> str:
    """``803 GB``, ``2.76 TB``: decimal units, three digits."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000:
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"


def run_study(
    settings: StudySettings | str | None = None,
    *legacy: Any,
    out_dir: str | os.PathLike[str] | None = None,
    device: str = "cpu",
    jobs: int = 1,
    resume: bool = False,
    threads: int | None = None,
    plot: bool = True,
    on_event: Event | None = None,
    max_bytes: int | None = None,
    study: str | None = None,
    comparisons: Sequence[Comparison] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Train a model per encoding at ``train_len``, evaluate it at ``eval_lens``.

    The study is ``settings``; the others change none of its numbers (``docs/lengthgen.md``).

    Args:
        settings: the study (:meth:`StudySettings.from_options
            <posenc.experiments.settings.StudySettings.from_options>`); None: its defaults.
            Deprecated: the task's name, with the encodings and options after it.
        out_dir: where ``results.json``, ``lengthgen.png`` and ``checkpoints/`` go;
            None keeps everything in memory (no checkpoints).
        device: ``"cpu"`` or ``"cuda"``.
        jobs: worker processes for the ``(seed, encoding)`` units (1: this process only).
        resume: continue from the checkpoints in ``out_dir`` (same configuration only).
        threads: torch threads per process while the study runs; None: unchanged.
        plot: write ``lengthgen.png`` (needs matplotlib, ``pip install 'posenc[plot]'``).
        on_event: progress callback, see :data:`Event`.
        max_bytes: refuse a study whose estimated peak memory is above this; None: no limit.
        study: the named study (:data:`~posenc.experiments.studies.STUDIES`) the settings
            are, recorded with its comparisons; None: none.
        comparisons: the comparisons to measure in place of the study's; None: the study's.

    Returns:
        The results dict (see the module docstring), written to ``out_dir/results.json`` too.

    Raises:
        PosEncError: bad settings, a study over ``max_bytes``, an ``out_dir`` that cannot
            hold a study or that another live run holds, or a bad checkpoint (all checked
            before anything trains).
        OSError: ``out_dir`` cannot be written; the files already written are left whole.

    Examples:
        >>> from posenc.experiments import StudySettings, run_study
        >>> study = StudySettings.from_options(
        ...     "copy", ["none", "rope"], train_len=9, eval_lens=[9, 18], steps=2,
        ...     batch_size=4, dim=16, num_layers=1, num_heads=2, eval_examples=4, extend=[],
        ... )
        >>> results = run_study(study, plot=False)
        >>> [run["encoding"] for run in results["runs"]], results["settings"]["train"]["steps"]
        (['none', 'rope'], 2)
    """
    started = time.perf_counter()
    settings = _the_settings(settings, legacy, options)
    comparisons = _the_comparisons(study, comparisons)
    resume, plot = check_bool("resume", resume), check_bool("plot", plot)
    if on_event is not None and not callable(on_event):
        raise PosEncError(f"on_event must be a callable or None, got {on_event!r:.80}")
    if max_bytes is not None:
        max_bytes = check_int("max_bytes", max_bytes, min=0)
    if out_dir is not None and not isinstance(out_dir, (str, os.PathLike)):
        raise PosEncError(f"out_dir must be a path or None, got {out_dir!r:.80}")
    if threads is not None:
        threads = check_int("threads", threads, min=1, max=MAX_JOBS)
    jobs = check_int("jobs", jobs, min=1, max=MAX_JOBS)
    dist = setup(device)
    threads_before = torch.get_num_threads()
    held = contextlib.ExitStack()  # the lock of out_dir, held by rank 0 until the end
    try:
        if jobs > 1 and dist.world_size > 1:
            raise PosEncError(
                f"jobs must be 1 under torchrun (its {dist.world_size} processes already share "
                f"every step), got {jobs}"
            )
        settings.check_processes(dist.world_size)
        if threads is not None:
            torch.set_num_threads(threads)
        units = study_units(settings)
        workers = min(jobs, len(units))
        _check_memory(settings, max_bytes, workers, dist.world_size)
        task = make_study_task(settings)
        settings.check_task(task)
        out = _open_out_dir(out_dir, resume, dist, held)
        if threads is None and workers > 1:  # the cores shared out, not each taking all
            threads = max(1, default_jobs() // workers)
        ckpt_dir = None if out is None else out / "checkpoints"
        context = UnitContext(settings, dist.device, ckpt_dir, resume, threads)
        validate_units(units, context, task=task, dist=dist)  # before anything trains
        runs = run_units(units, context, task=task, dist=dist, jobs=workers, on_event=on_event)
        seconds = time.perf_counter() - started
        threads = threads if workers > 1 else None  # None: this process's, as it runs
        results = results_record(
            settings, task, runs, dist, device, seconds, workers, threads, comparisons, study
        )
        if out is not None and dist.is_main:
            _write(results, out, plot)
        dist.barrier()
        return results
    finally:
        held.close()
        torch.set_num_threads(threads_before)
        dist.close()


def _the_comparisons(
    study: str | None, comparisons: Sequence[Comparison] | None
) -> Sequence[Comparison] | None:
    """The comparisons of a run: those given, else the named ``study``'s, else None (the
    default ones, :func:`~posenc.experiments.results.comparisons_record`)."""
    if study is not None:
        from posenc.experiments.studies import STUDIES

        study = check_choice("study", study, tuple(STUDIES))
    if comparisons is not None:
        return check_comparisons(comparisons)
    if study is not None:
        return STUDIES[study].comparisons
    return None


def _the_settings(
    settings: StudySettings | str | None, legacy: tuple[Any, ...], options: dict[str, Any]
) -> StudySettings:
    """``settings`` as given, or built from the deprecated loose options."""
    if not isinstance(settings, StudySettings):
        if settings is not None and not isinstance(settings, str):
            raise PosEncError(
                f"settings must be a StudySettings (StudySettings.from_options), got "
                f"{settings!r:.80}"
            )
        return _settings_from_options(settings, legacy, options)
    if legacy or options:
        given = [*map(repr, legacy), *(f"{k}=" for k in options)]
        raise PosEncError(
            f"settings is a StudySettings: run_study takes no study options besides, got {given}"
        )
    return settings


def _settings_from_options(
    task: str | None, legacy: tuple[Any, ...], options: dict[str, Any]
) -> StudySettings:
    """The deprecated call, ``run_study(task, encodings, **options)``, as settings."""
    if len(legacy) > 1:
        raise PosEncError(
            f"settings: run_study takes at most 2 positional arguments, got {1 + len(legacy)}"
        )
    if task is None and not legacy and not options:  # run_study(): the default study
        return StudySettings.from_options()
    warnings.warn(
        "run_study(task, encodings, **options) is deprecated and will be removed in the next "
        "release: build the study once, run_study(StudySettings.from_options(task, encodings, "
        "**options), out_dir=...)",
        DeprecationWarning,
        stacklevel=4,  # the caller of run_study
    )
    task = options.pop("task", "lm") if task is None else task
    encodings = legacy[0] if legacy else options.pop("encodings", DEFAULT_ENCODINGS)
    return StudySettings.from_options(task, encodings, **options)


def _check_memory(
    settings: StudySettings, max_bytes: int | None, workers: int, world_size: int
) -> None:
    """Refuse a study whose estimated peak memory, times its workers, is over
    ``max_bytes``."""
    if max_bytes is None:
        return
    need = study_bytes(settings, eval_max_tokens=EVAL_MAX_TOKENS, world_size=world_size)
    if need * workers > max_bytes:
        total = f", {_gb(need * workers)} for its {workers} workers" if workers > 1 else ""
        raise PosEncError(
            f"this study needs about {_gb(need)} of memory per process{total} (dim "
            f"{settings.model.dim}, {settings.model.num_layers} layers, batch_size "
            f"{settings.train.batch_size}, lengths up to "
            f"{max(settings.train_len, *settings.eval_lens)}), over the limit of "
            f"{_gb(max_bytes)}" + ("; use fewer jobs" if workers > 1 else "")
        )


def _open_out_dir(
    out_dir: str | os.PathLike[str] | None, resume: bool, dist: Dist, held: contextlib.ExitStack
) -> Path | None:
    """``out_dir`` checked, made and locked by rank 0 (the lock joins ``held``)."""
    if resume and out_dir is None:
        raise PosEncError("resume needs out_dir (where the checkpoints are), got None")
    if out_dir is None:
        return None
    if not str(out_dir).strip():  # Path("") would be "."
        raise PosEncError(f"out_dir must name a folder, got {str(out_dir)!r}")
    out = Path(out_dir)
    if dist.is_main:
        make_out_dir(out)
        held.enter_context(lock_out_dir(out))  # refuses a second run into out_dir
    dist.barrier()
    return out


def _write(results: dict[str, Any], out: Path, plot: bool) -> None:
    """``out/results.json`` and, with ``plot``, ``out/lengthgen.png``."""
    write_results(results, out)
    if plot:
        from posenc.experiments.figure import plot_study

        plot_study(results, out / "lengthgen.png")
