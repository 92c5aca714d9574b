"""``posenc table``: print the table of an additive encoding at chosen positions.

    posenc table sinusoidal --dim 4 --positions 0:6
    posenc table sinusoidal --dim 8 --layout half --positions 0,10,100,1000 --format csv
    posenc table sinusoidal --dim 8 --layout flax --positions 0:4
    posenc table index --dim 2 --positions 0:4 --normalize length --format json

Positions are ``a:b`` (``a`` to ``b`` exclusive, step 1), ``a:b:step``, or a comma list
of numbers and ranges (``0:4,10,100.5``); floats and negatives allowed. Values are
computed in float64 (the library's float64 path) and printed rounded to ``--digits``.
"""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Annotated, Any

import torch
import typer
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from posenc import registry
from posenc._errors import PosEncError, check_choice, check_int
from posenc.cli._app import app, fail
from posenc.cli._checks import check_bytes, choice, integer, number, option, text
from posenc.index import index_table
from posenc.sinusoidal import LAYOUTS, ORDERS, sinusoidal_table

__all__ = [
    "MAX_ROWS",
    "MAX_TEXT_CELLS",
    "MAX_TEXT_COLUMNS",
    "TABLES",
    "parse_positions",
    "table",
    "table_bytes",
]

MAX_ROWS = 100_000
# What the text format lays out (rich measures every cell and column: about 0.2 ms a cell and
# 2 ms a column on a laptop core, so 200 000 columns took 290 s). csv and json stream.
MAX_TEXT_COLUMNS = 4096
MAX_TEXT_CELLS = 200_000
MAX_POSITION = 2**53  # positions are exact in float64 up to here
FORMATS = ("text", "csv", "json")
_SUBSCRIPTS = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
_ASCII = str.maketrans("₀₁₂₃₄₅₆₇₈₉ω·", "0123456789w*")  # for terminals that are not UTF-8


# A plain decimal: an optional '-', digits with an optional point, an optional exponent
# (of at most three digits: 1e999 is already far past 2**53). Fraction() would also take
# '1_000', '+3', '1/3' and exponents whose power takes minutes to compute.
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?")


def _number(text: str, spec: str, name: str = "positions") -> Fraction:
    text = text.strip()  # spaces around an entry are fine ("0, 10"); within one, not
    if not _DECIMAL.fullmatch(text):
        raise PosEncError(
            f"{name} must be plain numbers (such as 3, -2.5 or 1e3: no '_', '+' or '/') or "
            f"ranges 'a:b' / 'a:b:step' separated by commas, got {text!r} in {spec!r}"
        )
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError, OverflowError):  # over 4300 digits
        raise PosEncError(
            f"{name} must be at most 2**53 in magnitude, got a number of {len(text)} characters"
        ) from None
    if abs(value) > MAX_POSITION:
        raise PosEncError(
            f"{name} must be at most 2**53 = {MAX_POSITION} in magnitude (exact in float64), "
            f"got {text!r}"
        )
    if value != 0 and abs(value) < Fraction(1, 2**30):
        raise PosEncError(f"{name} must be 0 or at least 2**-30 in magnitude, got {text!r}")
    return value


