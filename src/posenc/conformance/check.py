"""``check``: run adapters on golden cases, compare every element within the tolerance of
the adapter's dtype, and say where and how an output departs from the reference."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc._errors import PosEncError
from posenc.conformance._api import Adapter, CaseResult, Report, Unsupported
from posenc.conformance.cases import OUTPUTS, Case
from posenc.conformance.vectors import Vectors, as_vectors

__all__ = ["OutputError", "check", "compare", "locate", "outputs_of", "run_case"]


class OutputError(Exception):
    """An adapter's output that cannot be compared (wrong type, shape, dtype, not finite)."""


def _adapters(value: Any) -> list[Adapter]:
    if isinstance(value, Adapter):
        return [value]
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and value:
        items = list(value)
        for i, item in enumerate(items):
            if not isinstance(item, Adapter):
                raise PosEncError(
                    f"adapters[{i}] must be a posenc.conformance.Adapter, got {type(item).__name__}"
                )
        names = [a.name for a in items]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise PosEncError(f"adapters must have distinct names, got {name!r} twice")
        return items
    raise PosEncError(
        f"adapter must be an Adapter or a non-empty sequence of them, got {type(value).__name__}"
    )


def _vectors(value: Any) -> Vectors:
    return as_vectors(value, "vectors")


def applies(adapter: Adapter, case: Case) -> bool:
    """Whether ``case`` is one ``adapter`` runs: same operation and family, and every
    convention the adapter claims equal to the case's where the case has that key."""
    if case.operation != adapter.operation or case.family != adapter.family:
        return False
    return all(
        case.convention[k] == v for k, v in adapter.convention.items() if k in case.convention
    )


def _array(value: Any, what: str) -> np.ndarray:
    """``value`` as a float64 array, refused unless it is real numbers."""
    try:
        array = np.asarray(value)
    except Exception as e:  # a framework's tensor NumPy cannot read (torch bfloat16)
        message = " ".join(str(e).split())[:120]
        raise OutputError(
            f"{what} must be an array NumPy can read, got {type(value).__name__} ({message})"
        ) from None
    if array.dtype.kind in "fiu":
        return array.astype(np.float64)
    if array.dtype.kind == "V" and array.dtype.names is None:  # ml_dtypes' bfloat16
        try:
            return array.astype(np.float64)
        except (TypeError, ValueError):
            pass
    raise OutputError(f"{what} must be real numbers, got dtype {array.dtype}")


def outputs_of(case: Case, result: Any) -> tuple[dict[str, np.ndarray], str]:
    """The adapter's ``result`` as ``{output key: float64 array}`` checked against the case's
    shapes, and a note (``""`` or why the attention scale is not compared).

    Raises:
        OutputError: the wrong number of outputs, a wrong type, shape or dtype, or a value
            not finite where the expected one is.
    """
    keys = OUTPUTS[case.operation]
    note = ""
    if case.operation == "frequencies":
        if isinstance(result, tuple) and len(result) == 2:
            values = list(result)
        elif isinstance(result, (tuple, list)) and len(result) != case.expected["inv_freq"].size:
            raise OutputError(
                f"output must be inv_freq or (inv_freq, attention_scale), got {len(result)} values"
            )
        else:
            values = [result]
            note = "no attention scale returned: not compared"
    elif case.operation == "rotate":
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise OutputError(f"output must be (q_rot, k_rot), got {type(result).__name__}")
        values = list(result)
    else:
        values = [result]
    out: dict[str, np.ndarray] = {}
    for key, value in zip(keys, values):
        array = _array(value, key)
        want = case.expected[key].shape
        if array.shape != want:
            raise OutputError(f"{key} must have shape {list(want)}, got {list(array.shape)}")
        expected = case.expected[key]
        bad = ~np.isfinite(array) & ~(np.isinf(expected) & (array == expected))
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            raise OutputError(
                f"{key} must be finite, got {array[index]} at {locate(case, key, index)}"
            )
        out[key] = array
    return out, note


def locate(case: Case, key: str, index: tuple[int, ...]) -> str:
    """The element ``index`` of output ``key`` in words (``"position 257, channel 3"``)."""
    if case.operation == "table":
        p = case.inputs["positions"][index[0]]
        where = f"position {p.tolist() if p.ndim else int(p)}"
        return f"{where}, channel {index[1]}" if len(index) > 1 else where
    if case.operation == "frequencies":
        return "attention scale" if key == "attention_scale" else f"inv_freq[{index[0]}]"
    if case.operation == "rotate":
        p = case.inputs["positions"][index[0]]
        pos = p.tolist() if p.ndim else int(p)
        return f"{key}: position {pos}, head {index[1]}, channel {index[2]}"
    q = int(case.inputs["query_positions"][index[1]])
    if case.family == "shaw_values":
        return f"head {index[0]}, query {q}, channel {index[2]}"
    k = int(case.inputs["key_positions"][index[2]])
    first = {"self_extend": "query's", "string": "query's"}.get(case.family)
    head = f"{'key' if index[0] else 'query'}'s position" if first else f"head {index[0]}"
    return f"{head}, query {q}, key {k}"


