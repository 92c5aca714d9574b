"""A rich progress bar for studies: one bar per trained model, with loss and tokens/s."""

from __future__ import annotations

from typing import Any

__all__ = ["StudyProgress"]


class StudyProgress:
    """A :data:`~posenc.experiments.lengthgen.Event` callback drawing rich progress bars,
    one per ``(label, seed)``, named ``"<label> s<seed>"``.

    Use as a context manager around :func:`~posenc.experiments.lengthgen.run_study`::

        with StudyProgress() as progress:
            run_study(StudySettings.from_options("lm", ["rope", "alibi"]), on_event=progress)
    """

    def __init__(self, *, transient: bool = False) -> None:
        from rich.console import Console  # a core dependency, with the posenc command
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description:<14}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[speed]} tok/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=transient,
        )
        self._tasks: dict[tuple[str, Any], Any] = {}

    def __enter__(self) -> StudyProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def __call__(self, kind: str, fields: dict[str, Any]) -> None:
        seed = fields.get("seed")
        key = (fields["label"], seed)
        label = fields["label"] if seed is None else f"{fields['label']} s{seed}"
        if kind == "run":
            self._tasks[key] = self._progress.add_task(
                label, total=fields["steps"], loss="  -  ", speed="-"
            )
        elif kind == "step" and key in self._tasks:
            info = fields["info"]
            self._progress.update(
                self._tasks[key],
                completed=info.step,
                loss=f"{info.loss:.3f}",
                speed=f"{info.tokens_per_second:,.0f}",
            )
        elif kind == "eval":
            if key not in self._tasks:
                self._tasks[key] = self._progress.add_task(label, total=1, loss="  -  ", speed="-")
            self._progress.update(self._tasks[key], description=f"{label} (eval)")
        elif kind == "done" and key in self._tasks:
            task = self._tasks[key]
            self._progress.update(task, description=label)
            total = self._progress.tasks[self._progress.task_ids.index(task)].total
            self._progress.update(task, completed=total)