def parse_positions(spec: str, *, name: str = "positions") -> list[int | float]:
    """Parse ``'a:b'``, ``'a:b:step'`` or a comma list of numbers and ranges.

    Ranges exclude their end, like Python's ``range``; ``':b'`` starts at 0. The values
    are exact decimals (``0:1:0.1`` has ten points, no float drift); they are returned
    as ints when all are integral, floats otherwise.

    Examples:
        >>> parse_positions("0:4")
        [0, 1, 2, 3]
        >>> parse_positions("0:1:0.25,10")
        [0.0, 0.25, 0.5, 0.75, 10.0]
        >>> parse_positions("5:-5:-4")
        [5, 1, -3]
    """
    if not isinstance(spec, str) or not spec.strip():
        raise PosEncError(f"{name} must be a range 'a:b', 'a:b:step' or a comma list, got {spec!r}")
    values: list[Fraction] = []
    for item in spec.split(","):
        parts = item.split(":")
        if len(parts) == 1:
            values.append(_number(parts[0], spec, name))
            continue
        if len(parts) > 3:
            raise PosEncError(f"{name} range must be 'a:b' or 'a:b:step', got {item.strip()!r}")
        if not parts[1].strip():
            raise PosEncError(f"{name} range must have an end, got {item.strip()!r}")
        start = _number(parts[0], spec, name) if parts[0].strip() else Fraction(0)
        stop = _number(parts[1], spec, name)
        step = (
            _number(parts[2], spec, name) if len(parts) == 3 and parts[2].strip() else Fraction(1)
        )
        if step == 0:
            raise PosEncError(f"{name} step must not be 0, got {item.strip()!r}")
        count = math.ceil((stop - start) / step)
        if count <= 0:
            raise PosEncError(
                f"{name} range {item.strip()!r} is empty (the end is excluded; "
                f"use a negative step to count down)"
            )
        if len(values) + count > MAX_ROWS:
            raise PosEncError(f"{name} must hold at most {MAX_ROWS} values, got {spec!r}")
        values.extend(start + k * step for k in range(count))
    if len(values) > MAX_ROWS:
        raise PosEncError(f"{name} must hold at most {MAX_ROWS} values, got {len(values)}")
    if all(v.denominator == 1 for v in values):
        return [int(v) for v in values]
    return [float(v) for v in values]


@dataclass
class _Table:
    """What a table builder returns: float64 values and how to label them."""

    values: torch.Tensor  # [n, dim] float64
    labels: list[str]  # machine column names (csv / json)
    headers: list[str]  # short column names shown under the channel index (text)
    options: dict[str, Any]  # the encoding's options, for the title and json
    caption: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # more json fields


