"""The ``posenc`` command.

Each subcommand lives in its own module and registers itself on ``app`` below.
Bad arguments give one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import sys

try:
    import typer
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("the posenc command needs the 'cli' extra: pip install 'posenc[cli]'") from e

try:  # recent typer vendors its own copy of click
    from typer._click import exceptions as _click_errors
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as _click_errors  # type: ignore[no-redef]

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


@app.callback()
def _root() -> None:
    """Positional encodings for transformers: tables, plots, reports and experiments."""


def _register() -> None:
    # Subcommand modules register themselves on `app` when imported.
    import posenc.cli.lengthgen  # noqa: F401
    from posenc.cli import inspect, plot, report, table  # noqa: F401


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script and ``python -m posenc``.

    Usage errors (unknown option, bad value, missing argument) and ``PosEncError`` give
    one line ``posenc: error: ...`` on stderr and exit code 2.
    """
    _register()
    try:
        code = app(args=argv, prog_name="posenc", standalone_mode=False)
    except _click_errors.NoArgsIsHelpError:  # bare `posenc`: typer has printed the help
        sys.exit(2)
    except _click_errors.UsageError as e:
        where = f" (see '{e.ctx.command_path} --help')" if e.ctx else ""
        message = " ".join(e.format_message().split())  # one line
        typer.echo(f"posenc: error: {message}{where}", err=True)
        sys.exit(2)
    except _click_errors.ClickException as e:
        typer.echo(f"posenc: error: {' '.join(e.format_message().split())}", err=True)
        sys.exit(e.exit_code)
    except typer.Abort:
        typer.echo("posenc: aborted", err=True)
        sys.exit(130)
    except PosEncError as e:
        typer.echo(f"posenc: error: {e}", err=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
