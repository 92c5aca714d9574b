"""Options shared by ``posenc plot``, ``posenc inspect`` and ``posenc report``."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Annotated, Any

import torch
import typer

from posenc._errors import PosEncError
from posenc.cli._checks import (
    check_bytes,
    check_out_dir,
    check_out_file,
    integer,
    text,
)
from posenc.cli._checks import option as typed_option
from posenc.cli.table import parse_positions

__all__ = [
    "MAX_POSITIONS",
    "Params",
    "analysis_bytes",
    "analysis_terms",
    "check_analysis_size",
    "check_out_dir",
    "check_out_file",
    "count_option",
    "encoding_config",
    "positions_arg",
    "positions_label",
]

PARAM_HELP = (
    "Constructor argument of the encoding as KEY=VALUE (repeatable), e.g. --param dim=128 "
    "--param base=500000; VALUE is read as JSON when it parses (numbers, true, [1, 2]), "
    "else as a string."
)

#: The ``--param KEY=VALUE`` option (repeatable) of ``posenc plot`` and ``posenc inspect``.
Params = Annotated[
    list[str] | None, typer.Option("--param", help=PARAM_HELP, callback=text("--param"))
]

#: The most positions (or distances) an analysis command takes.
MAX_POSITIONS = 2**20


def count_option(option: str, help: str, *, min: int) -> Any:
    """A typer option taking a count of positions or distances, ``min`` to
    :data:`MAX_POSITIONS`, checked when it is parsed."""
    return typed_option(help, integer(option, min=min, max=MAX_POSITIONS))


#: --param keys that size a tensor the encoding builds (rows, channels, heads, buckets).
_SIZES = (
    "dim",
    "head_dim",
    "num_heads",
    "max_len",
    "max_distance",
    "num_buckets",
    "max_position_embeddings",
    "original_max_position_embeddings",
    "npos_max",
    "num_prefix_tokens",
    "mlp_width",
)


#: The deepest nesting of lists and objects a ``--param`` value may have.
_MAX_DEPTH = 16


def _check_value(item: str, value: Any) -> None:
    """JSON numbers must be finite (``NaN``, ``Infinity``, ``1e400``) and fit in int64;
    lists and objects nest at most :data:`_MAX_DEPTH` deep."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise PosEncError(f"--param values must be finite numbers, got {item!r}")
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 2**63:
            raise PosEncError(f"--param integers must fit in 64 bits, got {item!r}")
        if isinstance(v, (list, dict)):
            if depth >= _MAX_DEPTH:
                raise PosEncError(
                    f"--param values must nest lists and objects at most {_MAX_DEPTH} deep, "
                    f"got {item[:40]!r}..."
                )
            stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))