def _sinusoidal(pos: torch.Tensor, dim: int, opts: dict[str, Any]) -> _Table:
    layout: Any = "interleaved" if opts["layout"] is None else opts["layout"]
    order: Any = "sin_cos" if opts["order"] is None else opts["order"]
    base = 10000.0 if opts["base"] is None else opts["base"]
    values = sinusoidal_table(pos, dim, base=base, layout=layout, order=order, dtype=torch.float64)
    first, second = ("sin", "cos") if order == "sin_cos" else ("cos", "sin")
    if layout == "flax":  # [first | second | a zero channel for odd dim], n = dim // 2 rates
        n_first = dim // 2
        freqs = [base ** -(i / (n_first - 1)) for i in range(n_first)]
        rule = "base^(-i/(dim/2 - 1))"
    else:
        n_first = (dim + 1) // 2
        freqs = [base ** (-2.0 * i / dim) for i in range(n_first)]
        rule = "base^(-2i/dim)"
    pairs: list[tuple[str, int | None]] = []  # (function, frequency index) of each channel
    for c in range(dim):
        if layout == "interleaved":
            pairs.append((first if c % 2 == 0 else second, c // 2))
        elif c < n_first:
            pairs.append((first, c))
        elif c < 2 * n_first or layout == "half":
            pairs.append((second, c - n_first))
        else:
            pairs.append(("zero", None))
    shown = ", ".join(
        f"ω{str(i).translate(_SUBSCRIPTS)} = {w:.4g}" for i, w in enumerate(freqs[:6])
    )
    more = ", ..." if len(freqs) > 6 else ""
    sub = [("" if i is None else str(i)) for _, i in pairs]
    return _Table(
        values=values,
        labels=[f"{fn}{i}" for (fn, _), i in zip(pairs, sub, strict=True)],
        headers=[
            fn if i == "" else f"{fn} ω{i.translate(_SUBSCRIPTS)}"
            for (fn, _), i in zip(pairs, sub, strict=True)
        ],
        options={"base": base, "layout": layout, "order": order},
        caption=f"angle = p · ω_i with ω_i = {rule}: {shown}{more}",
        extra={"frequencies": freqs},
    )


def _index(pos: torch.Tensor, dim: int, opts: dict[str, Any]) -> _Table:
    normalize, length = opts["normalize"], opts["length"]
    if normalize == "length" and length is None:
        length = max(len(pos), 1)  # L = the number of positions shown, as in the module
    values = index_table(pos, dim, normalize=normalize, length=length, dtype=torch.float64)
    label = "p/L" if normalize == "length" else "p"
    caption = f"L = {length}" if normalize == "length" else "every channel holds the position"
    return _Table(
        values=values,
        labels=[f"c{c}" for c in range(dim)],
        headers=[label] * dim,
        options={"normalize": normalize, "length": length},
        caption=caption,
    )


# name -> (builder, the options it takes). Encodings whose table is fixed by their
# options; learned tables are trained weights and rotary/bias encodings add nothing.
TABLES: dict[str, tuple[Callable[[torch.Tensor, int, dict[str, Any]], _Table], tuple[str, ...]]] = {
    "sinusoidal": (_sinusoidal, ("layout", "order", "base")),
    "index": (_index, ("normalize", "length")),
}


def _resolve_encoding(encoding: str) -> str:
    choices = ", ".join(map(repr, TABLES))
    key = encoding.lower()
    if key in TABLES:
        return key
    try:
        cls = registry.get(key)
    except PosEncError:
        raise PosEncError(f"encoding must be one of {choices}, got {encoding!r}") from None
    if cls.name == "learned":
        why = "its table is trained weights, not a formula"
    elif cls.kind == "none":
        why = "it adds nothing"
    elif cls.kind == "additive":
        why = "posenc table does not support it yet"
    else:
        why = f"it is a {cls.kind} encoding, which adds no table to the embeddings"
    raise PosEncError(f"{encoding!r} has no fixed table ({why}); tables exist for {choices}")


def _clean(v: float, digits: int | None) -> float:
    if digits is not None:
        v = round(v, digits)
    return v + 0.0  # turns -0.0 into 0.0


def _fmt_position(p: int | float) -> str:
    return str(p) if isinstance(p, int) else repr(p)


@dataclass(frozen=True)
class _Request:
    """A ``posenc table`` call, checked: what to build and how to print it."""

    name: str  # the TABLES entry
    dim: int
    positions: list[int | float]
    channels: list[int]  # the columns shown
    fmt: str  # one of FORMATS
    digits: int | None  # None: exact (csv, json) or 4 (text)
    options: dict[str, Any]  # the options the entry's builder takes


def _check_options(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """The options of ``name``'s builder; one given to another entry is refused."""
    takes = TABLES[name][1]
    for key, value in given.items():
        if value is not None and key not in takes:
            users = [n for n, (_, opts) in TABLES.items() if key in opts]
            raise PosEncError(f"--{key} applies to {', '.join(users)}, not {name!r}, got {value!r}")
    if given["length"] is not None and given["normalize"] != "length":
        raise PosEncError(f"--length applies only with --normalize length, got {given['length']}")
    return {k: v for k, v in given.items() if k in takes}


def _channels(channels: str | None, dim: int) -> list[int]:
    """``--channels`` as indices in ``[0, dim)`` (None: all of them)."""
    picked = range(dim) if channels is None else parse_positions(channels, name="--channels")
    if any(not isinstance(c, int) or not 0 <= c < dim for c in picked):
        raise PosEncError(f"channels must be integers in [0, dim) = [0, {dim}), got {channels!r}")
    return [int(c) for c in picked]


def _check_request(
    encoding: str,
    dim: int,
    positions: str,
    given: dict[str, Any],
    channels: str | None,
    fmt: str,
    digits: int | None,
) -> _Request:
    """Every option checked, in the order the command line's errors are reported."""
    name = _resolve_encoding(encoding)
    options = _check_options(name, given)
    fmt = check_choice("format", fmt, FORMATS)
    dim = check_int("dim", dim, min=1)
    if digits is not None:
        digits = check_int("digits", digits, min=0, max=17)
    pos = parse_positions(positions, name="--positions")
    shown = dim if channels is None else len(parse_positions(channels, name="--channels"))
    check_bytes(
        f"--dim {dim} with --positions {positions!r}: a table of {len(pos)} positions x "
        f"{dim} channels",
        table_bytes(len(pos), dim, shown, fmt),
        hint="ask for fewer --positions or a smaller --dim",
    )
    if fmt == "text":
        _check_text_size(len(pos), shown, "--dim" if channels is None else "--channels")
    return _Request(name, dim, pos, _channels(channels, dim), fmt, digits, options)


def _check_text_size(rows: int, columns: int, columns_option: str) -> None:
    """Refuse a text table too large to lay out in seconds (csv and json have no limit)."""
    if columns > MAX_TEXT_COLUMNS:
        raise PosEncError(
            f"{columns_option}: the text format shows at most {MAX_TEXT_COLUMNS} channels, got "
            f"{columns}; pick some with --channels, or use --format csv or json"
        )
    if rows * columns > MAX_TEXT_CELLS:
        raise PosEncError(
            f"--positions with {columns_option}: the text format shows at most "
            f"{MAX_TEXT_CELLS} values, got {rows} positions x {columns} channels; use "
            f"--format csv or json, or fewer --positions"
        )


def table_bytes(positions: int, dim: int, shown: int, fmt: str) -> int:
    """A generous estimate of what ``posenc table`` allocates for ``positions`` rows of
    ``dim`` channels, ``shown`` of them printed in ``fmt``: the float64 table, its Python
    floats and their text (48 bytes a value), each channel's labels and frequency (400
    bytes), and for text rich's columns (4 kB each) and cells (1.5 kB each; above what
    ``benchmarks/RESULTS.md`` records)."""
    nbytes = 48 * positions * dim + 400 * dim
    if fmt == "text":
        nbytes += 4000 * shown + 1500 * positions * shown
    return nbytes


def _build(request: _Request) -> _Table:
    builder = TABLES[request.name][0]
    pos = request.positions
    dtype = torch.float64 if any(isinstance(p, float) for p in pos) else torch.long
    return builder(torch.tensor(pos, dtype=dtype), request.dim, request.options)


def _print_text(t: _Table, rows: list[list[float]], request: _Request) -> None:
    digits = 4 if request.digits is None else request.digits
    console = Console(highlight=False)
    utf8 = console.encoding.lower().replace("-", "").startswith("utf")

    def text(s: str) -> str:
        return s if utf8 else s.translate(_ASCII)

    opts = " · ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in t.options.items()
        if v is not None
    )
    grid = Table(
        box=box.SIMPLE_HEAD if utf8 else box.ASCII2,
        header_style="bold",
        pad_edge=False,
        show_edge=False,
    )
    grid.add_column("p", justify="right", style="bold")
    for c in request.channels:
        grid.add_column(text(f"{c}\n{t.headers[c]}"), justify="right")
    for p, row in zip(request.positions, rows):
        grid.add_row(_fmt_position(p), *(f"{_clean(v, digits):.{digits}f}" for v in row))
    width = Measurement.get(console, console.options.update_width(10**6), grid).maximum
    if width > console.width:  # print at full width rather than squeezing the numbers
        console = Console(highlight=False, width=width)
    title = f"{request.name} · dim={request.dim}" + (f" · {opts}" if opts else "")
    console.print(text(title), soft_wrap=True)
    console.print(grid)
    if t.caption:
        console.print(text(t.caption), soft_wrap=True)


def _print_csv(t: _Table, rows: list[list[float]], request: _Request) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(["position", *(t.labels[c] for c in request.channels)])
    for p, row in zip(request.positions, rows):
        writer.writerow([p, *(repr(_clean(v, request.digits)) for v in row)])


def _print_json(t: _Table, rows: list[list[float]], request: _Request) -> None:
    head = {
        "encoding": request.name,
        "dim": request.dim,
        "options": t.options,
        **t.extra,
        "positions": request.positions,
        "channels": request.channels,
        "columns": [t.labels[c] for c in request.channels],
    }
    rows = [[_clean(v, request.digits) for v in row] for row in rows]
    # one row of the table per line: readable, and still plain JSON
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in head.items()]
    body = ",\n".join(f"    {json.dumps(row)}" for row in rows)
    lines.append(f'  "table": [\n{body}\n  ]')
    typer.echo("{\n" + ",\n".join(lines) + "\n}")


_PRINTERS = {"text": _print_text, "csv": _print_csv, "json": _print_json}


def _sinusoidal_choice(name: str, choices: tuple[str, ...], default: str) -> Any:
    """A sinusoidal option naming one of ``choices`` (unset: the table's ``default``),
    listed default first in its help and its error."""
    listed = (default, *(c for c in choices if c != default))
    return option(f"sinusoidal: {' or '.join(listed)} (default {default}).", choice(name, listed))


# The options of `posenc table`, each checked when it is parsed (cli/_checks).
EncodingArg = Annotated[
    str, typer.Argument(help=f"Encoding with a fixed table: {', '.join(TABLES)}.")
]
Dim = Annotated[int, option("Number of channels.", integer("--dim", min=1), "--dim", "-d")]
Positions = Annotated[
    str,
    option(
        "Positions: 'a:b' (end excluded), 'a:b:step', or a comma list such as "
        "'0:4,10,100.5'. Floats and negatives allowed.",
        text("--positions"),
        "--positions",
        "-p",
    ),
]
Layout = Annotated[str | None, _sinusoidal_choice("--layout", LAYOUTS, "interleaved")]
Order = Annotated[str | None, _sinusoidal_choice("--order", ORDERS, "sin_cos")]
Base = Annotated[
    float | None,
    option("sinusoidal: wavelength base (10000).", number("--base", min=1.0, exclusive=True)),
]
Normalize = Annotated[
    str | None,
    option("index: 'length' to add p / L instead of p.", choice("--normalize", ("length",))),
]
Length = Annotated[
    int | None,
    option(
        "index with --normalize length: L (default: the number of positions).",
        integer("--length", min=1, max=MAX_POSITION),
    ),
]
Channels = Annotated[
    str | None,
    option("Channels to show, same syntax as --positions (default all).", text("--channels")),
]
Format = Annotated[str, option("text, csv or json.", choice("--format", FORMATS), "--format", "-f")]
Digits = Annotated[
    int | None,
    option(
        "Decimals: text shows 4 by default; csv and json are exact unless set.",
        integer("--digits", min=0, max=17),
    ),
]


@app.command("table")
def table(
    encoding: EncodingArg,
    dim: Dim = 8,
    positions: Positions = "0:8",
    layout: Layout = None,
    order: Order = None,
    base: Base = None,
    normalize: Normalize = None,
    length: Length = None,
    channels: Channels = None,
    fmt: Format = "text",
    digits: Digits = None,
) -> None:
    """Print the table of an additive encoding (rows: positions, columns: channels)."""
    given = {
        "layout": layout,
        "order": order,
        "base": base,
        "normalize": normalize,
        "length": length,
    }
    try:
        request = _check_request(encoding, dim, positions, given, channels, fmt, digits)
        t = _build(request)
    except PosEncError as e:
        fail(str(e))
        return
    rows = t.values[:, request.channels].tolist()  # [n, len(channels)] Python floats
    _PRINTERS[request.fmt](t, rows, request)
