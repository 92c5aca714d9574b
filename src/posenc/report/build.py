"""Compute everything the report shows, write the figures, ``report.json`` and ``index.html``."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from posenc import registry
from posenc._errors import PosEncError, check_int
from posenc._files import atomic_write, make_out_dir  # temp file + rename: all or nothing
from posenc._pages import pyplot
from posenc._version import __version__
from posenc.analysis import DEFAULT_ARGS, order_sensitivity, properties, resolve_encoding
from posenc.analysis._encodings import size
from posenc.report.schema import SCHEMA_VERSION, validate_report
from posenc.report.study import LENGTHGEN_SETTINGS, empty_record, run_report_study

__all__ = ["LENGTHGEN_SETTINGS", "Settings", "build_report", "check_plot_extra", "settings_for"]

#: ``on_progress(stage, done, total, description)``: ``stage`` is ``"analysis"`` (encodings,
#: figures, demonstrations, page) or ``"lengthgen"`` (training steps of the study).
Progress = Callable[[str, int, int, str], None]


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes of one report run (see :func:`settings_for`)."""

    quick: bool
    positions: int
    shift_positions: int
    max_distance: int
    figure_positions: int
    dpi: int
    similarity_figures: bool
    bias_heads: int


#: Each size of the default run beside the ``--quick`` one's (under a minute).
_SIZES: dict[str, tuple[Any, Any]] = {
    "positions": (512, 128),
    "shift_positions": (256, 128),
    "max_distance": (128, 64),
    "figure_positions": (128, 64),
    "dpi": (90, 72),
    "similarity_figures": (True, False),
    "bias_heads": (8, 4),
}


def settings_for(quick: bool) -> Settings:
    """The report's sizes: the default run, or the ``--quick`` one (under a minute)."""
    quick = bool(quick)
    return Settings(quick, **{field: sizes[quick] for field, sizes in _SIZES.items()})


class _Figures:
    """Draws figures, writes them as ``DIR/<file>.png`` and records them."""

    def __init__(self, out: Path, dpi: int) -> None:
        self.out, self.dpi = out, dpi
        self.records: list[dict[str, Any]] = []
        self.seconds = 0.0

    def add(self, file: str, title: str, section: str, encoding: str | None, draw: Any) -> str:
        from posenc.plot import figure_bytes

        start = time.perf_counter()
        fig = draw(self.dpi)
        atomic_write(self.out / file, figure_bytes(fig))
        self.record(file, title, section, encoding, fig.canvas.get_width_height())
        self.seconds += time.perf_counter() - start
        return file

    def record(
        self, file: str, title: str, section: str, encoding: str | None, size: tuple[int, int]
    ) -> None:
        """Record a figure already written as ``DIR/<file>``, ``size`` pixels wide and high."""
        width, height = size
        self.records.append(
            {
                "file": file,
                "title": title,
                "section": section,
                "encoding": encoding,
                "width": width,
                "height": height,
            }
        )


def _encoding_entry(name: str, s: Settings, figs: _Figures) -> dict[str, Any]:
    """Properties and figures of one registered encoding; errors are recorded, not raised."""
    entry: dict[str, Any] = {
        "name": name,
        "kind": None,
        "config": None,
        "summary": None,
        "properties": None,
        "figures": [],
        "error": None,
    }
    try:
        enc = resolve_encoding(name)
        entry["kind"], entry["config"] = enc.kind, enc.to_config()
        props = properties(
            enc, s.positions, shift_positions=s.shift_positions, max_distance=s.max_distance
        )
        entry["summary"], entry["properties"] = props.summary(), props.to_dict()
        entry["figures"] = _encoding_figures(name, enc, s, figs)
    except Exception as e:  # a new encoding the defaults cannot build must not sink the report
        entry["error"] = f"{type(e).__name__}: {e}"
    return entry


