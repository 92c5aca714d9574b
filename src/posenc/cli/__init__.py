"""The ``posenc`` command.

Each subcommand lives in its own module and registers itself on ``app`` (``_app.py``, the
bottom of the package, which every subcommand imports); ``_main.py`` imports the subcommands
and runs one command. This module only re-exports them.
Bad arguments and a missing optional dependency (matplotlib, the ``plot`` extra, for
``plot``, ``report`` and ``lengthgen --plot``) give one line on stderr and exit code 2; the
environment's refusals (a full disk, a folder that cannot be written, memory that cannot be
had) one line and exit code 1;
never a traceback (``POSENC_TRACEBACK=1`` shows one for an unexpected error).
Where torch is not installed, ``posenc vectors`` and ``posenc conformance`` run (NumPy only)
and every other subcommand says in one line that it needs torch (exit code 2).
"""

from __future__ import annotations

from posenc.cli._app import app, fail
from posenc.cli._main import main, register_commands

__all__ = ["app", "fail", "main"]

_register = register_commands  # the name the tests (and older callers) use
