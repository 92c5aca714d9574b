"""``posenc plot``: draw what an encoding does to a PNG or SVG file.

    posenc plot table --encoding sinusoidal --out table.png
    posenc plot similarity --encoding rope --positions 0:256 --out sim.svg
    posenc plot decay --encoding sinusoidal --encoding rope --encoding alibi --out decay.png
    posenc plot bias --encoding t5 --param num_heads=4 --positions 0:64 --out t5.png
    posenc plot clock --encoding rope --out clock.png

Names are built with the analysis defaults (64 channels, 8 heads); ``--param KEY=VALUE``
sets any constructor argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from posenc._errors import PosEncError
from posenc.cli._analysis import (
    Params,
    check_analysis_size,
    check_out_file,
    count_option,
    encoding_config,
    positions_arg,
    positions_label,
)
from posenc.cli._app import app, fail
from posenc.cli._checks import integer, number, option, text, write_option_file
from posenc.cli.table import parse_positions

__all__ = ["plot_app"]

plot_app = typer.Typer(
    help="Draw an encoding: table, similarity, decay, bias or clock (PNG or SVG).",
    no_args_is_help=True,
)
app.add_typer(plot_app, name="plot")

MAX_INCHES = 200.0  # a figure side
MAX_PIXELS = 2**26  # a figure's width x height in pixels (matplotlib: 2**16 a side)
MAX_DPI = 2400

Encoding = Annotated[
    str,
    typer.Option("--encoding", "-e", help="Registry name, e.g. rope.", callback=text("--encoding")),
]
Out = Annotated[
    str, typer.Option("--out", "-o", help="Output file, .png or .svg.", callback=text("--out"))
]
PositionsOpt = Annotated[
    str | None,
    typer.Option(
        "--positions",
        "-p",
        help="Positions as in posenc table: 'a:b', 'a:b:step' or a list.",
        callback=text("--positions"),
    ),
]
Width = Annotated[
    float | None,
    option("Figure width in inches.", number("--width", min=0.0, max=MAX_INCHES, exclusive=True)),
]
Height = Annotated[
    float | None,
    option("Figure height in inches.", number("--height", min=0.0, max=MAX_INCHES, exclusive=True)),
]
Dpi = Annotated[int, option("Pixels per inch (PNG).", integer("--dpi", min=1, max=MAX_DPI))]


@dataclass(frozen=True)
class _Size:
    """``--width`` and ``--height`` (inches; None: the picture's own) and ``--dpi``."""

    width: float | None
    height: float | None
    dpi: int

    def figsize(self, default: tuple[float, float]) -> tuple[float, float]:
        return (self.width or default[0], self.height or default[1])


@dataclass(frozen=True)
class _Picture:
    """A ``posenc plot`` subcommand that draws one encoding at ``--positions``."""

    command: str  # the subcommand's name
    function: str  # the posenc.plot function that draws it
    size: tuple[float, float]  # the figure's default width and height in inches


def _draw(
    out: str,
    draw: Callable[[Any, tuple[float, float]], Any],
    size: _Size,
    default: tuple[float, float],
    estimate: tuple[str, dict[str, Any], int, str] | None = None,
) -> None:
    """Check ``--out`` and the sizes, draw, save; a bad input becomes one line and exit
    code 2, and so does a file that cannot be written (``/proc/x.png``), naming ``--out``;
    where the environment refuses (no permission, a full disk) the line is an OSError's,
    exit code 1 (in ``main``).

    ``estimate``: ``(what, config, positions, label)`` for the memory estimate, ``label``
    naming the option that gave the positions."""
    from posenc import plot

    try:
        path = check_out_file(out, plot.FORMATS)
        figsize, dpi = size.figsize(default), size.dpi
        pixels = figsize[0] * dpi * figsize[1] * dpi
        if pixels > MAX_PIXELS:
            raise PosEncError(
                f"--width x --height x --dpi**2 must be at most {MAX_PIXELS} pixels, got "
                f"{figsize[0]:g} x {figsize[1]:g} in at {dpi} dpi = {pixels:.3g}"
            )
        if estimate is not None:
            what, config, n, label = estimate
            check_analysis_size(
                what, config, n, max_distance=0, positions_from=label, distance_from=None
            )
        fig = draw(plot, figsize)
        write_option_file("--out", path, plot.figure_bytes(fig, path.suffix.lstrip(".").lower()))
    except (PosEncError, ImportError) as e:  # ImportError: the plot extra is missing
        fail(str(e))
        return
    typer.echo(f"wrote {path}")


def _count(positions: str | None, default: int = 256) -> int:
    """How many positions ``--positions`` names (``default`` when it is not given)."""
    return default if positions is None else len(parse_positions(positions, name="--positions"))


def _draw_picture(
    picture: _Picture,
    encoding: str,
    param: list[str] | None,
    positions: str | None,
    out: str,
    size: _Size,
    **options: Any,
) -> None:
    """What every per-position subcommand does: build the config, estimate, draw."""
    config = encoding_config(encoding, param)
    count = _count(positions)
    estimate = (f"plot {picture.command}", config, count, positions_label(positions, count))

    def draw(plot: Any, figsize: tuple[float, float]) -> Any:
        function = getattr(plot, picture.function)
        at = positions_arg(positions)
        return function(config, at, **options, figsize=figsize, dpi=size.dpi)

    _draw(out, draw, size, picture.size, estimate)


def _picture_command(picture: _Picture, help: str) -> Callable[..., None]:
    """The subcommand of ``picture`` (``help``: its help text) with the options every
    per-position picture takes; registered on ``plot_app``."""

    def command(
        encoding: Encoding,
        out: Out,
        param: Params = None,
        positions: PositionsOpt = None,
        width: Width = None,
        height: Height = None,
        dpi: Dpi = 100,
    ) -> None:
        _draw_picture(picture, encoding, param, positions, out, _Size(width, height, dpi))

    command.__name__ = command.__qualname__ = picture.command
    command.__doc__ = help
    return plot_app.command(picture.command)(command)


table = _picture_command(
    _Picture("table", "plot_table", (8.0, 4.5)),
    "The table as a heatmap (rotary: cos/sin of every angle; bias: per-head maps).",
)
similarity = _picture_command(
    _Picture("similarity", "plot_similarity", (5.5, 4.5)),
    "Cosine similarity of every pair of positions (additive and rotary encodings).",
)


@plot_app.command("decay")
def decay(
    encoding: Annotated[
        list[str],
        typer.Option(
            "--encoding", "-e", help="Registry name (repeatable).", callback=text("--encoding")
        ),
    ],
    out: Out,
    max_distance: Annotated[int, count_option("--max-distance", "Largest distance.", min=1)] = 128,
    width: Width = None,
    height: Height = None,
    dpi: Dpi = 100,
) -> None:
    """Similarity (bias: mean bias) against distance, one curve per encoding."""
    from posenc import registry

    configs = [encoding_config(name, None) for name in encoding]
    for config in configs:
        try:  # a bias is measured on [h, n, n] maps; the others on a [d, n, d] basis
            pairwise = registry.get(config["name"]).kind == "bias"
        except PosEncError:
            pairwise = False  # an unknown name: the plot refuses it, naming the choices
        check_analysis_size(
            f"plot decay of {config['name']!r}",
            config,
            max_distance + 1 if pairwise else 1,
            max_distance=max_distance,
            positions_from=f"--max-distance {max_distance}",
        )
    _draw(
        out,
        lambda plot, size: plot.plot_decay(configs, max_distance, figsize=size, dpi=dpi),
        _Size(width, height, dpi),
        (9.0, 4.0),
    )


_BIAS = _Picture("bias", "plot_bias", (10.0, 5.0))


@plot_app.command("bias")
def bias(
    encoding: Encoding,
    out: Out,
    param: Params = None,
    positions: PositionsOpt = None,
    max_heads: Annotated[int, option("Heads shown.", integer("--max-heads", min=1, max=1024))] = 8,
    width: Width = None,
    height: Height = None,
    dpi: Dpi = 100,
) -> None:
    """The bias b[h, query, key] of each head (bias encodings)."""
    size = _Size(width, height, dpi)
    _draw_picture(_BIAS, encoding, param, positions, out, size, max_heads=max_heads)


clock = _picture_command(
    _Picture("clock", "plot_clock_hands", (10.0, 3.0)),
    "Rotary angles as clock hands, one clock per frequency (rotary encodings).",
)
