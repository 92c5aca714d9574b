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
from posenc.cli._analysis import PARAM_HELP, check_out_file, encoding_config, positions_arg

__all__ = ["plot_app"]

plot_app = typer.Typer(
    help="Draw an encoding: table, similarity, decay, bias or clock (PNG or SVG).",
    no_args_is_help=True,
)
app.add_typer(plot_app, name="plot")

Encoding = Annotated[str, typer.Option("--encoding", "-e", help="Registry name, e.g. rope.")]
Out = Annotated[str, typer.Option("--out", "-o", help="Output file, .png or .svg.")]
Params = Annotated[list[str] | None, typer.Option("--param", help=PARAM_HELP)]
PositionsOpt = Annotated[
    str | None,
    typer.Option(
        "--positions", "-p", help="Positions as in posenc table: 'a:b', 'a:b:step' or a list."
    ),
]
Width = Annotated[float | None, typer.Option(help="Figure width in inches.")]
Height = Annotated[float | None, typer.Option(help="Figure height in inches.")]
Dpi = Annotated[int, typer.Option(help="Pixels per inch (PNG).")]


def _draw(out: str, draw: Any, default_size: tuple[float, float], width: Any, height: Any) -> None:
    """Check ``--out``, draw, save; any bad input becomes one line and exit code 2."""
    from posenc import plot

    try:
        path = check_out_file(out, plot.FORMATS)
        figsize = (width or default_size[0], height or default_size[1])
        fig = draw(plot, figsize)
        plot.save_figure(fig, path)
    except (PosEncError, ImportError) as e:  # ImportError: the plot extra is missing
        fail(str(e))
        return
    except OSError as e:
        fail(f"cannot write --out {out!r}: {e.strerror or e}")
        return
    typer.echo(f"wrote {path}")


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
    _draw(
        out,
        lambda plot, size: plot.plot_table(
            encoding_config(encoding, param),
            positions_arg(positions),
            figsize=size,
            dpi=dpi,
        ),
        (8.0, 4.5),
        width,
        height,
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
    _draw(
        out,
        lambda plot, size: plot.plot_similarity(
            encoding_config(encoding, param),
            positions_arg(positions),
            figsize=size,
            dpi=dpi,
        ),
        (5.5, 4.5),
        width,
        height,
    )


@plot_app.command("decay")
def decay(
    encoding: Annotated[
        list[str], typer.Option("--encoding", "-e", help="Registry name (repeatable).")
    ],
    out: Out,
    max_distance: Annotated[int, typer.Option(help="Largest distance.")] = 128,
    width: Width = None,
    height: Height = None,
    dpi: Dpi = 100,
) -> None:
    """Similarity (bias: mean bias) against distance, one curve per encoding."""
    _draw(
        out,
        lambda plot, size: plot.plot_decay(
            [encoding_config(name, None) for name in encoding],
            max_distance,
            figsize=size,
            dpi=dpi,
        ),
        (9.0, 4.0),
        width,
        height,
    )


@plot_app.command("bias")
def bias(
    encoding: Encoding,
    out: Out,
    param: Params = None,
    positions: PositionsOpt = None,
    max_heads: Annotated[int, typer.Option(help="Heads shown.")] = 8,
    width: Width = None,
    height: Height = None,
    dpi: Dpi = 100,
) -> None:
    """The bias b[h, query, key] of each head (bias encodings)."""
    _draw(
        out,
        lambda plot, size: plot.plot_bias(
            encoding_config(encoding, param),
            positions_arg(positions),
            max_heads=max_heads,
            figsize=size,
            dpi=dpi,
        ),
        (10.0, 5.0),
        width,
        height,
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
    _draw(
        out,
        lambda plot, size: plot.plot_clock_hands(
            encoding_config(encoding, param),
            positions_arg(positions),
            figsize=size,
            dpi=dpi,
        ),
        (10.0, 3.0),
        width,
        height,
    )
