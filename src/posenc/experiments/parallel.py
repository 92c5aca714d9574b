"""The units of a study (one ``(seed, encoding)`` each) in worker processes.

:func:`run_units` runs them one after another in this process (``jobs=1``) or spread
over ``jobs`` worker processes, started with ``spawn`` (a fresh interpreter: no state of
this process, no OpenMP pool forked mid-use). A unit's numbers depend only on the study's
settings and its seed (:mod:`.seeding`, :func:`.runner.run_unit`), so both give the same
runs, in the same order; ``tests/experiments/test_parallel.py`` holds them to it.

Workers take the units longest first (:func:`dispatch_order`: RoPE with its context
extensions before the rest), so the last one to finish is a short one and no core idles
while another trains a long unit at the end; the runs still come back in the order of
the units.

A worker dies with this process (:mod:`.orphans`): a parent killed with ``kill -9``
leaves no worker training and writing checkpoints into ``--out`` without its lock.

Progress events of the workers come back through a queue and reach ``on_event`` in this
process, each with its ``seed``. As with every ``spawn`` pool, a script that calls this
with ``jobs > 1`` must guard its top level with ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import queue
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from posenc.experiments.distributed import Dist
from posenc.experiments.orphans import die_with_parent
from posenc.experiments.runner import Runner, run_unit, seed_study
from posenc.experiments.settings import StudySettings, make_study_task
from posenc.experiments.tasks import Task

__all__ = [
    "Unit",
    "UnitContext",
    "default_jobs",
    "dispatch_order",
    "run_units",
    "study_units",
    "validate_units",
]

Emit = Callable[[str, dict[str, Any]], None]


@dataclasses.dataclass(frozen=True)
class Unit:
    """One encoding trained with one seed."""

    seed: int
    label: str
    spec: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class UnitContext:
    """What every unit of a study shares (picklable: it travels to the workers)."""

    study: StudySettings
    device: torch.device
    ckpt_dir: Path | None
    resume: bool
    threads: int | None

    def suffix(self, seed: int) -> str:
        """Checkpoint names tell seeds apart only in a study of several."""
        return "" if len(self.study.seeds) == 1 else f".seed{seed}"

    def runner(self, task: Task, dist: Dist, seed: int, on_event: Emit | None) -> Runner:
        return Runner(
            seed_study(self.study, seed),
            task,
            dist,
            self.ckpt_dir,
            self.resume,
            on_event,
            suffix=self.suffix(seed),
        )


def default_jobs() -> int:
    """The CPU cores this process may run on (``posenc lengthgen --jobs``' default)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def study_units(study: StudySettings) -> list[Unit]:
    """The units of ``study``, encoding-major, then seed (the order of its runs)."""
    return [
        Unit(seed, label, spec)
        for label, spec in zip(study.labels, study.specs, strict=True)
        for seed in study.seeds
    ]


def validate_units(units: Sequence[Unit], context: UnitContext, *, task: Task, dist: Dist) -> None:
    """Build and try every unit's model and check its checkpoints here, so that nothing
    trains before every unit could (:meth:`.runner.Runner.validate`); the global random
    generator is left as it was."""
    with torch.random.fork_rng(devices=[]):
        for unit in units:
            context.runner(task, dist, unit.seed, None).validate(unit.label, unit.spec)


def dispatch_order(units: Sequence[Unit], study: StudySettings) -> list[int]:
    """The indices of ``units`` in the order the workers take them: longest first.

    A unit's work is its training plus, for ``rope`` in a study that extends it, one
    evaluation (and ``finetune_steps`` more steps) per extension method; units of equal
    work keep their order. (Longest-processing-time-first: the study ends at most one
    short unit after the ideal split of the work, instead of up to one long unit.)
    """
    passes = len(study.eval_lens)  # one evaluation: a forward pass per eval length

    def work(unit: Unit) -> float:
        extensions = len(study.extend) if unit.label == "rope" else 0
        steps = study.train.steps + extensions * study.finetune_steps
        return steps + (1 + extensions) * passes

    return sorted(range(len(units)), key=lambda i: -work(units[i]))


def _make_task(study: StudySettings) -> Task:
    return make_study_task(study)


# --- the worker side: one task object per process, events into the parent's queue ---

_worker: dict[str, Any] = {}


def _init_worker(context: UnitContext, events: Any, parent: int) -> None:
    die_with_parent(parent)  # first: a parent killed now must not leave us training
    if context.threads is not None:
        torch.set_num_threads(context.threads)
    _worker.update(context=context, events=events, task=_make_task(context.study))


_STEP_EVERY_S = 0.2  # a worker forwards at most one step event per this many seconds


def _work(index: int, unit: Unit) -> tuple[int, list[dict[str, Any]]]:
    context: UnitContext = _worker["context"]
    events = _worker["events"]
    last = [0.0]

    def emit(kind: str, fields: dict[str, Any]) -> None:
        if kind == "step":  # progress only: a few a second keep the queue small
            now = time.monotonic()
            if now - last[0] < _STEP_EVERY_S:
                return
            last[0] = now
        events.put((kind, fields))

    runner = context.runner(
        _worker["task"], Dist(device=context.device), unit.seed, None if events is None else emit
    )
    return index, run_unit(runner, unit.label, unit.spec)


def run_units(
    units: Sequence[Unit],
    context: UnitContext,
    *,
    task: Task,
    dist: Dist,
    jobs: int,
    on_event: Emit | None = None,
) -> list[dict[str, Any]]:
    """Every unit's runs, in the order of ``units``; ``jobs`` worker processes (1: here,
    with ``task`` and ``dist``). A unit that fails stops the rest and raises its error."""
    if jobs <= 1 or len(units) <= 1:
        runs: list[dict[str, Any]] = []
        for unit in units:
            runner = context.runner(task, dist, unit.seed, on_event)
            runs.extend(run_unit(runner, unit.label, unit.spec))
        return runs
    ctx = multiprocessing.get_context("spawn")
    events = ctx.Queue() if on_event is not None else None
    done: dict[int, list[dict[str, Any]]] = {}
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=min(jobs, len(units)),
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(context, events, os.getpid()),
    ) as pool:
        pending = {pool.submit(_work, i, units[i]) for i in dispatch_order(units, context.study)}
        try:
            while pending:
                finished, pending = concurrent.futures.wait(
                    pending, timeout=0.1, return_when=concurrent.futures.FIRST_COMPLETED
                )
                _drain(events, on_event)
                for future in finished:
                    try:
                        index, unit_runs = future.result()  # a worker's error is raised here
                    except concurrent.futures.process.BrokenProcessPool as e:
                        raise RuntimeError(_BROKEN) from e
                    done[index] = unit_runs
        except BaseException:  # a failed unit (or ^C) stops the study now, not after the
            # units still training: their workers are terminated, the queued ones cancelled
            processes = getattr(pool, "_processes", None) or {}  # pid -> process
            for process in list(processes.values()):
                process.terminate()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    _drain(events, on_event)  # the workers have exited: their last events are all in
    return [run for i in range(len(units)) for run in done[i]]


_BROKEN = (
    "a worker process of the study died before it finished (killed for memory, or it could "
    "not start: with jobs > 1 a script must put its top level under "
    '`if __name__ == "__main__":`, since every spawned worker imports it); jobs=1 runs the '
    "study in this process"
)


def _drain(events: Any, on_event: Emit | None) -> None:
    if events is None or on_event is None:
        return
    while True:
        try:
            kind, fields = events.get_nowait()
        except queue.Empty:
            return
        on_event(kind, fields)