def _encoding_figures(name: str, enc: Any, s: Settings, figs: _Figures) -> list[str]:
    """The figures of one encoding: its bias per head, or its table (and similarity)."""
    from posenc import plot

    n = s.figure_positions
    if enc.kind == "bias":
        rows = -(-min(s.bias_heads, size(enc, "num_heads")) // 4)  # 4 heads a row
        return [
            figs.add(
                f"bias_{name}.png",
                f"{name}: bias of each head",
                "encodings",
                name,
                lambda dpi: plot.plot_bias(
                    enc, min(n, 48), max_heads=s.bias_heads, figsize=(8, 0.9 + 2.1 * rows), dpi=dpi
                ),
            )
        ]
    files = [
        figs.add(
            f"table_{name}.png",
            f"{name}: table",
            "encodings",
            name,
            lambda dpi: plot.plot_table(enc, n, figsize=(6.5, 3.6), dpi=dpi),
        )
    ]
    if enc.kind != "none" and s.similarity_figures:
        files.append(
            figs.add(
                f"similarity_{name}.png",
                f"{name}: similarity of positions",
                "encodings",
                name,
                lambda dpi: plot.plot_similarity(enc, n, figsize=(4.4, 3.6), dpi=dpi),
            )
        )
    return files


def _lengthgen(
    out: Path, quick: bool, figs: _Figures, progress: Progress, jobs: int
) -> dict[str, Any]:
    """The study (:mod:`posenc.report.study`) and its two figures: the headline one the
    page leads with and the per-run one with the RoPE extensions."""
    record = run_report_study(out, quick, progress, jobs=jobs)
    if record["status"] != "ok":
        return record
    results = record["results"]
    try:
        from posenc.report.study_figure import draw_headline

        record["headline"] = figs.add(
            "headline.png",
            "perplexity against length (mean, min-max over seeds) and its growth beside "
            "Press et al. (2022)",
            "answer",
            None,
            lambda dpi: draw_headline(results, record["ratios"], dpi=dpi),
        )
        from posenc.experiments.figure import plot_study

        start = time.perf_counter()
        path = plot_study(results, out / "lengthgen.png")
        from PIL import Image

        with Image.open(path) as im:
            figs.record(
                "lengthgen.png",
                "length generalization: every encoding and the RoPE extensions",
                "lengthgen",
                None,
                im.size,
            )
        figs.seconds += time.perf_counter() - start
        record["figure"] = "lengthgen.png"
    except Exception as e:  # no figure; the tables of numbers stay
        record["reason"] = f"figure failed: {type(e).__name__}: {e}"
    return record


def _jobs(jobs: int | None) -> int:
    """``jobs`` checked; None: every core (1 where the experiments are absent: no study)."""
    if jobs is not None:
        return check_int("jobs", jobs, min=1, max=1024)
    try:
        from posenc.experiments.parallel import default_jobs
    except ImportError:
        return 1
    return default_jobs()


def check_plot_extra() -> None:
    """Raise an ImportError naming the extra when matplotlib (``posenc[plot]``) is missing."""
    pyplot("plot", "posenc report")


def _quiet(stage: str, done: int, total: int, description: str) -> None:
    """The default progress callback: nothing."""


def build_report(
    out_dir: str | os.PathLike[str] = "report",
    *,
    quick: bool = False,
    encodings: Sequence[str] | None = None,
    lengthgen: bool = True,
    jobs: int | None = None,
    on_progress: Progress | None = None,
) -> dict[str, Any]:
    """Measure every registered encoding and write the report to ``out_dir``.

    Writes ``index.html`` (one self-contained page, figures embedded), ``report.json``
    (every number; schema in :mod:`posenc.report.schema`) and the figures as ``*.png``.

    Args:
        out_dir: output folder, created if missing.
        quick: smaller ranges and a shorter study (under a minute on a laptop).
        encodings: registry names to include (default: all, in registry order).
        lengthgen: run the length-generalization study (when the experiments are present).
        jobs: worker processes of the study (default: the CPU cores; the numbers do not
            depend on it).
        on_progress: ``(stage, done, total, description)`` callback.

    Returns:
        The data written to ``report.json``.

    Raises:
        PosEncError: an unknown encoding name, or an ``out_dir`` that is empty, a file or
            under a file.
        OSError: ``out_dir`` is not writable, or the disk filled up; files written by an
            earlier report are left whole (every file is written atomically).
        ImportError: matplotlib (the ``plot`` extra) is missing.
    """
    started = time.perf_counter()
    progress = on_progress or _quiet
    check_plot_extra()
    out = make_out_dir(out_dir)
    names = registry.names() if encodings is None else [registry.get(n).name for n in encodings]
    if not names:
        raise PosEncError("encodings must name at least one encoding, got an empty list")
    s = settings_for(bool(quick))
    figs = _Figures(out, s.dpi)
    total = len(names) + 3
    t0 = time.perf_counter()
    entries = []
    for i, name in enumerate(names):
        progress("analysis", i, total, f"measuring {name}")
        entries.append(_encoding_entry(name, s, figs))
    seconds = {"analysis": time.perf_counter() - t0 - figs.seconds}

    progress("analysis", len(names), total, "decay curves")
    _distance_figures(entries, s, figs)

    progress("analysis", len(names) + 1, total, "demonstrations")
    t0 = time.perf_counter()
    demos = order_sensitivity().to_dict()
    seconds["demonstrations"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    if lengthgen:
        study = _lengthgen(out, bool(quick), figs, progress, _jobs(jobs))
    else:
        study = empty_record("skipped", "turned off (lengthgen=False)")
    seconds["lengthgen"] = time.perf_counter() - t0  # with its figure

    progress("analysis", len(names) + 2, total, "writing the page")
    data = _record(s, entries, demos, study, figs, seconds)
    _write(out, data, started)
    progress("analysis", total, total, "done")
    return data


def _distance_figures(entries: list[dict[str, Any]], s: Settings, figs: _Figures) -> None:
    """The decay curves of every encoding measured, and the clock hands of one rotary."""
    from posenc import plot

    ok = [e["name"] for e in entries if e["error"] is None]
    if ok:
        figs.add(
            "decay.png",
            "similarity and bias against distance",
            "decay",
            None,
            lambda dpi: plot.plot_decay(ok, s.max_distance, figsize=(12, 4.6), dpi=dpi),
        )
    rotary = [e["name"] for e in entries if e["kind"] == "rotary" and e["error"] is None]
    if rotary:
        clock = "rope" if "rope" in rotary else rotary[0]
        figs.add(
            f"clock_{clock}.png",
            f"{clock}: rotation angles as clock hands",
            "decay",
            clock,
            lambda dpi: plot.plot_clock_hands(clock, figsize=(12, 3.0), dpi=dpi),
        )


def _record(
    s: Settings,
    entries: list[dict[str, Any]],
    demos: dict[str, Any],
    study: dict[str, Any],
    figs: _Figures,
    seconds: dict[str, float],
) -> dict[str, Any]:
    """What ``report.json`` holds (its total time is set when the page is written)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "posenc_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": {
            "quick": s.quick,
            "positions": s.positions,
            "shift_positions": s.shift_positions,
            "max_distance": s.max_distance,
            "dtype": str(torch.float32).removeprefix("torch."),
            "analysis_defaults": {
                k: list(v) if isinstance(v, tuple) else v for k, v in DEFAULT_ARGS.items()
            },
            "dpi": s.dpi,
        },
        "encodings": entries,
        "demonstrations": demos,
        "lengthgen": study,
        "figures": figs.records,
        "seconds": {
            "analysis": seconds["analysis"],
            "figures": figs.seconds,
            "demonstrations": seconds["demonstrations"],
            "lengthgen": seconds["lengthgen"],
            "total": 0.0,
        },
    }


def _write(out: Path, data: dict[str, Any], started: float) -> None:
    """The page and ``report.json``, each atomically: a full disk leaves the previous
    ones as they were."""
    from posenc.report.html import render_html

    html = render_html(data, out)
    data["seconds"]["total"] = time.perf_counter() - started
    validate_report(data)
    atomic_write(out / "report.json", (json.dumps(data, indent=1, allow_nan=False) + "\n").encode())
    atomic_write(out / "index.html", html.encode("utf-8"))
