"""The ``posenc`` command.

Each subcommand lives in its own module and registers itself on ``app`` below.
Bad arguments give one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import sys

try:
    import typer
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "the posenc command needs the 'cli' extra: pip install 'posenc[cli]'"
    ) from e

from posenc._errors import PosEncError

app = typer.Typer(
    name="posenc",
    help="Positional encodings for transformers: tables, plots, reports and experiments.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def fail(message: str) -> None:
    """Print ``posenc: error: message`` on stderr and exit with code 2."""
    typer.echo(f"posenc: error: {message}", err=True)
    raise typer.Exit(code=2)


def _register() -> None:
    # Subcommand modules register themselves on `app` when imported.
    from posenc.cli import table  # noqa: F401


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script and ``python -m posenc``."""
    _register()
    try:
        app(args=argv, prog_name="posenc", standalone_mode=True)
    except PosEncError as e:
        typer.echo(f"posenc: error: {e}", err=True)
        sys.exit(2)