def encoding_config(name: str, params: Sequence[str] | None) -> dict[str, Any]:
    """``{"name": name, **params}`` from ``KEY=VALUE`` strings."""
    if not isinstance(name, str) or not name.strip():
        raise PosEncError(f"--encoding must name a registered encoding, got {name!r}")
    config: dict[str, Any] = {"name": name}
    for item in params or ():
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise PosEncError(f"--param must be KEY=VALUE with a Python name as KEY, got {item!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        except RecursionError:
            raise PosEncError(
                f"--param values must nest lists and objects at most {_MAX_DEPTH} deep, "
                f"got {item[:40]!r}..."
            ) from None
        except ValueError:  # an integer over sys.get_int_max_str_digits() digits
            raise PosEncError(
                f"--param integers must fit in 64 bits, got {item[:40]!r}..."
            ) from None
        _check_value(item, value)
        config[key] = value
    return config


def _size(config: dict[str, Any], keys: Sequence[str], default: int) -> tuple[int, str | None]:
    """The first of ``keys`` that ``config`` sets to a positive integer, with its
    ``--param KEY=VALUE`` (None: ``default``, which no option set)."""
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, f"--param {key}={value}"
    return default, None


def analysis_terms(
    config: dict[str, Any],
    positions: int,
    *,
    max_distance: int = 0,
    positions_from: str | None = None,
    distance_from: str | None = "--max-distance",
) -> list[tuple[int, list[str]]]:
    """What measuring or drawing ``config`` at ``positions`` positions (and distances up to
    ``max_distance``) allocates, generously, term by term: ``(bytes, the options that size
    it)``; tables ``[n, d]``, pairwise ``[heads, n, n]`` maps, the decay's ``[d, n, d]``
    basis and the encoding's own tables (``--param max_len=...``), in float64.
    ``positions_from`` names the option that gave the positions (None: ``--length N``),
    ``distance_from`` the one that gave the distances (None: the command has none)."""
    d, d_from = _size(config, ("dim", "head_dim"), 64)
    h, h_from = _size(config, ("num_heads",), 8)
    n, k = positions, max_distance
    n_from = f"--length {n}" if positions_from is None else positions_from
    w, w_from = _size(config, ("mlp_width",), 0)
    k_from = [] if distance_from is None else [f"{distance_from} {k}"]
    terms = [
        (8 * n * n * (2 + h), [n_from, *filter(None, [h_from])]),
        (8 * 64 * n * d, [n_from, *filter(None, [d_from])]),
        (8 * 2 * d * d * (k + 1), [*filter(None, [d_from]), *k_from]),
        (
            8 * n * n * w,
            [n_from, *filter(None, [w_from])],
        ),  # FIRE: its MLP on [n, n] (measured: 2 B each)
    ]
    for key in _SIZES:
        if key not in ("dim", "head_dim", "num_heads", "mlp_width"):
            rows, rows_from = _size(config, (key,), 0)
            if rows_from is not None:
                terms.append((8 * rows * max(d, h), [rows_from]))
    return terms


def analysis_bytes(config: dict[str, Any], positions: int, *, max_distance: int = 0) -> int:
    """The sum of :func:`analysis_terms`: a generous estimate of what measuring or drawing
    ``config`` at ``positions`` positions (and distances up to ``max_distance``) allocates."""
    return sum(b for b, _ in analysis_terms(config, positions, max_distance=max_distance))


def check_analysis_size(
    what: str,
    config: dict[str, Any],
    positions: int,
    *,
    max_distance: int = 0,
    positions_from: str | None = None,
    distance_from: str | None = "--max-distance",
) -> None:
    """Refuse ``what`` (``"inspect"``) when :func:`analysis_bytes` is over the command's
    limit, naming the options of its largest term (``--param num_heads=100000 with
    --length 512: inspect needs about ...``)."""
    terms = analysis_terms(
        _accepted(config),
        positions,
        max_distance=max_distance,
        positions_from=positions_from,
        distance_from=distance_from,
    )
    _, largest = max(terms, key=lambda t: t[0])
    causes = sorted(largest, key=lambda c: not c.startswith("--param"))  # --param first
    check_bytes(
        f"{' with '.join(causes)}: {what}" if causes else what,
        sum(b for b, _ in terms),
        hint=f"ask for a smaller {' or '.join(_option_name(c) for c in causes)}",
    )


def _accepted(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without the keys its class does not take (the build refuses those, by
    name, before it allocates anything); all of it for a name the registry lacks."""
    from posenc import registry

    try:
        accepted, _ = registry.parameters(registry.class_of(config))
    except PosEncError:
        return config
    return {k: v for k, v in config.items() if k == "name" or k in accepted}


def _option_name(cause: str) -> str:
    """``--param num_heads=100000`` -> ``--param num_heads``; ``--length 512`` -> ``--length``."""
    return cause.split("=")[0] if cause.startswith("--param") else cause.split(" ")[0]


def positions_label(spec: str | None, count: int) -> str:
    """How a message names the positions of ``--positions spec`` (None: the default)."""
    if spec is None:
        return f"--positions (not given: {count} positions)"
    return f"--positions {spec!r} ({count} positions)"


def positions_arg(spec: str | None) -> torch.Tensor | None:
    """A position tensor from the ``--positions`` syntax of ``posenc table`` (None: default)."""
    if spec is None:
        return None
    values = parse_positions(spec, name="--positions")
    dtype = torch.float64 if any(isinstance(v, float) for v in values) else torch.long
    return torch.tensor(values, dtype=dtype)
