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

from typing import Annotated, Any

import typer

from posenc._errors import PosEncError
from posenc.cli import app, fail
from posenc.cli._analysis import (
    MAX_POSITIONS,
    PARAM_HELP,
    check_analysis_size,
    check_out_file,
    encoding_config,
    positions_arg,
)
from posenc.cli._checks import integer, number, text
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
Params = Annotated[
    list[str] | None, typer.Option("--param", help=PARAM_HELP, callback=text("--param"))
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
    typer.Option(
        help="Figure width in inches.",
        callback=number("--width", min=0.0, max=MAX_INCHES, exclusive=True),
    ),
]
Height = Annotated[
    float | None,
    typer.Option(
        help="Figure height in inches.",
        callback=number("--height", min=0.0, max=MAX_INCHES, exclusive=True),
    ),
]
Dpi = Annotated[
    int,
    typer.Option(help="Pixels per inch (PNG).", callback=integer("--dpi", min=1, max=MAX_DPI)),
]


def _draw(
    out: str,
    draw: Any,
    default_size: tuple[float, float],
    width: Any,
    height: Any,
    dpi: int,
    size: tuple[str, dict[str, Any], int, int] | None = None,
) -> None:
    """Check ``--out`` and the sizes, draw, save; a bad input becomes one line and exit
    code 2, a file that cannot be written (OSError) one line and exit code 1 (in ``main``).

    ``size``: ``(what, config, positions, max_distance)`` for the memory estimate."""
    from posenc import plot

    try:
        path = check_out_file(out, plot.FORMATS)
        figsize = (width or default_size[0], height or default_size[1])
        pixels = figsize[0] * dpi * figsize[1] * dpi
        if pixels > MAX_PIXELS:
            raise PosEncError(
                f"--width x --height x --dpi**2 must be at most {MAX_PIXELS} pixels, got "
                f"{figsize[0]:g} x {figsize[1]:g} in at {dpi} dpi = {pixels:.3g}"
            )
        if size is not None:
            what, config, n, k = size
            check_analysis_size(what, config, n, max_distance=k)
        fig = draw(plot, figsize)
        plot.save_figure(fig, path)
    except (PosEncError, ImportError) as e:  # ImportError: the plot extra is missing
        fail(str(e))
        return
    typer.echo(f"wrote {path}")


def _count(positions: str | None, default: int = 256) -> int:
    """How many positions ``--positions`` names (``default`` when it is not given)."""
    return default if positions is None else len(parse_positions(positions, name="--positions"))


@plot_app.command("table")
def table(
    encoding: Encoding,
    out: Out,
    param: Params = None,
    positions: PositionsOpt = None,
    width: Width = None,
    height: Height = None,
    dpi: Dpi = 100,
) -> None:
    """The table as a heatmap (rotary: cos/sin of every angle; bias: per-head maps)."""
    config = encoding_config(encoding, param)
    _draw(
        out,
        lambda plot, size: plot.plot_table(config, positions_arg(positions), figsize=size, dpi=dpi),
        (8.0, 4.5),
        width,
        height,
        dpi,
        ("plot table", config, _count(positions), 0),
    )


@plot_app.command("similarity")
def similarity(
    encoding: Encoding,
    out: Out,
    param: Params = None,
    positions: PositionsOpt = None,
    width: Width = None,
    height: Height = None,
    dpi: Dpi = 100,
) -> None:
    """Cosine similarity of every pair of positions (additive and rotary encodings)."""
    config = encoding_config(encoding, param)
    _draw(
        out,
        lambda plot, size: plot.plot_similarity(
            config, positions_arg(positions), figsize=size, dpi=dpi
        ),
        (5.5, 4.5),
        width,
        height,
        dpi,
        ("plot similarity", config, _count(positions), 0),
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
    max_distance: Annotated[
        int,
        typer.Option(
            help="Largest distance.",
            callback=integer("--max-distance", min=1, max=MAX_POSITIONS),
        ),
    ] = 128,
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
            f"plot decay at --max-distance {max_distance}",
            config,
            max_distance + 1 if pairwise else 1,
            max_distance=max_distance,
        )
    _draw(
        out,
        lambda plot, size: plot.plot_decay(configs, max_distance, figsize=size, dpi=dpi),
        (9.0, 4.0),
        width,
        height,
        dpi,
    )


@plot_app.command("bias")
def bias(
    encoding: Encoding,
    out: Out,
    param: Params = None,
    positions: PositionsOpt = None,
    max_heads: Annotated[
        int, typer.Option(help="Heads shown.", callback=integer("--max-heads", min=1, max=1024))
    ] = 8,
    width: Width = None,
    height: Height = None,
    dpi: Dpi = 100,
) -> None:
    """The bias b[h, query, key] of each head (bias encodings)."""
    config = encoding_config(encoding, param)
    _draw(
        out,
        lambda plot, size: plot.plot_bias(
            config, positions_arg(positions), max_heads=max_heads, figsize=size, dpi=dpi
        ),
        (10.0, 5.0),
        width,
        height,
        dpi,
        ("plot bias", config, _count(positions), 0),
    )


@plot_app.command("clock")
def clock(
    encoding: Encoding,
    out: Out,
    param: Params = None,
    positions: PositionsOpt = None,
    width: Width = None,
    height: Height = None,
    dpi: Dpi = 100,
) -> None:
    """Rotary angles as clock hands, one clock per frequency (rotary encodings)."""
    config = encoding_config(encoding, param)
    _draw(
        out,
        lambda plot, size: plot.plot_clock_hands(
            config, positions_arg(positions), figsize=size, dpi=dpi
        ),
        (10.0, 3.0),
        width,
        height,
        dpi,
        ("plot clock", config, _count(positions), 0),
    )
