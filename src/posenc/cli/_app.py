"""The typer app every subcommand registers on, and ``fail``: the bottom of ``posenc.cli``.

Subcommand modules import from here (never from ``posenc.cli`` itself, whose ``__init__``
assembles them); this module imports no other part of the command.
"""

from __future__ import annotations

import typer  # a core dependency: the command works after a plain `pip install posenc`

__all__ = ["app", "fail"]

app = typer.Typer(
    name="posenc",
    help="Positional encodings for transformers: tables, plots, reports and experiments.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # help texts say "[preset]" literally (rich markup ate it)
)


def fail(message: str) -> None:
    """Print ``posenc: error: message`` on stderr and exit with code 2."""
    typer.echo(f"posenc: error: {message}", err=True)
    raise typer.Exit(code=2)


@app.callback()
def _root() -> None:
    """Positional encodings for transformers: tables, plots, reports and experiments."""
