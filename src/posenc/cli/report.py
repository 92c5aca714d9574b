"""``posenc report``: measure every encoding and write one self-contained HTML report.

posenc report                  # ./report/index.html, report.json, *.png (minutes on a laptop)
posenc report --out /tmp/r --quick     # smaller ranges, a short study

The times measured on this project's machine: ``docs/report.md``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from posenc._errors import PosEncError
from posenc.cli._app import app, fail
from posenc.cli._checks import check_out_dir, integer, option, text

__all__ = ["report"]


# The options of `posenc report`, each checked when it is parsed (cli/_checks).
Out = Annotated[str, option("Output folder.", text("--out"), "--out", "-o")]
Quick = Annotated[
    bool, typer.Option("--quick", help="Smaller ranges and a short study: under a minute.")
]
Lengthgen = Annotated[
    bool, typer.Option("--lengthgen/--no-lengthgen", help="Run the length-generalization study.")
]
Jobs = Annotated[
    int | None,
    option("Worker processes of the study [the CPU cores].", integer("--jobs", min=1, max=1024)),
]


@app.command("report")
def report(
    out: Out = "report", quick: Quick = False, lengthgen: Lengthgen = True, jobs: Jobs = None
) -> None:
    """Write DIR/index.html (figures embedded), DIR/report.json and DIR/*.png.

    Exit codes: 0 written, 2 a bad option, 1 the environment refused (a folder that
    cannot be written, a full disk)."""
    from posenc.report.build import build_report, check_plot_extra

    try:
        check_plot_extra()
        path = check_out_dir(out)
    except (PosEncError, ImportError) as e:
        fail(str(e))
        return
    with _progress_bar() as on_progress:
        try:
            data = build_report(
                path, quick=quick, lengthgen=lengthgen, jobs=jobs, on_progress=on_progress
            )
        except (PosEncError, ImportError) as e:
            on_progress.stop()
            fail(str(e))
            return
        # an OSError (a full disk) reaches main: one line, exit code 1; the files of an
        # earlier report stay whole, every one is written atomically
    _say_what_was_written(path, data)


class _Bar:
    """``on_progress(stage, done, total, description)`` drawn as one rich bar per stage."""

    def __init__(self, bar: Any) -> None:
        self._bar = bar
        self._tasks: dict[str, Any] = {}

    def __call__(self, stage: str, done: int, total: int, description: str) -> None:
        if stage not in self._tasks:
            self._tasks[stage] = self._bar.add_task(description, total=total, stage=stage)
        self._bar.update(self._tasks[stage], completed=done, total=total, description=description)

    def stop(self) -> None:
        self._bar.stop()


@contextlib.contextmanager
def _progress_bar() -> Iterator[_Bar]:
    """The report's progress on stderr, one bar per stage; none where stderr is not a
    terminal (a log, a pipe: there it would be noise before an error line; the last line
    says what was written either way)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    columns = (
        TextColumn("{task.fields[stage]:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
    )
    with Progress(
        *columns, console=console, transient=False, disable=not console.is_terminal
    ) as bar:
        yield _Bar(bar)


def _say_what_was_written(path: Path, data: dict[str, Any]) -> None:
    """The last line on stdout; what could not be measured or studied on stderr."""
    errors = [e["name"] for e in data["encodings"] if e["error"]]
    typer.echo(
        f"wrote {path / 'index.html'}, {path / 'report.json'} and "
        f"{len(data['figures'])} figures in {data['seconds']['total']:.0f} s"
    )
    if errors:
        typer.echo(f"could not measure: {', '.join(errors)} (see the report)", err=True)
    if data["lengthgen"]["status"] != "ok":
        typer.echo(
            f"length generalization: {data['lengthgen']['status']} ({data['lengthgen']['reason']})",
            err=True,
        )
