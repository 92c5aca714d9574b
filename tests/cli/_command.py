"""Running ``posenc`` for the CLI tests: in this process, or as the installed script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from posenc.cli import main


def run(capsys, *args: str) -> tuple[int, str, str]:
    """Run ``posenc ARGS`` in-process through the console entry point:
    ``(exit code, stdout, stderr)``."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def console_script(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the installed ``posenc`` script (not ``main`` in-process) with ``args``."""
    script = Path(sys.executable).parent / "posenc"
    assert script.exists(), "the posenc console script is installed with the package"
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
