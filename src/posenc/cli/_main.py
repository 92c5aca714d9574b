"""``main``: the subcommands registered, one run of the command, every error as one line.

Usage errors and ``PosEncError`` (and a missing extra) exit 2, the environment's refusals
(``OSError``, out of memory) exit 1, a bug one line ``posenc: internal error: ...`` and exit 1.

Where torch is not installed, the NumPy commands (``vectors``, ``conformance``) run as ever,
``--help`` lists them and names the others, and each of the others (:data:`TORCH_COMMANDS`)
is one line, ``posenc: error: posenc table needs torch, which is not installed: pip install
torch``, and exit 2.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Any

import typer
import typer.main

from posenc._errors import PosEncError
from posenc._lazy import TORCH_MISSING, needs_torch
from posenc.cli._app import app

__all__ = ["TORCH_COMMANDS", "main", "register_commands"]

#: The subcommands that need torch, each registered by the module of its name.
TORCH_COMMANDS = ("compare", "extend", "inspect", "lengthgen", "plot", "report", "table")


def _click_exceptions() -> ModuleType:
    """The click exceptions typer raises: its own copy (recent typer) or click's."""
    try:
        return importlib.import_module("typer._click.exceptions")
    except ImportError:  # pragma: no cover - older typer uses click itself
        return importlib.import_module("click.exceptions")


_click_errors = _click_exceptions()


def register_commands() -> None:
    """Import every subcommand module; each registers itself on ``app``. Where torch is
    missing, only the NumPy ones (``vectors`` and ``conformance``)."""
    import posenc.cli.conformance  # NumPy only: vectors, conformance

    if TORCH_MISSING:
        return
    import posenc.cli.compare
    import posenc.cli.extend
    import posenc.cli.inspect
    import posenc.cli.lengthgen
    import posenc.cli.plot
    import posenc.cli.report
    import posenc.cli.table  # noqa: F401


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script and ``python -m posenc``.

    Usage errors (unknown option, bad value, missing argument) and ``PosEncError`` give
    one line ``posenc: error: ...`` on stderr and exit code 2; ``OSError`` (a full disk, a
    folder that cannot be written) and running out of memory one line and exit code 1.
    Anything else is a bug: one line ``posenc: internal error: ...`` and exit code 1
    (``POSENC_TRACEBACK=1`` raises it instead).
    """
    register_commands()
    _refuse_without_torch(sys.argv[1:] if argv is None else argv)
    code = _run(argv)
    sys.exit(code if isinstance(code, int) else 0)


def _refuse_without_torch(argv: list[str]) -> None:
    """Exit 2 with one line when torch is missing and ``argv`` asks for a command that needs
    it (the first argument not an option is the command: the root takes no option but
    ``--help``)."""
    if not TORCH_MISSING:
        return
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in TORCH_COMMANDS:
        typer.echo(f"posenc: error: {needs_torch(f'posenc {command}')}", err=True)
        sys.exit(2)


def _internal(e: BaseException) -> None:
    if os.environ.get("POSENC_TRACEBACK"):
        raise e
    typer.echo(
        f"posenc: internal error: {type(e).__name__}: {_one_line(str(e))[:300]} "
        f"(a bug; POSENC_TRACEBACK=1 shows the traceback)",
        err=True,
    )
    sys.exit(1)


_built: dict[tuple[int, int], Any] = {}


def _command() -> Any:
    """The click command of ``app``, built once per process (typer rebuilds it on every
    call, at a cost ``benchmarks/RESULTS.md`` records; ``main`` runs in-process many times in
    the tests)."""
    key = (len(app.registered_commands), len(app.registered_groups))
    if key not in _built:
        _built.clear()
        _built[key] = typer.main.get_command(app)
        if TORCH_MISSING:  # --help names what is not there
            _built[key].epilog = (
                f"Without torch (not installed) only these run; {', '.join(TORCH_COMMANDS)} "
                "need torch: pip install torch"
            )
    return _built[key]


def _run(argv: list[str] | None) -> object:
    try:
        return _command().main(args=argv, prog_name="posenc", standalone_mode=False)
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
        typer.echo(f"posenc: error: {_one_line(str(e))}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("posenc: interrupted", err=True)
        sys.exit(130)
    except ImportError as e:  # an optional dependency (an extra) is missing: one line, as
        typer.echo(f"posenc: error: {_one_line(str(e))}", err=True)  # plot and report do
        sys.exit(2)
    except OSError as e:  # ENOSPC, EACCES, EROFS, ...: the environment, not the command line
        typer.echo(f"posenc: error: {_os_error(e)}", err=True)
        sys.exit(1)
    except MemoryError:
        typer.echo("posenc: error: out of memory; ask for less", err=True)
        sys.exit(1)
    except RuntimeError as e:
        if "allocate" not in str(e) and "out of memory" not in str(e):
            _internal(e)
        typer.echo(f"posenc: error: out of memory ({_one_line(str(e))[:200]})", err=True)
        sys.exit(1)
    except Exception as e:  # a bug: still one line, the traceback on request
        _internal(e)
    return None


def _one_line(text: str) -> str:
    """``text`` with its line breaks as spaces (a repr'd value keeps its own spaces)."""
    return " ".join(part.strip() for part in text.strip().splitlines() if part.strip())


def _os_error(e: OSError) -> str:
    """``No space left on device: 'out/results.json'`` (torch's and our own wording too)."""
    what = e.strerror or str(e) or type(e).__name__
    where = f": {str(e.filename)!r}" if e.filename else ""
    return _one_line(f"{what}{where}")