def compare(
    case: Case, outputs: Mapping[str, np.ndarray], dtype: str
) -> tuple[bool, float, float, str, str]:
    """``(within, max_error, tolerance, key, where)``: whether every element is within its
    tolerance, and the error and tolerance at the element worst against its tolerance."""
    worst = (-1.0, 0.0, 0.0, "", "")
    within = True
    for key, got in outputs.items():
        expected = case.expected[key]
        tol = case.tolerance(key, dtype)
        same_inf = np.isinf(expected) & (got == expected)
        err = np.where(same_inf, 0.0, np.abs(got - np.where(np.isinf(expected), 0.0, expected)))
        err = np.where(np.isinf(expected) & ~same_inf, np.inf, err)
        over = err > tol
        within = within and not over.any()
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(
                tol > 0, err / np.where(tol > 0, tol, 1.0), np.where(err > 0, np.inf, 0.0)
            )
        flat = int(np.argmax(ratio)) if ratio.size else 0
        index = tuple(int(i) for i in np.unravel_index(flat, ratio.shape)) if ratio.ndim else ()
        if ratio.size and float(ratio.flat[flat]) > worst[0]:
            worst = (
                float(ratio.flat[flat]),
                float(err.flat[flat]),
                float(tol.flat[flat]),
                key,
                locate(case, key, index),
            )
    return within, worst[1], worst[2], worst[3], worst[4]


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(str(text).split())[:limit]


def run_case(adapter: Adapter, case: Case) -> CaseResult:
    """One case through one adapter: ``skip`` when it raises :class:`Unsupported`, ``fail``
    when it raises anything else, returns what cannot be compared, or departs from the
    expected outputs beyond the tolerance (with the deviation named when one explains
    it), else ``pass``."""
    args = tuple(np.array(a) if isinstance(a, np.ndarray) else a for a in case.args())
    kwargs = {
        k: np.array(v) if isinstance(v, np.ndarray) else _copy(v) for k, v in case.kwargs().items()
    }
    try:
        result = adapter.fn(*args, **kwargs)
    except Unsupported as e:
        return CaseResult(
            adapter.name, case.name, "skip", detail=_one_line(str(e)) or "unsupported"
        )
    except Exception as e:  # the implementation under test failed: a result, not a crash
        return CaseResult(
            adapter.name,
            case.name,
            "fail",
            detail=f"raised {type(e).__name__}: {_one_line(str(e))}",
        )
    try:
        outputs, note = outputs_of(case, result)
    except OutputError as e:
        from posenc.conformance.diagnose import shape_words

        return CaseResult(
            adapter.name,
            case.name,
            "fail",
            deviation=shape_words(case, result, adapter.dtype),
            detail=f"adapter {adapter.name!r} case {case.name!r} field {e}",
        )
    within, error, tol, _, where = compare(case, outputs, adapter.dtype)
    if within:
        where = where if error > 0 else ""
        return CaseResult(adapter.name, case.name, "pass", error, tol, where, None, note)
    from posenc.conformance.diagnose import diagnose

    deviation, detail = diagnose(case, outputs, adapter.dtype)
    detail = "; ".join(part for part in (detail, note) if part)
    return CaseResult(adapter.name, case.name, "fail", error, tol, where, deviation, detail)


def _copy(value: Any) -> Any:
    """A fresh copy of a JSON parameter (an adapter may change what it is given)."""
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def check(
    adapter_or_adapters: Adapter | Sequence[Adapter],
    vectors: Vectors | str | Path | None = None,
    *,
    cases: str | Sequence[str] | None = None,
) -> Report:
    """Run each adapter on every case of its operation and family whose convention it does
    not contradict, and compare whole arrays within the tolerance of its dtype.

    Args:
        adapter_or_adapters: an :class:`Adapter` or a sequence of them.
        vectors: the cases: None builds them in memory from :mod:`posenc.reference`; a
            directory loads them (:func:`~posenc.conformance.load_vectors`).
        cases: ``fnmatch`` globs on case names (``"*@far"``, ``"rope.rotate.*"``).

    Returns: a :class:`Report`; ``report.ok`` is False when a case failed. An adapter that
    no case applies to gets one ``skip`` row saying so.

    Raises:
        PosEncError: not an adapter, unreadable vectors, or ``cases`` matching nothing.
    """
    adapters = _adapters(adapter_or_adapters)
    picked = _vectors(vectors).select(cases)
    results: list[CaseResult] = []
    for adapter in adapters:
        mine = [c for c in picked if applies(adapter, c)]
        if not mine:
            claimed = dict(adapter.convention)
            results.append(
                CaseResult(
                    adapter.name,
                    "-",
                    "skip",
                    detail=f"no {adapter.operation}/{adapter.family} case"
                    + (f" with convention {claimed}" if claimed else "")
                    + " among the selected cases",
                )
            )
        results.extend(run_case(adapter, c) for c in mine)
    return Report(tuple(results))
