"""The report's length-generalization study: its settings, its run, and what it shows.

:func:`run_report_study` trains the study of :data:`LENGTHGEN_SETTINGS` with
:func:`posenc.experiments.lengthgen.run_study` (every ``(seed, encoding)`` in worker
processes), then derives from the results what the page leads with:

- ``ratios``: per encoding and eval length, ``ppl(n) / ppl(L)`` of each seed, as mean /
  min / max over the seeds (a seed's model is compared with itself);
- ``checks``: what the literature says should hold, each tested on those numbers;
- ``comparison``: our ratios beside Press et al.'s (:mod:`.literature`) at the nearest
  multiples of ``L``; Press et al.'s order (ALiBi < T5 < RoPE < sinusoidal in growth) as
  paired comparisons over the seeds (:data:`PRESS_COMPARISONS`, each with a 95 % interval
  and a verdict, :mod:`posenc.experiments.comparisons`); and one sentence, written from
  those verdicts, on what agrees, what is level at this scale and what does not.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from posenc import registry
from posenc.analysis._results import jsonable
from posenc.experiments.comparisons import Comparison, describe
from posenc.report.literature import PRESS_2022, press_ratios

__all__ = [
    "LENGTHGEN_SETTINGS",
    "PRESS_COMPARISONS",
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

#: Press et al.'s order of the growth ppl(nL) / ppl(L) at every length of their table past
#: L, ALiBi < T5 < RoPE < sinusoidal, as the adjacent pairs, each measured over the seeds.
PRESS_COMPARISONS: tuple[Comparison, ...] = tuple(
    Comparison(a, b, "ppl_growth", "past", expect="better", source="Press et al. 2022, Table 2")
    for a, b in (("alibi", "t5"), ("t5", "rope"), ("rope", "sinusoidal"))
)


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
    between = _t5_between(results, longest)
    if between is not None:
        holds, detail = between
        out.append(
            {
                "claim": f"T5's bias lies in between at {times}: flatter than RoPE, steeper than "
                "ALiBi, each beyond the seeds' spread (95% interval)",
                "holds": holds,
                "detail": detail,
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


def _t5_between(results: Mapping[str, Any], longest: str) -> tuple[bool, str] | None:
    """Whether ALiBi < T5 < RoPE in growth at ``longest``, from the comparisons' verdicts;
    None when the study has not made both."""
    rows = {
        (r["a"], r["b"]): r
        for r in results.get("comparisons", {}).get("rows", [])
        if r["metric"] == "ppl_growth" and str(r["length"]) == longest
    }
    low, high = rows.get(("alibi", "t5")), rows.get(("t5", "rope"))
    if low is None or high is None:
        return None
    holds = low["verdict"] == "better" and high["verdict"] == "better"
    return holds, f"{describe(low)}; {describe(high)}"


def comparison(results: Mapping[str, Any], rat: Mapping[str, Any]) -> dict[str, Any]:
    """Our ratios beside Press et al.'s at the nearest multiple of L (rows), Press et
    al.'s order as verdicts over the seeds (``verdicts``, ``status``), and a sentence on
    what agrees and what does not, written from those verdicts."""
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
    record = results.get("comparisons") or {}
    verdicts = [r for r in record.get("rows", []) if r.get("expect") is not None]
    status = (record.get("verdict") or {}).get("status", "no claim")
    return {
        "source": PRESS_2022["citation"],
        "url": PRESS_2022["url"],
        "columns": columns,
        "rows": rows,
        "verdicts": verdicts,
        "status": status,
        "sentence": _sentence(rows, columns, train_len, verdicts),
    }


def _sentence(
    rows: list[dict[str, Any]],
    columns: list[dict[str, Any]],
    train_len: int,
    verdicts: list[dict[str, Any]],
) -> str:
    """One sentence from the verdicts: Press et al.'s order pair by pair at the longest
    length (as theirs beyond the spread, level at this scale, or against theirs), ALiBi flat
    in every seed or not, and how the size of the rise compares. A level pair is never
    ordered."""
    if not rows or not columns:
        return "No encoding of Press et al.'s table is in this study."
    last = {r["encoding"]: r["cells"][-1] for r in rows if r["cells"][-1]["ours"] is not None}
    if not last:
        return "No encoding of Press et al.'s table has a ratio past L here."
    col = columns[-1]
    longest = round(col["ours"] * train_len)
    agree, level, differ = [], [], []
    every = bool(verdicts) and all(v["verdict"] == v["expect"] for v in verdicts)
    if every:
        agree.append(
            f"their order of the growth, {' < '.join(_PRESS_ORDER)}, each pair beyond the "
            f"seeds' spread at every length past L (to {col['ours']:g}L, theirs "
            f"{col['theirs']:.1f}L)"
        )
    else:
        for v in (v for v in verdicts if v["length"] == longest):
            said = describe(v)
            if v["verdict"] == v["expect"]:
                agree.append(said)
            elif v["verdict"] == "level":
                level.append(said)
            else:
                differ.append(said)
    if "alibi" in last:
        cell = last["alibi"]["ours"]
        flat = abs(cell["min"] - 1) <= 0.1 and abs(cell["max"] - 1) <= 0.1
        (agree if flat else differ).append(
            f"ALiBi {'stays flat' if flat else 'does not stay flat'} in every seed "
            f"({cell['min']:.2f}-{cell['max']:.2f}x, theirs {last['alibi']['theirs']:.2f}x)"
        )
    rising = [m for m in ("sinusoidal", "rope", "t5") if m in last]
    if rising:
        pairs = ", ".join(
            f"{m} {last[m]['ours']['mean']:.2f}x ({last[m]['ours']['min']:.2f}-"
            f"{last[m]['ours']['max']:.2f}) against {last[m]['theirs']:.2f}x"
            for m in rising
        )
        smaller = all(last[m]["ours"]["max"] < last[m]["theirs"] for m in rising)
        larger = all(last[m]["ours"]["min"] > last[m]["theirs"] for m in rising)
        size = "smaller" if smaller else "larger" if larger else "mixed in size"
        differ.append(
            f"the rise of the others is {size} here ({pairs}: a tiny byte-level model "
            f"trained on {train_len} bytes, not a 247M-parameter word-level one on 512 words)"
        )
    where = "" if every else f" at {col['ours']:g}L (theirs {col['theirs']:.1f}L)"
    text = f"Agrees with Press et al.{where}: " + ("; ".join(agree) or "nothing checked")
    if level:
        text += ". Level at this scale: " + "; ".join(level)
    return text + ". Differs: " + ("; ".join(differ) if differ else "nothing") + "."


_PRESS_ORDER = ("alibi", "t5", "rope", "sinusoidal")


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
        results = run_study(
            study, plot=False, threads=1, jobs=jobs, on_event=bar, comparisons=PRESS_COMPARISONS
        )
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
