"""The report's length-generalization study: its settings, its run, and what it shows.

:func:`run_report_study` trains the study of :data:`LENGTHGEN_SETTINGS` with
:func:`posenc.experiments.lengthgen.run_study` (every ``(seed, encoding)`` in worker
processes), then derives from the results what the page leads with:

- ``ratios``: per encoding and eval length, ``ppl(n) / ppl(L)`` of each seed, as mean /
  min / max over the seeds (a seed's model is compared with itself);
- ``checks``: what the literature says should hold, each tested on those numbers;
- ``comparison``: our ratios beside Press et al.'s (:mod:`.literature`) at the nearest
  multiples of ``L``, and one sentence, written from the numbers, on what agrees and what
  does not.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from posenc import registry
from posenc.analysis._results import jsonable
from posenc.report.literature import PRESS_2022, press_ratios

__all__ = [
    "LENGTHGEN_SETTINGS",
    "checks",
    "comparison",
    "empty_record",
    "ratios",
    "run_report_study",
]

Progress = Callable[[str, int, int, str], None]

#: The report's study, default and ``--quick``: the model of ``posenc lengthgen``'s default
#: preset, several seeds, eval to 8L. The default trains each model with Muon on its hidden
#: matrices (AdamW on the rest, :mod:`posenc.experiments.optim`) until its perplexity at L
#: is below 9 per byte, in 700 steps where AdamW needs 1100; ``--quick`` (three encodings,
#: two seeds, smaller batches, AdamW: Muon's step costs more than it saves there) trains
#: only far enough to show the shape, ALiBi flat and sinusoidal and RoPE rising, in under a
#: minute.
LENGTHGEN_SETTINGS: dict[bool, dict[str, Any]] = {
    False: {
        "task": "lm",
        "encodings": ("none", "sinusoidal", "learned", "rope", "alibi", "t5"),
        "preset": "default",
        "seeds": (0, 1, 2),
        "train_len": 64,
        "batch_size": 32,
        "steps": 700,
        "optimizer": "muon",
        "eval_lens": (64, 128, 256, 512),
        "eval_tokens": 32768,
        "extend": ("pi", "ntk", "yarn"),
        "finetune_steps": 0,
    },
    True: {
        "task": "lm",
        "encodings": ("sinusoidal", "rope", "alibi"),
        "preset": "default",
        "seeds": (0, 1),
        "train_len": 64,
        "batch_size": 16,
        "steps": 400,
        "optimizer": "adamw",
        "eval_lens": (64, 128, 256, 512),
        "eval_tokens": 4096,
        "extend": (),
        "finetune_steps": 0,
    },
}

#: What each check expects, default and ``--quick`` (a shorter study rises less).
_EXPECT: dict[bool, tuple[float, float, float | None]] = {  # flat within, rise by, ppl at L
    False: (0.10, 1.3, 9.0),
    True: (0.10, 1.15, None),
}
_PRESS_METHODS = ("sinusoidal", "rope", "t5", "alibi")


def ratios(results: Mapping[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """``ppl(n) / ppl(L)`` per label and eval length ``n``: mean / min / max over the seeds
    whose model has both cells (none: the label is left out at that length)."""
    metric, base = results["metric"], str(results["train_len"])
    out: dict[str, dict[str, dict[str, float]]] = {}
    for label in results["summary"]:
        runs = [r for r in results["runs"] if r["encoding"] == label]
        cells: dict[str, dict[str, float]] = {}
        for length in results["eval_lens"]:
            values = [
                r["eval"][str(length)][metric] / r["eval"][base][metric]
                for r in runs
                if r["eval"].get(base, {}).get(metric) and r["eval"][str(length)].get(metric)
            ]
            if values:
                cells[str(length)] = {
                    "mean": math.fsum(values) / len(values),
                    "min": min(values),
                    "max": max(values),
                }
        out[label] = cells
    return out


def _fmt(x: float) -> str:
    return f"{x:.2f}"


def checks(results: Mapping[str, Any], rat: Mapping[str, Any], quick: bool) -> list[dict[str, Any]]:
    """The literature's expectations, each tested on ``results``: ``{"claim", "holds",
    "detail"}``; a check whose encodings are not in the study is left out."""
    flat, rise, trained_below = _EXPECT[quick]
    train_len, longest = results["train_len"], str(max(results["eval_lens"]))
    times = f"{int(longest) // train_len}L"
    summary, metric = results["summary"], results["metric"]
    out: list[dict[str, Any]] = []

    def at(label: str, length: str = longest) -> dict[str, float] | None:
        return rat.get(label, {}).get(length)

    if trained_below is not None:
        trained = [m for m in _PRESS_METHODS if m in summary]
        highest = {m: float(summary[m][str(train_len)][metric]["max"]) for m in trained}
        out.append(
            {
                "claim": f"the models have learned: perplexity at L below {trained_below:g} "
                f"per byte for {', '.join(trained)} (every seed)",
                "holds": all(v <= trained_below for v in highest.values()),
                "detail": ", ".join(f"{m} {_fmt(v)}" for m, v in highest.items()),
            }
        )
    alibi = at("alibi")
    if alibi is not None:
        spread = [c for n, c in rat["alibi"].items() if int(n) > train_len]  # every length past L
        out.append(
            {
                "claim": f"ALiBi stays within {flat:.0%} of its perplexity at L up to "
                f"{times}, every seed (Press et al.)",
                "holds": all(abs(c["min"] - 1) <= flat for c in spread)
                and all(abs(c["max"] - 1) <= flat for c in spread),
                "detail": f"ratio at {times}: {_fmt(alibi['mean'])} "
                f"({_fmt(alibi['min'])}-{_fmt(alibi['max'])})",
            }
        )
    for label, name in (("sinusoidal", "sinusoidal"), ("rope", "RoPE")):
        cell = at(label)
        if cell is not None:
            out.append(
                {
                    "claim": f"{name} degrades past L: at least {rise:g}x by {times} "
                    "(mean over the seeds)",
                    "holds": cell["mean"] >= rise,
                    "detail": f"ratio at {times}: {_fmt(cell['mean'])} "
                    f"({_fmt(cell['min'])}-{_fmt(cell['max'])})",
                }
            )
    t5, rope, sin = at("t5"), at("rope"), at("sinusoidal")
    if t5 is not None and alibi is not None and rope is not None and sin is not None:
        worst = min(rope["mean"], sin["mean"])
        out.append(
            {
                "claim": f"T5's bias lies in between: above ALiBi, below RoPE and sinusoidal at "
                f"{times}",
                "holds": alibi["mean"] <= t5["mean"] <= worst,
                "detail": f"ALiBi {_fmt(alibi['mean'])} <= T5 {_fmt(t5['mean'])} <= {_fmt(worst)}",
            }
        )
    if "learned" in summary:
        past = [n for n in results["eval_lens"] if n > train_len]
        refused = [n for n in past if "error" in summary["learned"][str(n)]]
        out.append(
            {
                "claim": "learned absolute positions cannot run past L (a table of L rows)",
                "holds": bool(past) and refused == past,
                "detail": f"refused at {', '.join(map(str, refused)) or 'no length'}",
            }
        )
    return out


def comparison(results: Mapping[str, Any], rat: Mapping[str, Any]) -> dict[str, Any]:
    """Our ratios beside Press et al.'s at the nearest multiple of L (rows), and a
    sentence on what agrees and what does not."""
    theirs = press_ratios()
    train_len = results["train_len"]
    multiples = [n / train_len for n in results["eval_lens"] if n > train_len]
    columns = []
    for m in multiples:
        near = min(theirs["alibi"], key=lambda x: abs(math.log(x / m)))
        columns.append({"ours": m, "theirs": near, "theirs_len": round(near * 512)})
    rows = []
    for method in _PRESS_METHODS:
        if method not in rat:
            continue
        cells = []
        for col in columns:
            ours = rat[method].get(str(round(col["ours"] * train_len)))
            cells.append({"ours": ours, "theirs": theirs[method][col["theirs"]]})
        rows.append({"encoding": method, "cells": cells})
    return {
        "source": PRESS_2022["citation"],
        "url": PRESS_2022["url"],
        "columns": columns,
        "rows": rows,
        "sentence": _sentence(rows, columns, train_len),
    }


def _sentence(rows: list[dict[str, Any]], columns: list[dict[str, Any]], train_len: int) -> str:
    """One sentence from the numbers: the order of the encodings at the longest length
    (ours and theirs), ALiBi flat or not, and how the size of the rise compares."""
    if not rows or not columns:
        return "No encoding of Press et al.'s table is in this study."
    last = {r["encoding"]: r["cells"][-1] for r in rows if r["cells"][-1]["ours"] is not None}
    if not last:
        return "No encoding of Press et al.'s table has a ratio past L here."
    ours = sorted(last, key=lambda m: last[m]["ours"]["mean"])
    theirs = sorted(last, key=lambda m: last[m]["theirs"])
    col = columns[-1]
    where = f"{col['ours']:g}L (theirs {col['theirs']:.1f}L)"
    agree, differ = [], []
    if ours == theirs:
        agree.append(f"the order from flattest to steepest at {where}, {' < '.join(ours)}")
    else:
        differ.append(f"the order at {where}: ours {' < '.join(ours)}, theirs {' < '.join(theirs)}")
    if "alibi" in last:
        flat = abs(last["alibi"]["ours"]["mean"] - 1) <= 0.1
        (agree if flat else differ).append(
            f"ALiBi {'stays flat' if flat else 'does not stay flat'} "
            f"({last['alibi']['ours']['mean']:.2f}x, theirs {last['alibi']['theirs']:.2f}x)"
        )
    others = [m for m in ("sinusoidal", "rope") if m in last]
    if "alibi" in last and "t5" in last and others and ours != theirs:

        def t5_between(side: str) -> bool:
            value = {
                m: c["ours"]["mean"] if side == "ours" else c["theirs"] for m, c in last.items()
            }
            return bool(value["alibi"] < value["t5"] < min(value[m] for m in others))

        if t5_between("ours") and t5_between("theirs"):
            agree.append(f"T5's bias lies between ALiBi and {' and '.join(others)}")
    rising = [m for m in ("sinusoidal", "rope", "t5") if m in last]
    if rising:
        pairs = ", ".join(
            f"{m} {last[m]['ours']['mean']:.2f}x against {last[m]['theirs']:.2f}x" for m in rising
        )
        smaller = all(last[m]["ours"]["mean"] < last[m]["theirs"] for m in rising)
        larger = all(last[m]["ours"]["mean"] > last[m]["theirs"] for m in rising)
        size = "smaller" if smaller else "larger" if larger else "mixed in size"
        differ.append(
            f"the rise of the others is {size} here ({pairs}: a tiny byte-level model "
            f"trained on {train_len} bytes, not a 247M-parameter word-level one on 512 words)"
        )
    text = "Agrees with Press et al.: " + ("; ".join(agree) if agree else "nothing checked")
    return text + ". Differs: " + ("; ".join(differ) if differ else "nothing") + "."


def empty_record(status: str, reason: str | None = None) -> dict[str, Any]:
    """The report's ``lengthgen`` record with nothing in it yet (``status``: ``"absent"``,
    ``"skipped"``, ...)."""
    keys = ("settings", "results", "figure", "headline", "ratios", "checks", "comparison")
    return {"status": status, "reason": reason, **dict.fromkeys(keys)}


def run_report_study(out: Path, quick: bool, progress: Progress, *, jobs: int) -> dict[str, Any]:
    """Run the study and derive ratios, checks and comparison; errors are recorded in
    ``status`` / ``reason``, never raised (the analysis half of the report stands)."""
    settings = dict(LENGTHGEN_SETTINGS[quick])
    record = empty_record("absent")
    try:
        from posenc.experiments.lengthgen import run_study
        from posenc.experiments.settings import StudySettings
    except ImportError as e:
        record["reason"] = f"posenc.experiments.lengthgen is not available here ({e})"
        return record
    names = set(registry.names())
    settings["encodings"] = tuple(n for n in settings["encodings"] if n in names)
    record["settings"] = {
        k: list(v) if isinstance(v, tuple) else v for k, v in {**settings, "jobs": jobs}.items()
    }
    bar = _TrainingProgress(progress, settings)
    start = time.perf_counter()
    try:
        study = StudySettings.from_options(
            settings["task"],
            list(settings["encodings"]),
            preset=settings["preset"],
            seeds=list(settings["seeds"]),
            steps=settings["steps"],
            train_len=settings["train_len"],
            batch_size=settings["batch_size"],
            optimizer=settings["optimizer"],
            eval_lens=list(settings["eval_lens"]),
            eval_tokens=settings["eval_tokens"],
            extend=list(settings["extend"]),
            finetune_steps=settings["finetune_steps"],
        )
        # tiny models: one thread a process (as `posenc lengthgen`)
        results = run_study(study, plot=False, threads=1, jobs=jobs, on_event=bar)
    except Exception as e:  # the analysis half of the report is still worth writing
        record["status"] = "error"
        record["reason"] = f"{type(e).__name__}: {e}"
        return record
    bar.finished(time.perf_counter() - start)
    rat = ratios(results)
    record.update(
        status="ok",
        results=jsonable(results),  # inf / NaN -> null
        ratios=rat,
        checks=checks(results, rat, quick),
        comparison=comparison(results, rat),
    )
    return record


class _TrainingProgress:
    """The study's events as the report's ``lengthgen`` progress: training steps done of
    all the runs' (an extension's fine-tune, ``label`` with a ``+``, counts none)."""

    def __init__(self, progress: Progress, settings: Mapping[str, Any]) -> None:
        self.progress, self.steps = progress, int(settings["steps"])
        self.runs = len(settings["encodings"]) * len(settings["seeds"])
        self.total = self.steps * self.runs
        self.done: dict[tuple[str, int], int] = {}
        progress("lengthgen", 0, self.total, "length generalization")

    def __call__(self, kind: str, fields: dict[str, Any]) -> None:
        key = (fields["label"], fields["seed"])
        if kind == "step":
            self.done[key] = int(fields["info"].step)
        elif kind == "done" and "+" not in fields["label"]:
            self.done[key] = self.steps
        if kind in ("step", "done"):
            done = min(sum(self.done.values()), self.total)
            self.progress("lengthgen", done, self.total, "training")

    def finished(self, seconds: float) -> None:
        what = f"trained {self.runs} models in {seconds:.0f} s"
        self.progress("lengthgen", self.total, self.total, what)
