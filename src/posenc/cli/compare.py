"""``posenc compare``: a study's comparisons and verdict, read again from its results.

posenc compare runs/prope                    # the table and the verdict of runs/prope/results.json
posenc compare runs/prope --seeds 0,1,2      # the same, on three of its seeds
posenc compare runs/prope --write            # results.json (and lengthgen.png) made again
posenc compare runs/x --study prope --json   # read against a study's comparisons, as JSON
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from posenc._errors import PosEncError
from posenc.cli._app import app, fail
from posenc.cli._checks import choice, option, text

__all__ = ["compare"]


def _studies() -> tuple[str, ...]:
    from posenc.experiments.studies import STUDIES

    return tuple(STUDIES)


def _study(value: str | None) -> str | None:
    return None if value is None else str(choice("--study", _studies())(value))


def _seeds(value: str | None) -> str | None:
    from posenc.cli.lengthgen import _seeds as seeds  # lengthgen's --seeds, the same rules

    return seeds(value)


Results = Annotated[
    str,
    typer.Argument(
        help="A results.json of posenc lengthgen, or the folder holding it.",
        callback=text("RESULTS"),
        show_default=False,
    ),
]
Study = Annotated[
    str | None,
    option(
        "Read the runs against this named study's comparisons (counting, flipflop, prope, "
        "nope-layers, drope) [the one recorded].",
        _study,
    ),
]
Seeds = Annotated[
    str | None,
    option("Only these seeds, e.g. 0,1,2 [every seed of the results].", _seeds),
]
Write = Annotated[
    bool,
    typer.Option(
        "--write/--no-write",
        help="Write the summary and comparisons back into the file read (and redraw a "
        "study folder's lengthgen.png when matplotlib is installed).",
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print the comparisons as JSON.")]


@app.command("compare")
def compare(
    results: Results,
    study: Study = None,
    seeds: Seeds = None,
    write: Write = False,
    json_out: Json = False,
) -> None:
    """The comparisons a study exists to make, each over its seeds (95% t interval of the
    paired differences), and what they say of its paper.

    Exit codes: 0 read, 2 a bad option or a file that is not a study's results, 1 the
    environment refused (a file that cannot be read or written)."""
    from posenc.experiments.results import load_results, refresh_results

    try:
        data = load_results(results)
        if seeds is not None:
            data = _only(data, seeds)
        data = refresh_results(data, study)
    except PosEncError as e:
        fail(str(e))
        return
    if json_out:
        typer.echo(json.dumps(data["comparisons"], indent=2, allow_nan=False))
    else:
        from posenc.cli._study_tables import print_comparisons, print_summary

        print_summary(data)
        print_comparisons(data)
    if write:
        target = Path(results)
        target = target / "results.json" if target.is_dir() else target
        _write(data, target)
        if not json_out:
            typer.echo(f"wrote {target}")


def _only(data: dict[str, Any], seeds: str) -> dict[str, Any]:
    """``data`` with the runs of ``seeds`` only (each must have runs)."""
    from posenc.experiments.options import parse_int, split_entries

    wanted = [int(parse_int("--seeds", s)) for s in split_entries("--seeds", seeds)]
    have = {run["seed"] for run in data["runs"]}
    missing = [s for s in wanted if s not in have]
    if missing:
        raise PosEncError(
            f"--seeds must be seeds of the results ({', '.join(map(str, sorted(have)))}), "
            f"got {', '.join(map(str, missing))}"
        )
    runs = [run for run in data["runs"] if run["seed"] in wanted]
    return {**data, "runs": runs, "seeds": wanted}


def _write(data: dict[str, Any], target: Path) -> None:
    """``data`` back into the file it was read from, atomically; a study folder's
    ``results.json`` also gets its ``lengthgen.png`` redrawn when matplotlib is here."""
    import importlib.util

    from posenc._files import atomic_write
    from posenc.analysis._results import jsonable

    text = json.dumps(jsonable(data), indent=2, allow_nan=False) + "\n"  # NaN -> null
    atomic_write(target, text.encode("utf-8"))
    if target.name != "results.json" or importlib.util.find_spec("matplotlib") is None:
        return
    from posenc.experiments.figure import plot_study

    plot_study(data, target.parent / "lengthgen.png")
