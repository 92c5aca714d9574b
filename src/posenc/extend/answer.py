"""The answer ``posenc extend`` leads with: which scaling to use up to which length.

At each length, the scalings set for that length (factor ``length / L``; ``none`` and the
config's own at factor 1) are ranked by perplexity over all tokens. The best one is
``better`` than another only if its perplexity is lower on every document measured (with
one document, lower by more than 1%); otherwise the two are ``level``: the answer names
every scaling level with the best, and never claims an order the documents do not show.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["answer", "compare"]

_ONE_DOC_MARGIN = 0.01


def compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """``better`` (``a`` has lower perplexity than ``b`` on every shared document; with
    one document, by more than 1%), ``worse`` (the reverse) or ``level``."""
    docs = sorted(set(a["ppl_by_document"]) & set(b["ppl_by_document"]))
    if not docs:
        return "level"
    pa = [a["ppl_by_document"][d] for d in docs]
    pb = [b["ppl_by_document"][d] for d in docs]
    margin = _ONE_DOC_MARGIN if len(docs) == 1 else 0.0
    if all(x < y * (1 - margin) for x, y in zip(pa, pb)):
        return "better"
    if all(y < x * (1 - margin) for x, y in zip(pa, pb)):
        return "worse"
    return "level"


def _candidates(
    records: Sequence[Mapping[str, Any]], length: int, trained: int
) -> list[Mapping[str, Any]]:
    out = []
    for r in records:
        if r["length"] != length or r.get("ppl") is None:
            continue
        if length == trained and r["scaling"] not in ("none", "config"):
            continue  # at L the other scalings run at the factor set for --to
        out.append(r)
    return sorted(out, key=lambda r: r["ppl"])


def answer(results: Mapping[str, Any]) -> dict[str, Any]:
    """Per length the best scaling, those level with it, and the verdict of the best
    against each other one; ``sentence``: the answer in words; ``cost_at_L``: each
    scaling set for ``--to``, run at ``L``, against no scaling."""
    records, trained = results["records"], results["trained_context"]
    per_length = []
    for length in sorted({r["length"] for r in records}):
        ranked = _candidates(records, length, trained)
        if not ranked:
            continue
        best = ranked[0]
        verdicts = {r["key"]: compare(best, r) for r in ranked[1:]}
        level = [best["scaling"]] + [
            r["scaling"] for r in ranked[1:] if verdicts[r["key"]] == "level"
        ]
        per_length.append(
            {
                "length": length,
                "best": best["scaling"],
                "factor": best["factor"],
                "ppl": best["ppl"],
                "passkey_accuracy": best.get("passkey_accuracy"),
                "level_with_best": level,
                "verdicts": verdicts,
            }
        )
    baseline = next((r for r in records if r["scaling"] == "none" and r["length"] == trained), None)
    cost = []
    if baseline is not None:
        for r in records:
            if r["length"] == trained and r["scaling"] not in ("none", "config"):
                cost.append(
                    {
                        "scaling": r["scaling"],
                        "factor": r["factor"],
                        "ppl": r["ppl"],
                        "ppl_none": baseline["ppl"],
                        "verdict": compare(r, baseline),
                    }
                )
    return {"per_length": per_length, "cost_at_L": cost, "sentence": _sentence(per_length, trained)}


def _name(scaling: str, factor: float) -> str:
    return scaling if factor == 1 else f"{scaling} (factor {factor:g})"


def _sentence(per_length: Sequence[Mapping[str, Any]], trained: int) -> str:
    if not per_length:
        return "Nothing was measured."
    parts = []
    for row in per_length:
        level = [s for s in row["level_with_best"] if s != row["best"]]
        tie = f", level with {', '.join(level)}" if level else ""
        parts.append(
            f"at {row['length']} tokens use {_name(row['best'], row['factor'])}{tie} (ppl {row['ppl']:.3g})"
        )
    return f"Trained at {trained} tokens: " + "; ".join(parts) + "."
