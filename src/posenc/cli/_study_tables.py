"""The tables ``posenc lengthgen`` and ``posenc compare`` print: a study's summary (mean
and min-max over the seeds) and its comparisons with their verdicts."""

from __future__ import annotations

__all__ = ["print_comparisons", "print_summary"]


def _value(value: float, metric: str) -> str:
    return f"{value:.3g}" if metric == "ppl" else f"{value:.2f}"


def print_summary(results: dict) -> None:
    """One row per encoding: the mean over the seeds, with min-max when there are several."""
    from rich.console import Console
    from rich.table import Table

    metric, seeds = results["metric"], results.get("seeds", [0])
    over = f", mean (min-max) over seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else ""
    table = Table(
        title=f"{results['task']}: {metric} at each eval length "
        f"(trained at {results['train_len']}{over})"
    )
    table.add_column("encoding")
    for length in results["eval_lens"]:
        table.add_column(str(length), justify="right")
    table.add_column("train s", justify="right")
    seconds: dict[str, float] = {}
    for run in results["runs"]:
        train = run.get("train")  # a record read back (posenc compare) may lack it
        took = train.get("seconds") if isinstance(train, dict) else None
        if isinstance(took, (int, float)) and not isinstance(took, bool):
            seconds[run["encoding"]] = seconds.get(run["encoding"], 0.0) + took
    for label, cells in results["summary"].items():
        row = []
        for length in results["eval_lens"]:
            cell = cells[str(length)]
            stats = cell.get(metric)
            if "error" in cell:
                row.append("error")
            elif stats is None:
                row.append("-")
            elif len(seeds) > 1:
                row.append(
                    f"{_value(stats['mean'], metric)} "
                    f"({_value(stats['min'], metric)}-{_value(stats['max'], metric)})"
                )
            else:
                row.append(_value(stats["mean"], metric))
        table.add_row(label, *row, f"{seconds.get(label, 0.0):.1f}")
    Console().print(table)


def print_comparisons(results: dict) -> None:
    """The comparisons of the study, one row a pair at a length, and their verdict."""
    from rich.console import Console
    from rich.table import Table

    from posenc.experiments.comparisons import describe

    record = results.get("comparisons") or {}
    rows = record.get("rows", [])
    if not rows:
        return
    seeds = len(results.get("seeds", [0]))
    table = Table(
        title=f"comparisons over {seeds} seed{'s' if seeds != 1 else ''} (95% t interval)"
    )
    for name in ("the paper's", "comparison", "verdict"):
        table.add_column(name)
    for row in rows:
        table.add_row(row["source"] or "-", describe(row), row["verdict"])
    console = Console()
    console.print(table)
    if record.get("study") is not None:
        console.print(record["verdict"]["sentence"], markup=False, highlight=False)
