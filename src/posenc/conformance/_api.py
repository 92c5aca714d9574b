"""The conformance check's vocabulary: an implementation under test (:class:`Adapter`), the
refusal it may give (:class:`Unsupported`), and what the check says (:class:`CaseResult`,
:class:`Report`). NumPy and the standard library only.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from posenc._errors import PosEncError
from posenc.conformance._case import DTYPES
from posenc.conformance.cases import conventions

__all__ = [
    "DTYPES",
    "FAMILIES",
    "OPERATIONS",
    "STATUSES",
    "Adapter",
    "CaseResult",
    "Convention",
    "Report",
    "Unsupported",
]

#: What an adapter computes, and so how it is called (see :class:`Adapter`).
OPERATIONS = ("table", "frequencies", "rotate", "bias")
#: The families of cases, per operation (:func:`posenc.conformance.build_cases` builds them).
FAMILIES: Mapping[str, tuple[str, ...]] = types.MappingProxyType(
    {
        "table": ("sinusoidal", "sinusoidal_nd", "index", "learned", "xpos"),
        "frequencies": ("rope", "axial_rope"),
        "rotate": ("rope", "mrope", "xpos"),
        "bias": (
            "alibi",
            "t5",
            "shaw",
            "shaw_values",
            "fire",
            "kerple",
            "cope",
            "fox",
            "self_extend",
            "string",
        ),
    }
)
STATUSES = ("pass", "fail", "skip")


class Unsupported(Exception):
    """Raised by an adapter's function for a case it cannot express (a scaling its
    framework lacks, a layout it does not offer): the case is skipped, with the reason."""


def _json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool, int, float))


class Convention(Mapping[str, Any]):
    """An adapter's claimed conventions: a read-only mapping, hashable (so an
    :class:`Adapter` is), equal to any mapping with the same items."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] = types.MappingProxyType({})) -> None:
        self._items = dict(items)

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._items.items(), key=lambda kv: kv[0])))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and self._items == dict(other)

    def __repr__(self) -> str:
        return repr(self._items)


_KINDS = {str: "a string", bool: "True or False", int: "an integer", float: "a number"}


def _check_claims(where: str, operation: str, family: str, convention: Mapping[str, Any]) -> None:
    """Refuse a claimed convention key that no case of ``operation`` / ``family`` has (a
    typo filters nothing and would pass silently), or a value of another type than the
    cases' (``"causal": "yes"``). The keys and types are read off the catalogue."""
    if not convention:
        return
    known = conventions().get((operation, family), {})
    for key, value in convention.items():
        if key not in known:
            have = ", ".join(map(repr, sorted(known))) or "none"
            raise PosEncError(
                f"{where} convention key must be one the {operation}/{family} cases have "
                f"({have}), got {key!r}"
            )
        allowed = known[key]
        if type(value) not in allowed:
            kinds = " or ".join(
                sorted("None" if t is type(None) else _KINDS.get(t, t.__name__) for t in allowed)
            )
            raise PosEncError(
                f"{where} convention[{key!r}] must be {kinds} (as the {operation}/{family} cases "
                f"have it), got {value!r}"
            )


