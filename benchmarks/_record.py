"""What a benchmark's JSON record starts with: its name, when and how it ran.

Imported by the benchmarks run as scripts (``python benchmarks/NAME.py``: this folder is on
``sys.path``), inside their ``main`` so that a test loading a benchmark file does not need it.
"""

from __future__ import annotations

import datetime
import shlex
import sys
from pathlib import Path


def record_head(benchmark: str) -> dict[str, str]:
    """``{"benchmark", "date", "command"}``: the name, the UTC time to the second and the
    command line that ran (the interpreter by its file name)."""
    return {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
    }
