"""The answer ``posenc extend`` leads with: which scaling to use up to which length.

At each length, the scalings set for that length (factor ``length / L``; ``none`` and the
config's own at factor 1) are ranked by perplexity over all tokens. Two of them are ordered
by the rule every comparison in posenc uses
(:func:`~posenc.experiments.comparisons.paired_verdict`), paired by document: the
difference of their perplexities on each document measured, and a 95 % t interval of the
mean difference. One is ``better`` than the other only where the whole interval is below 0;
where it holds 0, or fewer than two documents were measured, the two are ``level``: the
answer names every scaling level with the best, and never claims an order the documents do
not show.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from posenc._errors import PosEncError
from posenc.experiments.comparisons import paired_verdict
from posenc.extend.settings import NONE, UNSCALED

__all__ = ["RULE", "answer", "compare", "paired"]

#: The rule in words, as the page states it.
RULE = (
    "Better and worse are decided per document: the difference in perplexity on each "
    "document, and a 95% t interval of their mean; better where the whole interval is "
    "below 0, level where it holds 0 or fewer than two documents were measured."
)


def paired(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """``a`` against ``b`` (unit records with ``ppl_by_document``), paired by the documents
    both measured: ``documents``, ``differences`` (``a - b`` each), their ``mean``, its 95 %
    ``interval`` (None under two documents) and the ``verdict``: ``better`` (``a`` lower),
    ``worse`` or ``level``."""
    docs = sorted(set(a["ppl_by_document"]) & set(b["ppl_by_document"]))
    differences = [a["ppl_by_document"][d] - b["ppl_by_document"][d] for d in docs]
    try:
        mean, interval, verdict = paired_verdict(differences)
    except PosEncError:  # no shared document, or a perplexity past what can be averaged
        mean, interval, verdict = None, None, "level"
    return {
        "documents": docs,
        "differences": differences,
        "mean": mean,
        "interval": interval,
        "verdict": verdict,
    }


def compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    """``better`` (``a``'s perplexity is below ``b``'s by the rule of :func:`paired`),
    ``worse`` (above) or ``level``."""
    return str(paired(a, b)["verdict"])


def _candidates(
    records: Sequence[Mapping[str, Any]], length: int, trained: int
) -> list[Mapping[str, Any]]:
    out = []
    for r in records:
        if r["length"] != length or r.get("ppl") is None:
            continue
        if length == trained and r["scaling"] not in UNSCALED:
            continue  # at L the other scalings run at the factor set for --to
        out.append(r)
    return sorted(out, key=lambda r: r["ppl"])


def _per_length(records: Sequence[Mapping[str, Any]], trained: int) -> list[dict[str, Any]]:
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
                "passkey_accuracy": best.get("passkey_accuracy"),
                "level_with_best": level,
                "verdicts": {key: p["verdict"] for key, p in pairs.items()},
                "intervals": {key: p["interval"] for key, p in pairs.items()},
            }
        )
    return rows


def answer(results: Mapping[str, Any]) -> dict[str, Any]:
    """Per length the best scaling, those level with it, and the verdict (with its
    interval) of the best against each other one; ``sentence``: the answer in words;
    ``cost_at_L``: each scaling set for ``--to``, run at ``L``, against no scaling."""
    records, trained = results["records"], results["trained_context"]
    per_length = _per_length(records, trained)
    baseline = next((r for r in records if r["scaling"] == NONE and r["length"] == trained), None)
    cost = []
    if baseline is not None:
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