@dataclasses.dataclass(frozen=True)
class Adapter:
    """An implementation under test: a function computing one ``operation`` of one case
    ``family``, with the conventions it claims.

    Args:
        name: what the report calls it (``"keras-hub SinePositionEncoding"``).
        operation: ``"table"``, ``"frequencies"``, ``"rotate"`` or ``"bias"``.
        family: the case family (``"sinusoidal"``, ``"rope"``, ``"alibi"``, ``"t5"``, ...;
            :data:`FAMILIES` lists them per operation).
        fn: the function; arrays in, arrays out (anything ``np.asarray`` takes):

            - table: ``fn(positions int64 [n], dim, **parameters) -> [n, dim]``
              (sinusoidal: ``parameters = {"base": ...}``; ``sinusoidal_nd``: positions
              ``[n, axes]``);
            - frequencies: ``fn(dim, *, base, scaling, seq_len) -> inv_freq [dim // 2]``
              or ``(inv_freq, attention_scale)``;
            - rotate: ``fn(q [seq, heads, dim], k [seq, heads, dim], positions int64 [seq],
              *, base, scaling, rotary_dim) -> (q_rot, k_rot)``, YaRN / LongRoPE attention
              scale multiplying cos and sin (M-RoPE: positions ``[seq, 3]`` and
              ``sections``; xPos: ``xpos_scale_base``);
            - bias: ``fn(query_positions int64 [m], key_positions int64 [n], *, heads,
              **parameters) -> [heads, m, n]``.

            It raises :class:`Unsupported` for a case it cannot express.
        convention: the conventions it claims (``{"layout": "half"}``): a case runs only
            where every claimed key equals the case's value; keys it does not claim do not
            filter. Each key must be one the family's cases have (``layout``, ``order``,
            ``normalize``, ``mode``, ``align_corners``, ``scaling``, ``section_layout``,
            ``partial``, ``causal``: :func:`posenc.conformance.cases.conventions` lists them
            per family), its value of the type they have; stored as a hashable
            :class:`Convention`, so an adapter can be hashed.
        dtype: what it computes in (``"float64"``, ``"float32"``, ``"bfloat16"``,
            ``"float16"``): picks the tolerance of each case.
        source: where the implementation came from (``"keras-hub 0.32.0 (JAX backend)"``).
    """

    name: str
    operation: str
    family: str
    fn: Callable[..., Any]
    convention: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dtype: str = "float32"
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise PosEncError(f"Adapter name must be a non-empty string, got {self.name!r}")
        where = f"Adapter {self.name!r}"
        if self.operation not in OPERATIONS:
            raise PosEncError(
                f"{where} operation must be one of {', '.join(map(repr, OPERATIONS))}, "
                f"got {self.operation!r}"
            )
        families = FAMILIES[self.operation]
        if self.family not in families:
            raise PosEncError(
                f"{where} family must be one of {', '.join(map(repr, families))} for operation "
                f"{self.operation!r}, got {self.family!r}"
            )
        if not callable(self.fn):
            raise PosEncError(f"{where} fn must be callable, got {type(self.fn).__name__}")
        if not isinstance(self.convention, Mapping):
            raise PosEncError(
                f"{where} convention must be a mapping of str to a JSON scalar, "
                f"got {type(self.convention).__name__}"
            )
        for key, value in self.convention.items():
            if not isinstance(key, str) or not _json_scalar(value):
                raise PosEncError(
                    f"{where} convention must map str to str, bool, int, float or None, "
                    f"got {key!r}: {value!r}"
                )
        _check_claims(where, self.operation, self.family, self.convention)
        if self.dtype not in DTYPES:
            raise PosEncError(
                f"{where} dtype must be one of {', '.join(map(repr, DTYPES))}, got {self.dtype!r}"
            )
        if not isinstance(self.source, str):
            raise PosEncError(f"{where} source must be a string, got {self.source!r}")
        object.__setattr__(self, "convention", Convention(self.convention))


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """One case run through one adapter.

    ``status``: ``"pass"``, ``"fail"`` or ``"skip"``. ``max_error``: the error at the worst
    element (the largest error over its tolerance), ``tolerance``: the tolerance there;
    ``where``: that element (``"position 1000000, channel 1"``); ``deviation``: the named
    deviation that explains a failure, in words, when one does; ``detail``: the rest
    (the reason of a skip, the output's refusal).
    """

    adapter: str
    case: str
    status: str
    max_error: float = 0.0
    tolerance: float = 0.0
    where: str = ""
    deviation: str | None = None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        """A plain dict (``max_error`` and ``tolerance`` as floats, ``None`` when not finite)."""
        out = dataclasses.asdict(self)
        for key in ("max_error", "tolerance"):
            out[key] = out[key] if math.isfinite(out[key]) else None
        return out


def _fmt(x: float) -> str:
    return "-" if x == 0 else f"{x:.2e}"


@dataclasses.dataclass(frozen=True)
class Report:
    """The results of :func:`posenc.conformance.check`, one per (adapter, case).

    ``ok``: no case failed. ``str(report)``: a plain-text table, one row a result, then
    the deviations in words.
    """

    results: tuple[CaseResult, ...]

    @property
    def ok(self) -> bool:
        """True when no case failed (passes and skips only)."""
        return all(r.status != "fail" for r in self.results)

    @property
    def failures(self) -> tuple[CaseResult, ...]:
        """The failed results."""
        return tuple(r for r in self.results if r.status == "fail")

    def __iter__(self) -> Iterator[CaseResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def counts(self) -> dict[str, int]:
        """``{"pass": n, "fail": n, "skip": n}``."""
        return {s: sum(r.status == s for r in self.results) for s in STATUSES}

    def to_json(self) -> dict[str, Any]:
        """``{"ok": ..., "counts": ..., "results": [...]}``, plain JSON values."""
        return {
            "ok": self.ok,
            "counts": self.counts(),
            "results": [r.to_json() for r in self.results],
        }

    def __str__(self) -> str:
        header = ("adapter", "case", "status", "max error", "tolerance", "where")
        rows = [
            (r.adapter, r.case, r.status, _fmt(r.max_error), _fmt(r.tolerance), r.where)
            for r in self.results
        ]
        widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(header)]

        def line(cells: tuple[str, ...]) -> str:
            return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

        out = [line(header), line(tuple("-" * w for w in widths))]
        out += [line(row) for row in rows]
        notes = [r for r in self.results if r.status != "pass" and (r.deviation or r.detail)]
        if notes:
            out.append("")
            for r in notes:
                words = r.deviation or r.detail
                if r.deviation and r.detail:
                    words = f"{r.deviation} ({r.detail})"
                out.append(f"{r.adapter} / {r.case} [{r.status}]: {words}")
        c = self.counts()
        out.append("")
        out.append(
            f"{c['pass']} passed, {c['fail']} failed, {c['skip']} skipped"
            + ("" if self.ok else " -- MISMATCH")
        )
        return "\n".join(out)
