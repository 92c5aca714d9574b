"""What the adapters share: the dtype names they accept, the refusal of a scaling or of an
argument they cannot take, and the import of a torch library."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc._errors import PosEncError, check_choice
from posenc.conformance._api import Unsupported

__all__ = [
    "DTYPES",
    "check_dtype",
    "check_layout",
    "factor_options",
    "missing",
    "no_extra",
    "scaling_kind",
    "torch_library",
]

#: The dtypes the framework adapters run in (float64 is posenc's own).
DTYPES = ("float32", "bfloat16", "float16")


def check_dtype(dtype: str) -> str:
    """``dtype`` when it is one of :data:`DTYPES`; else :class:`PosEncError` naming it."""
    return check_choice("dtype", dtype, DTYPES)


def check_layout(layout: str | None, offered: tuple[str, ...], who: str) -> str | None:
    """``layout`` when it is None (no layout claimed) or one of the layouts ``who`` offers;
    else :class:`PosEncError` naming it."""
    if layout is None:
        return None
    if type(layout) is not str or layout not in offered:
        listed = ", ".join(map(repr, offered))
        raise PosEncError(
            f"layout must be None (none claimed) or {listed} (what {who} offers), got {layout!r}"
        )
    return layout


def missing(what: str, package: str, error: ImportError) -> PosEncError:
    """The one-line error for a framework that is not installed."""
    return PosEncError(
        f"the {what} adapter needs {package}: pip install {package} ({error.__class__.__name__}: "
        f"{error})"
    )


def scaling_kind(scaling: Mapping[str, Any] | None, offered: tuple[str, ...], who: str) -> str:
    """The scaling's ``type`` (``"default"`` for None) when ``who`` offers it; else
    :class:`Unsupported` naming it."""
    kind = "default" if not scaling else str(scaling.get("type", "default"))
    if kind not in offered:
        raise Unsupported(f"{who} has no {kind!r} scaling (it offers {', '.join(offered)})")
    return kind


def factor_options(
    scaling: Mapping[str, Any] | None, options: Mapping[str, str], who: str
) -> dict[str, float]:
    """The keyword argument ``who`` takes for the scaling: ``options`` maps each scaling type
    ``who`` offers besides ``"default"`` to the name of its keyword, which gets the scaling's
    ``factor`` (``{}`` for the default); others raise :class:`Unsupported` naming them."""
    kind = scaling_kind(scaling, ("default", *options), who)
    if kind == "default":
        return {}
    return {options[kind]: float(scaling["factor"])}  # type: ignore[index]


def no_extra(extra: Mapping[str, Any], who: str) -> None:
    """:class:`Unsupported` naming the case's arguments ``who`` cannot take, if any."""
    if extra:
        raise Unsupported(f"{who} takes no {', '.join(sorted(extra))}")


def torch_library(who: str, module: str) -> tuple[Any, Any, str]:
    """``(torch, the library's module, source)``: torch and ``module`` imported, the source
    naming the distribution ``who``'s version and torch's; :class:`PosEncError` naming what
    to install when either is missing."""
    import importlib
    from importlib.metadata import version

    try:
        import torch

        library = importlib.import_module(module)
    except ImportError as e:
        raise missing(who, who, e) from None
    return torch, library, f"{who} {version(who)} (torch {torch.__version__})"
