"""The answer ``posenc extend`` leads with: which setting to use up to which length.

A *setting* is a scaling at one factor: ``none`` and ``config`` at factor 1 over every
length; each other scaling at factor ``f`` over its units with that factor (``length / L``
at a length past ``L``; ``to`` at ``L``). Units that took another's numbers (``same_as``)
count as measured.

- **The bar.** Per task, ``bar`` (0.9) times the model's own score unscaled (``none``) at
  the shortest length measured. A task whose 95 % Wilson interval there reaches down to its
  chance level (:data:`posenc.extend.probes.CHANCE`), or that no probe measured, is
  reported (``included: False`` and why) and left out of the verdict.
- **Holds.** A setting holds at a length when each included task's score there is at
  least its bar (the point score; its interval is shown beside it) and its perplexity is at
  most ``1 + ppl_tolerance`` times ``none``'s at ``L``. A length with no score for an
  included task does not hold.
- **Effective length.** The longest measured length at which the setting holds and held at
  every shorter length it was measured at; None where it does not hold at its first.
- **The recommendation at a length** is among the settings measured there whose effective
  length reaches it: ``none``, then ``config``, where one of them holds; else the highest
  mean probe score, and among those level with it by probes the lowest perplexity. The
  others level with the one chosen by probes and by perplexity are its ``or``. A setting
  not measured at a length (a factor set for another length) is not recommended there.
- **Comparisons** use the project's one rule
  (:func:`posenc.experiments.paired.paired_verdict`, via ``experiments.comparisons``):
  probe scores paired by probe id (the same prompts for every setting at one length), and
  perplexity paired by document, or, with one document, by position bucket of it
  (``pairing``). ``level`` wherever the 95 % interval holds 0 or nothing pairs.
- With no task included the answer rests on perplexity alone, and its lead says so.

Consecutive lengths with the same recommendation make one range of the lead: ``"up to
8192: none (or dynamic factor 2); up to 16384: yarn factor 2"``; ``choice`` is the
recommendation at the longest length that has one (what ``--emit`` writes by default).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from posenc._errors import PosEncError, check_float
from posenc.experiments.comparisons import paired_verdict
from posenc.extend.settings import CONFIG, NONE, SCALING_NAMES, UNSCALED

__all__ = ["BAR", "PPL_TOLERANCE", "RULE", "answer", "compare", "paired", "paired_scores"]

#: The defaults of ``settings["bar"]`` and ``settings["ppl_tolerance"]``.
BAR, PPL_TOLERANCE = 0.9, 0.1

#: The rule in words, as the page states it.
RULE = (
    "A setting holds at a length when, on every task the model does unscaled at the "
    "shortest length (its 95% Wilson interval there above chance), its score is at least "
    "the bar (a fraction of that unscaled score), and its perplexity is at most the "
    "tolerance above the unscaled perplexity at the trained context; its effective length is the "
    "longest length it holds at, having held at every shorter one. At each length no "
    "scaling is preferred where it holds, else the best probe score, then the lowest "
    "perplexity. Two settings are ordered by the difference of their probe scores paired "
    "by probe, and of their perplexities paired by document (by position bucket with one "
    "document), with a 95% t interval of the mean difference: better where the whole "
    "interval is on one side of 0, level where it holds 0 or nothing pairs."
)

Record = Mapping[str, Any]
Setting = tuple[str, float]


def _level(differences: Sequence[float]) -> tuple[float | None, list[float] | None, str]:
    try:
        return paired_verdict(list(differences))
    except PosEncError:  # nothing pairs, or a number past what can be averaged
        return None, None, "level"


def _buckets(a: Record, b: Record, doc: str) -> list[float] | None:
    """``a - b`` per position bucket of ``doc``, or None where either lacks them."""
    got = [r.get("ppl_by_bucket_document", {}).get(doc) for r in (a, b)]
    if not all(isinstance(g, (list, tuple)) and len(g) > 1 for g in got):
        return None
    if len(got[0]) != len(got[1]):
        return None
    return [x - y for x, y in zip(got[0], got[1])]


def paired(a: Record, b: Record) -> dict[str, Any]:
    """``a``'s perplexity against ``b``'s (unit records), paired by the documents both
    measured, or, where they share exactly one, by its position buckets
    (``ppl_by_bucket_document``; by the document alone where either lacks them).

    Returns ``documents``, ``pairing`` (``"document"``, ``"bucket"``, or None where no
    document is shared), ``differences`` (``a - b`` each), their ``mean``, its 95 %
    ``interval`` (None under two pairs) and the ``verdict``: ``better`` (``a`` lower),
    ``worse`` or ``level``."""
    docs = sorted(set(a["ppl_by_document"]) & set(b["ppl_by_document"]))
    differences = [a["ppl_by_document"][d] - b["ppl_by_document"][d] for d in docs]
    pairing = "document" if docs else None
    if len(docs) == 1 and (by_bucket := _buckets(a, b, docs[0])) is not None:
        differences, pairing = by_bucket, "bucket"
    mean, interval, verdict = _level(differences)
    return {
        "documents": docs,
        "pairing": pairing,
        "differences": differences,
        "mean": mean,
        "interval": interval,
        "verdict": verdict,
    }


def compare(a: Record, b: Record) -> str:
    """``better`` (``a``'s perplexity is below ``b``'s by the rule of :func:`paired`),
    ``worse`` (above) or ``level``."""
    return str(paired(a, b)["verdict"])


def paired_scores(a: Record, b: Record, tasks: Sequence[str]) -> dict[str, Any]:
    """``a``'s probe scores against ``b``'s on ``tasks``, paired by probe id: ``probes``
    (how many pair), ``mean`` (of ``b - a``: the rule's differences are lower-is-better,
    so a negative mean is ``a`` scoring higher), ``interval`` and ``verdict`` (``better``:
    ``a`` scores higher)."""
    mine = {p["id"]: p["score"] for p in a.get("probes") or () if p["task"] in tasks}
    theirs = {p["id"]: p["score"] for p in b.get("probes") or () if p["task"] in tasks}
    ids = sorted(set(mine) & set(theirs))
    mean, interval, verdict = _level([theirs[i] - mine[i] for i in ids])
    return {"probes": len(ids), "mean": mean, "interval": interval, "verdict": verdict}


def _mean_score(record: Record, tasks: Sequence[str]) -> float:
    scores = [p["score"] for p in record.get("probes") or () if p["task"] in tasks]
    return math.fsum(scores) / len(scores) if scores else 0.0


# --- the bar ----------------------------------------------------------------------------------


def _chance() -> Mapping[str, float]:
    from posenc.extend.probes import CHANCE

    return CHANCE


def _tasks(
    task_names: Sequence[str], baseline: Record | None, bar: float
) -> dict[str, dict[str, Any]]:
    """Per task the model's own score unscaled at the shortest length, its bar, and
    whether it enters the verdict."""
    chance, out = _chance(), {}
    where = f"unscaled at {baseline['length']}" if baseline is not None else "unscaled"
    for task in task_names:
        s = ((baseline or {}).get("scores") or {}).get(task) or {}
        row: dict[str, Any] = {
            "baseline": s.get("score"),
            "low": s.get("low"),
            "high": s.get("high"),
            "probes": s.get("probes", 0),
            "bar": None if s.get("score") is None else bar * s["score"],
            "included": False,
            "reason": None,
        }
        if not row["probes"] or row["baseline"] is None:
            row["reason"] = f"no probe of it ran {where}"
        elif row["low"] <= chance.get(task, 0.0):
            row["reason"] = (
                f"{where} it scores {row['baseline']:.2f} [{row['low']:.2f}, "
                f"{row['high']:.2f}] over {row['probes']} probes: the interval reaches "
                f"chance ({chance.get(task, 0.0):g})"
            )
        else:
            row["included"] = True
        out[task] = row
    return out


# --- settings and their effective lengths -----------------------------------------------------


def _order(setting: Setting) -> tuple[int, str, float]:
    name, factor = setting
    rank = SCALING_NAMES.index(name) if name in SCALING_NAMES else len(SCALING_NAMES)
    return rank, name, factor


def _by_setting(records: Sequence[Record]) -> dict[Setting, dict[int, Record]]:
    out: dict[Setting, dict[int, Record]] = {}
    for r in records:
        out.setdefault((r["scaling"], float(r["factor"])), {})[r["length"]] = r
    return {k: dict(sorted(out[k].items())) for k in sorted(out, key=_order)}


def _failed(
    record: Record, tasks: Mapping[str, Mapping[str, Any]], ceiling: float | None
) -> list[str]:
    failed = []
    for task, row in tasks.items():
        if row["included"]:
            s = (record.get("scores") or {}).get(task) or {}
            if not s.get("probes") or s.get("score") is None or s["score"] < row["bar"]:
                failed.append(task)
    ppl = record.get("ppl")
    if ppl is None or ceiling is None or not math.isfinite(ppl) or ppl > ceiling:
        failed.append("ppl")
    return failed


def _settings(
    by_setting: Mapping[Setting, Mapping[int, Record]],
    tasks: Mapping[str, Mapping[str, Any]],
    ceiling: float | None,
) -> list[dict[str, Any]]:
    out = []
    for (scaling, factor), units in by_setting.items():
        lengths, effective, broken = [], None, False
        for length, record in units.items():
            failed = _failed(record, tasks, ceiling)
            broken = broken or bool(failed)
            effective = effective if broken else length
            lengths.append(
                {
                    "length": length,
                    "holds": not failed,
                    "failed": failed,
                    "ppl": record.get("ppl"),
                    "scores": dict(record.get("scores") or {}),
                }
            )
        out.append(
            {
                "scaling": scaling,
                "factor": factor,
                "effective_length": effective,
                "lengths": lengths,
            }
        )
    return out


# --- the recommendation per length ------------------------------------------------------------


def _recommend(
    candidates: Sequence[tuple[Setting, Record]], included: Sequence[str]
) -> tuple[Setting, list[Setting]]:
    """The setting recommended among ``candidates`` (each holding at this length, in the
    canonical order) and those level with it by probes and by perplexity."""
    unscaled = [c for c in candidates if c[0][0] in (NONE, CONFIG) and c[0][1] == 1.0]
    if unscaled:
        best = unscaled[0]
    elif included:
        ranked = sorted(candidates, key=lambda c: -_mean_score(c[1], included))
        top = ranked[0]
        tied = [
            c
            for c in ranked
            if c is top or paired_scores(top[1], c[1], included)["verdict"] == "level"
        ]
        best = min(tied, key=lambda c: c[1]["ppl"])
    else:
        best = min(candidates, key=lambda c: c[1]["ppl"])
    alternatives = [
        setting
        for setting, record in candidates
        if setting != best[0]
        and paired(best[1], record)["verdict"] == "level"
        and (not included or paired_scores(best[1], record, included)["verdict"] == "level")
    ]
    return best[0], alternatives


def _reasons(settings: Sequence[Mapping[str, Any]], length: int, order: Sequence[str]) -> str:
    """What fails at ``length`` across the settings measured there (in task order), and
    which held there but failed at a shorter length."""
    at = [(s, n) for s in settings for n in s["lengths"] if n["length"] == length]
    failed = {f for _, n in at for f in n["failed"]}
    reasons = ", ".join(t for t in (*order, "ppl") if t in failed)
    earlier = ", ".join(_name(s["scaling"], s["factor"]) for s, n in at if n["holds"])
    if earlier:
        reasons += f"{'; ' if reasons else ''}{earlier} failed at a shorter length"
    return reasons


def _ranges(
    settings: Sequence[Mapping[str, Any]],
    by_setting: Mapping[Setting, Mapping[int, Record]],
    included: Sequence[str],
    task_order: Sequence[str],
) -> tuple[list[dict[str, Any]], list[str]]:
    ranges: list[dict[str, Any]] = []
    parts: list[str] = []
    lengths = sorted({n for units in by_setting.values() for n in units})
    for n in lengths:
        candidates = [
            ((s["scaling"], s["factor"]), by_setting[s["scaling"], s["factor"]][n])
            for s in settings
            if n in by_setting[s["scaling"], s["factor"]]
            and s["effective_length"] is not None
            and s["effective_length"] >= n
        ]
        if not candidates:
            ranges.append({"up_to": n, "scaling": None, "factor": None, "or": []})
            parts.append(
                f"at {n}: no measured setting holds the bar ({_reasons(settings, n, task_order)})"
            )
            continue
        (scaling, factor), alternatives = _recommend(candidates, included)
        last = ranges[-1] if ranges else None
        if last is not None and (last["scaling"], last["factor"]) == (scaling, factor):
            last["up_to"] = n
            last["or"] = [o for o in last["or"] if tuple(o) in alternatives]
            parts.pop()
        else:
            last = {
                "up_to": n,
                "scaling": scaling,
                "factor": factor,
                "or": [list(a) for a in alternatives],
            }
            ranges.append(last)
        parts.append(_range_text(last))
    return ranges, parts


def _name(scaling: str, factor: float) -> str:
    return scaling if scaling in UNSCALED or factor == 1 else f"{scaling} factor {factor:g}"


def _range_text(r: Mapping[str, Any]) -> str:
    others = ", ".join(_name(s, f) for s, f in r["or"])
    return f"up to {r['up_to']}: {_name(r['scaling'], r['factor'])}" + (
        f" (or {others})" if others else ""
    )


# --- perplexity per length and the cost at L (as before the probes) ---------------------------


def _candidates(records: Sequence[Record], length: int, trained: int) -> list[Record]:
    out = []
    for r in records:
        if r["length"] != length or r.get("ppl") is None:
            continue
        if length == trained and r["scaling"] not in UNSCALED:
            continue  # at L the other scalings run at the factor set for --to
        out.append(r)
    return sorted(out, key=lambda r: r["ppl"])


def _per_length(records: Sequence[Record], trained: int) -> list[dict[str, Any]]:
    rows = []
    for length in sorted({r["length"] for r in records}):
        ranked = _candidates(records, length, trained)
        if not ranked:
            continue
        best = ranked[0]
        pairs = {r["key"]: paired(best, r) for r in ranked[1:]}
        level = [best["scaling"]] + [
            r["scaling"] for r in ranked[1:] if pairs[r["key"]]["verdict"] == "level"
        ]
        rows.append(
            {
                "length": length,
                "best": best["scaling"],
                "factor": best["factor"],
                "ppl": best["ppl"],
                "level_with_best": level,
                "pairing": next((p["pairing"] for p in pairs.values()), None),
                "verdicts": {key: p["verdict"] for key, p in pairs.items()},
                "intervals": {key: p["interval"] for key, p in pairs.items()},
            }
        )
    return rows


def _cost(records: Sequence[Record], baseline: Record | None, trained: int) -> list[dict[str, Any]]:
    cost: list[dict[str, Any]] = []
    if baseline is None:
        return cost
    for r in records:
        if r["length"] == trained and r["scaling"] not in UNSCALED:
            against = paired(r, baseline)
            cost.append(
                {
                    "scaling": r["scaling"],
                    "factor": r["factor"],
                    "ppl": r["ppl"],
                    "ppl_none": baseline["ppl"],
                    "verdict": against["verdict"],
                    "interval": against["interval"],
                    "pairing": against["pairing"],
                }
            )
    return cost


# --- the answer -------------------------------------------------------------------------------


def _knobs(settings: Mapping[str, Any]) -> tuple[float, float]:
    bar = check_float("bar", settings.get("bar", BAR), min=0.0, max=1.0)
    tolerance = check_float("ppl_tolerance", settings.get("ppl_tolerance", PPL_TOLERANCE), min=0.0)
    return bar, tolerance


def _lead(parts: Sequence[str], tasks: Mapping[str, Mapping[str, Any]], first: int | None) -> str:
    if not parts:
        return "Nothing was measured."
    text = "; ".join(parts)
    if not any(t["included"] for t in tasks.values()):
        ran = any(t["probes"] for t in tasks.values())
        why = f"the model does none of the tasks unscaled at {first}" if ran else "no probe ran"
        text += f". By perplexity alone: {why}."
    return text


def answer(results: Mapping[str, Any]) -> dict[str, Any]:
    """The answer of a run (``results``: ``records``, ``settings`` with ``tasks``, ``bar``
    and ``ppl_tolerance``, ``trained_context``), by the rules of this module: ``lead`` (and
    ``sentence``, the same text), ``ranges``, ``choice``, ``tasks``, ``settings``,
    ``per_length``, ``cost_at_L`` and ``rule``.

    Raises:
        PosEncError: ``bar`` is not in ``[0, 1]``, or ``ppl_tolerance`` is negative.
    """
    records, trained = results["records"], results["trained_context"]
    options = results.get("settings") or {}
    bar, tolerance = _knobs(options)
    unscaled = sorted((r for r in records if r["scaling"] == NONE), key=lambda r: r["length"])
    first = unscaled[0] if unscaled else None
    at_l = next((r for r in unscaled if r["length"] == trained), None)
    reference = None if at_l is None else at_l.get("ppl")
    names = options.get("tasks") or list((first or {}).get("scores") or {})
    tasks = _tasks(names, first, bar)
    included = [t for t, row in tasks.items() if row["included"]]
    by_setting = _by_setting(records)
    ceiling = None if reference is None else (1.0 + tolerance) * reference
    settings = _settings(by_setting, tasks, ceiling)
    ranges, parts = _ranges(settings, by_setting, included, list(tasks))
    held = [r for r in ranges if r["scaling"] is not None]
    choice = (
        {"scaling": held[-1]["scaling"], "factor": held[-1]["factor"], "length": held[-1]["up_to"]}
        if held
        else None
    )
    lead = _lead(parts, tasks, None if first is None else first["length"])
    return {
        "lead": lead,
        "sentence": lead,
        "ranges": ranges,
        "choice": choice,
        "tasks": tasks,
        "settings": settings,
        "per_length": _per_length(records, trained),
        "cost_at_L": _cost(records, at_l, trained),
        "rule": RULE,
    }
