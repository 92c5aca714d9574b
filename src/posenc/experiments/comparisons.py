"""The comparisons a study exists to make, each tested on the spread over its seeds.

A :class:`Comparison` names two cells of a study, ``a`` and ``b`` (a run label and a
metric each), the lengths it is made at and, when it is one the paper makes, the paper's
direction (``expect``: ``"better"`` when the paper has ``a`` below ``b``). :func:`compare`
measures it on a study's runs: with each seed every model of a study starts from the same
initialisation and sees the same batches (:mod:`.lengthgen`), so the differences
``a - b`` are paired by seed; their mean gets a 95 % t interval over the seeds (with 3 to
6 seeds a bootstrap interval is too narrow to trust), and the verdict is ``better`` (the
whole interval on ``a``'s better side), ``worse`` (the whole interval on ``b``'s) or
``level`` (the interval holds 0, or fewer than two seeds have both cells).

:func:`verdict` reads a study's comparisons as a sentence: "reproduced" only where every
comparison the paper makes has the paper's direction and is not level; a level one is
called level at this scale and never ordered.

Metrics (every one lower-is-better, so "better" reads the same everywhere):

- ``ppl``, ``ppl_past``: perplexity over the window, over its positions past ``L``;
- ``ppl_growth``: ``ppl`` at the length over ``ppl`` at ``L`` (each seed's own model);
- ``error``: % of examples not exactly right (``100 (1 - accuracy)``);
- ``read_error``: % of scored tokens wrong (flip-flop's read bits), on the task's eval
  split, or ``read_error@SPLIT`` on another (``sparse``, ``dense``, ``train``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from posenc._errors import PosEncError
from posenc.experiments.paired import paired_verdict
from posenc.experiments.records import check_metric, check_record, check_row, check_rows
from posenc.experiments.student_t import t_quantile

__all__ = [
    "INTERVAL",
    "METRICS",
    "NAMES",
    "Comparison",
    "check_comparisons",
    "compare",
    "default_comparisons",
    "describe",
    "paired_verdict",
    "t_quantile",
    "verdict",
]

#: How every interval is made (written into ``results.json``).
INTERVAL = (
    "95% t interval of the mean of the per-seed differences a - b (paired by seed: "
    "a seed's models share initialisation and data); level when it holds 0 or fewer "
    "than 2 seeds have both cells"
)

#: Lengths a comparison is made at: ``"L"`` (the training length), ``"past"`` (every
#: eval length past it), ``"longest"``, ``"all"``.
LENGTHS = ("L", "past", "longest", "all")

Cell = Mapping[str, Any]

#: How the pages name the studies' run labels.
NAMES: dict[str, str] = {
    "none": "NoPE",
    "rope": "RoPE",
    "alibi": "ALiBi",
    "t5": "T5",
    "cope": "CoPE",
    "fox": "forgetting attention",
    "prope-0.25": "0.25-RoPE",
    "prope-0.75": "0.75-RoPE",
    "rope@nope-every-4": "NoPE every 4th layer",
    "rope@llama4": "Llama 4's recipe",
    "drope": "DroPE",
    "rope+yarn": "RoPE + YaRN",
    "rope+ntk": "RoPE + NTK",
    "rope+pi": "RoPE + PI",
}


def _ppl(key: str) -> Callable[[Cell, Cell], float | None]:
    return lambda cell, base: cell.get(key)


def _growth(cell: Cell, base: Cell) -> float | None:
    here, there = cell.get("ppl"), base.get("ppl")
    return None if here is None or not there else here / there


def _error(cell: Cell, base: Cell) -> float | None:
    accuracy = cell.get("accuracy")
    return None if accuracy is None else 100.0 * (1.0 - accuracy)


def _read_error(cell: Cell, base: Cell) -> float | None:
    accuracy = cell.get("token_accuracy")
    return None if accuracy is None else 100.0 * (1.0 - accuracy)


#: Metric name -> (what it is, its value from an eval cell and the cell at ``L``).
METRICS: dict[str, tuple[str, Callable[[Cell, Cell], float | None]]] = {
    "ppl": ("perplexity", _ppl("ppl")),
    "ppl_past": ("perplexity past L", _ppl("ppl_past")),
    "ppl_growth": ("ppl / ppl at L", _growth),
    "error": ("error %", _error),
    "read_error": ("read error %", _read_error),
}


_EXTENSIONS = ("pi", "ntk", "yarn")


def _check_label(name: str, value: Any) -> None:
    """``value`` must be a label a study reports a run under: a registry name or variant
    (``prope-0.75``, ``drope``), with its ``@SCHEDULE``, and for a RoPE extension run
    ``+pi`` / ``+ntk`` / ``+yarn`` (``+ft`` for its fine-tune)."""
    rule = (
        f"{name} must be a run label (a registry name or variant, optionally @SCHEDULE, and "
        f"+pi, +ntk or +yarn with +ft for a RoPE extension run)"
    )
    if not isinstance(value, str) or not value:
        raise PosEncError(f"{rule}, got {value!r:.80}")
    base, *extension = value.split("+")
    if extension and (
        extension[0] not in _EXTENSIONS or extension[1:] not in ([], ["ft"]) or "@" in base
    ):
        raise PosEncError(f"{rule}, got {value!r:.80}")
    from posenc.experiments.models import encoding_label

    try:
        label = encoding_label(base)
    except PosEncError as e:
        raise PosEncError(f"{rule}, got {value!r:.80} ({e})") from None
    if label != base:
        raise PosEncError(f"{rule} as the study reports it ({label!r} for {base!r})")


@dataclasses.dataclass(frozen=True)
class Comparison:
    """``a`` against ``b`` on ``metric`` (``b_metric``: ``b``'s, when it differs) at
    ``lengths`` (one of :data:`LENGTHS`, or eval lengths as multiples of ``L``).

    Attributes:
        a, b: run labels (``"rope"``, ``"rope+yarn"``, ``"prope-0.75"``).
        metric, b_metric: see the module's list; ``b_metric`` None: ``metric``.
        lengths: ``"L"``, ``"past"``, ``"longest"``, ``"all"``, or a tuple of multiples.
        expect: the paper's direction for ``a`` (``"better"`` or ``"worse"``); None: a
            comparison posenc reads that the paper does not make.
        source: who says so (``"Barbero et al. 2025"``); empty: posenc's own reading.
    """

    a: str
    b: str
    metric: str
    lengths: str | tuple[int, ...] = "L"
    expect: str | None = None
    b_metric: str | None = None
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("a", "b"):
            _check_label(name, getattr(self, name))
        check_metric("metric", self.metric)
        if self.b_metric is not None:
            check_metric("b_metric", self.b_metric)
        if not isinstance(self.source, str):
            raise PosEncError(f"source must be a string, got {self.source!r:.80}")
        if self.expect not in (None, "better", "worse"):
            raise PosEncError(f"expect must be 'better', 'worse' or None, got {self.expect!r}")
        if not isinstance(self.lengths, (str, tuple, list)):
            raise PosEncError(
                f"lengths must be one of {', '.join(LENGTHS)} or multiples of L, "
                f"got {self.lengths!r:.80}"
            )
        if isinstance(self.lengths, str):
            if self.lengths not in LENGTHS:
                raise PosEncError(
                    f"lengths must be one of {', '.join(LENGTHS)} or multiples of L, "
                    f"got {self.lengths!r:.80}"
                )
        elif not self.lengths or not all(
            isinstance(m, int) and not isinstance(m, bool) and m >= 1 for m in self.lengths
        ):
            raise PosEncError(
                f"lengths must be multiples of L (integers >= 1), got {self.lengths!r:.80}"
            )
        if self.a == self.b and (self.b_metric or self.metric) == self.metric:
            raise PosEncError(f"a and b are the same cell ({self.a} on {self.metric})")

    def at(self, train_len: int, eval_lens: Sequence[int]) -> list[int]:
        """The eval lengths this comparison is made at, of ``eval_lens``."""
        if self.lengths == "L":
            return [n for n in eval_lens if n == train_len]
        if self.lengths == "past":
            return [n for n in eval_lens if n > train_len]
        if self.lengths == "longest":
            return [max(eval_lens)] if eval_lens else []
        if self.lengths == "all":
            return list(eval_lens)
        return [n for n in eval_lens if n in {m * train_len for m in self.lengths}]


def check_comparisons(comparisons: Any, name: str = "comparisons") -> tuple[Comparison, ...]:
    """``comparisons`` as a tuple, refused unless a sequence of :class:`Comparison`."""
    if isinstance(comparisons, (str, bytes)) or not isinstance(comparisons, Sequence):
        raise PosEncError(f"{name} must be a sequence of Comparison, got {comparisons!r:.80}")
    for c in comparisons:
        if not isinstance(c, Comparison):
            raise PosEncError(f"{name} must hold Comparison objects, got {c!r:.80}")
    return tuple(comparisons)


def default_comparisons(labels: Sequence[str], metric: str) -> tuple[Comparison, ...]:
    """What a study without a paper compares: each label against the first, at every
    length, on the task's ``metric`` (``ppl`` for ``lm``, ``error`` otherwise).

    Examples:
        >>> [(c.a, c.b) for c in default_comparisons(["rope", "alibi", "t5"], "ppl")]
        [('alibi', 'rope'), ('t5', 'rope')]
    """
    if not labels:
        return ()
    first = labels[0]
    return tuple(Comparison(label, first, metric, "all") for label in labels[1:])


def main_metric(task_metric: str, task: str) -> str:
    """The comparison metric of a task whose results carry ``task_metric``: ``ppl``,
    ``read_error`` (flip-flop) or ``error``."""
    if task_metric == "ppl":
        return "ppl"
    return "read_error" if task == "flipflop" else "error"


def _value(
    run: Mapping[str, Any], metric: str, length: int, train_len: int, own_split: str
) -> float | None:
    cell = run.get("eval", {}).get(str(length), {})
    base = run.get("eval", {}).get(str(train_len), {})
    name, _, split = metric.partition("@")
    if split and split != own_split:  # another split than the task's own: under "splits"
        cell = cell.get("splits", {}).get(split, {})
    if "error" in cell:
        return None
    value = METRICS[name][1](cell, base)
    if value is None or not math.isfinite(value) or abs(value) > _LARGEST:
        return None  # a cell without the number, or none a mean of seeds can hold
    return float(value)


_LARGEST = 1e100  # larger values cannot be averaged and squared without overflow


def _paired(
    runs: Sequence[Mapping[str, Any]],
    comparison: Comparison,
    length: int,
    train_len: int,
    own_split: str,
) -> tuple[list[int], list[float], list[float]]:
    by_seed: dict[str, dict[int, Mapping[str, Any]]] = {}
    for run in runs:
        by_seed.setdefault(run["encoding"], {})[int(run["seed"])] = run
    a_runs, b_runs = by_seed.get(comparison.a, {}), by_seed.get(comparison.b, {})
    seeds, a_values, b_values = [], [], []
    for seed in sorted(set(a_runs) & set(b_runs)):
        a = _value(a_runs[seed], comparison.metric, length, train_len, own_split)
        b_metric = comparison.b_metric or comparison.metric
        b = _value(b_runs[seed], b_metric, length, train_len, own_split)
        if a is not None and b is not None:
            seeds.append(seed)
            a_values.append(a)
            b_values.append(b)
    return seeds, a_values, b_values


def compare(results: Mapping[str, Any], comparisons: Sequence[Comparison]) -> list[dict[str, Any]]:
    """Each of ``comparisons`` at each of its lengths, measured on ``results`` (a
    ``run_study`` record: ``runs``, ``train_len``, ``eval_lens``): one record each, with
    the seeds, both sides' values, the differences, their mean, the 95 % interval and the
    verdict. A comparison whose labels are not in the study, or whose cells no seed has
    (a learned table past ``L``), is left out; :func:`verdict` names the paper's ones.

    Examples:
        >>> runs = [{"encoding": e, "seed": s, "eval": {"64": {"ppl": p}}}
        ...         for e, ps in (("rope", (6.0, 6.2, 6.1)), ("none", (7.0, 7.1, 7.3)))
        ...         for s, p in enumerate(ps)]
        >>> row = compare({"runs": runs, "train_len": 64, "eval_lens": [64]},
        ...               [Comparison("rope", "none", "ppl")])[0]
        >>> [round(d, 6) for d in row["differences"]], row["verdict"]
        ([-1.0, -0.9, -1.2], 'better')
    """
    check_record(results, full=False)
    comparisons = check_comparisons(comparisons)
    train_len, eval_lens = int(results["train_len"]), [int(n) for n in results["eval_lens"]]
    runs = results["runs"]
    settings = results.get("settings", {})
    options = settings.get("task_options", {}) if isinstance(settings, Mapping) else {}
    own_split = str(options.get("eval_split") or "sparse")  # flip-flop's main split
    out: list[dict[str, Any]] = []
    for comparison in comparisons:
        for length in comparison.at(train_len, eval_lens):
            seeds, a_values, b_values = _paired(runs, comparison, length, train_len, own_split)
            if not seeds:
                continue
            differences = [a - b for a, b in zip(a_values, b_values)]
            mean, interval, verdict_ = paired_verdict(differences)
            row: dict[str, Any] = {
                "a": comparison.a,
                "b": comparison.b,
                "metric": comparison.metric,
                "b_metric": comparison.b_metric or comparison.metric,
                "length": length,
                "times_L": length / train_len,
                "expect": comparison.expect,
                "source": comparison.source,
                "seeds": seeds,
                "a_values": a_values,
                "b_values": b_values,
                "differences": differences,
                "mean": mean,
                "interval": interval,
                "verdict": verdict_,
            }
            out.append(row)
    return out


def _check_names(names: Any) -> dict[str, str]:
    if names is None:
        return dict(NAMES)
    if not isinstance(names, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in names.items()
    ):
        raise PosEncError(f"names must map run labels to names (strings), got {names!r:.80}")
    return {**NAMES, **names}


def _times(row: Mapping[str, Any]) -> str:
    m = row["times_L"]
    return "L" if m == 1 else f"{m:g}L"


def _side(label: str, metric: str, other: str, names: Mapping[str, str]) -> str:
    name = names.get(label, label)
    if metric != other and "@" in metric:
        name += f" ({metric.partition('@')[2]} split)"
    return name


def _fmt(x: float) -> str:
    return f"{x:+.3g}"


def describe(row: Mapping[str, Any], names: Mapping[str, str] | None = None) -> str:
    """One comparison in words, its verdict first: ``"0.75-RoPE level with RoPE at L
    (ppl -0.05, 95% interval -0.12 to +0.03, 3 seeds)"``; a level pair is never ordered.

    Examples:
        >>> describe({"a": "cope", "b": "t5", "metric": "error", "b_metric": "error",
        ...           "times_L": 2.0, "seeds": [0, 1, 2], "mean": -37.6,
        ...           "interval": [-45.0, -30.2], "verdict": "better"})
        'CoPE below T5 at 2L (error % -37.6, 95% interval -45 to -30.2, 3 seeds)'
    """
    check_row(row, "row")
    names = _check_names(names)
    a = _side(row["a"], row["metric"], row["b_metric"], names)
    b = _side(row["b"], row["b_metric"], row["metric"], names)
    word = {"better": "below", "worse": "above", "level": "level with"}[row["verdict"]]
    what = METRICS[row["metric"].partition("@")[0]][0]
    n = len(row["seeds"])
    if row["interval"] is None:
        spread = f"{n} seed: no interval, not separated"
    else:
        lo, hi = row["interval"]
        spread = f"95% interval {_fmt(lo)} to {_fmt(hi)}, {n} seeds"
    return f"{a} {word} {b} at {_times(row)} ({what} {_fmt(row['mean'])}, {spread})"


def _pair(c: Comparison, names: Mapping[str, str]) -> str:
    b_metric = c.b_metric or c.metric
    a = _side(c.a, c.metric, b_metric, names)
    return f"{a} against {_side(c.b, b_metric, c.metric, names)}"


_HEADS = {
    "reproduced": "Reproduced",
    "not reproduced": "Not reproduced",
    "partly": "Reproduced in part",
    "level at this scale": "Level at this scale",
}


def verdict(
    rows: Sequence[Mapping[str, Any]],
    comparisons: Sequence[Comparison],
    names: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """What a study's comparisons say about its paper: ``{"status", "sentence", "also",
    "holds", "level", "opposite", "untested"}``.

    ``status``: ``"reproduced"`` (every comparison the paper makes, at every length, has
    its direction and none is level), ``"not reproduced"`` (one has the opposite direction
    beyond the spread), ``"partly"`` (some hold, the rest are level or could not be made
    here), ``"level at this scale"`` (none is separated), ``"not tested"`` (none could be
    made: the study lacks the encodings), ``"no claim"`` (the study compares without a
    paper). ``sentence`` is written from the verdicts alone: a level
    pair is called level, never ordered; ``also``, the comparisons posenc reads beside the
    paper's, in words.

    Examples:
        >>> rows = [{"a": "prope-0.75", "b": "rope", "metric": "ppl", "b_metric": "ppl",
        ...          "times_L": 1.0, "expect": "better", "seeds": [0, 1, 2], "mean": -0.01,
        ...          "interval": [-0.09, 0.07], "verdict": "level"}]
        >>> v = verdict(rows, [Comparison("prope-0.75", "rope", "ppl", expect="better")])
        >>> v["status"], v["sentence"][:57]
        ('level at this scale', 'Level at this scale: 0.75-RoPE level with RoPE at L (perp')
    """
    rows = check_rows(rows)
    comparisons = check_comparisons(comparisons)
    names = _check_names(names)
    claimed = [c for c in comparisons if c.expect is not None]
    paper = [r for r in rows if r["expect"] is not None]
    made = {(r["a"], r["b"], r["metric"], r["b_metric"]) for r in paper}
    untested = [
        _pair(c, names) for c in claimed if (c.a, c.b, c.metric, c.b_metric or c.metric) not in made
    ]
    holds = [r for r in paper if r["verdict"] == r["expect"]]
    level = [r for r in paper if r["verdict"] == "level"]
    opposite = [r for r in paper if r["verdict"] not in ("level", r["expect"])]
    if not claimed:
        status = "no claim"
    elif not paper:
        status = "not tested"
    elif opposite:
        status = "not reproduced"
    elif not holds:
        status = "level at this scale"
    elif level or untested:
        status = "partly"
    else:
        status = "reproduced"
    others = [r for r in rows if r["expect"] is None]
    also = "; ".join(describe(r, names) for r in others)
    if status == "no claim":
        sentence = (also[0].upper() + also[1:] + ".") if also else "Nothing was compared."
    elif status == "not tested":
        sentence = "Not tested: no comparison of the paper could be made here (" + (
            "; ".join(untested) + ")."
        )
    else:
        groups = [
            ("as the paper", holds),
            ("against the paper", opposite),
            ("level at this scale", level),
        ]
        said = {what: "; ".join(describe(r, names) for r in group) for what, group in groups}
        if status == "level at this scale":
            sentence = f"Level at this scale: {said['level at this scale']}"
        else:
            parts = [f"{what[0].upper()}{what[1:]}: {said[what]}" for what, g in groups if g]
            sentence = f"{_HEADS[status]}. " + ". ".join(parts)
        if untested:
            sentence += ". Not made here: " + "; ".join(untested)
        sentence += "."
    return {
        "status": status,
        "sentence": sentence,
        "also": also,
        "holds": len(holds),
        "level": len(level),
        "opposite": len(opposite),
        "untested": untested,
    }
