"""Docstrings say what a caller needs: short, and free of measurements.

Parametrized by module of ``src/posenc``; every docstring (module, class, function, method)
is held to two rules, and a failure names the file, the object and the line:

1. at most :data:`MAX_LINES` lines (how it works, the rules per family and the why live on
   the pages under ``docs/``, with a pointer in the docstring);
2. no measured time, throughput or speed-up (``35 µs``, ``4 GB/s``, ``0.9x faster``): such
   numbers go to ``benchmarks/RESULTS.md``, where the run that measured them is recorded.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "posenc"
MAX_LINES = 40

FILES = sorted(PACKAGE.rglob("*.py"))
IDS = [p.relative_to(SRC).with_suffix("").as_posix().replace("/", ".") for p in FILES]

_NUMBER = r"\d(?:[\d,.]*\d)?"
MEASURED = re.compile(
    rf"(?<![\w.]){_NUMBER}\s*(?:µs|us|ms|ns|GB/s|MB/s|GiB/s|MiB/s)(?![\w/])"
    rf"|(?<![\w.]){_NUMBER}\s*x\s+(?:faster|slower)\b"
    rf"|\btimes\s+(?:faster|slower)\b",
    re.IGNORECASE,
)
# a polling interval is a setting of the code, not a measurement
_INTERVAL = re.compile(rf"\bevery\s+{_NUMBER}\s*(?:µs|us|ms|ns)\b", re.IGNORECASE)

_DEFS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def docstrings(path: Path) -> list[tuple[str, int, int, str]]:
    """``(qualified name, first line, lines, text)`` of every docstring in ``path`` (its
    lines as the file shows them, the quotes' lines included)."""
    found: list[tuple[str, int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        if isinstance(node, (ast.Module, *_DEFS)):
            text = ast.get_docstring(node, clean=False)
            if text is not None:
                first = node.body[0]
                lines = (first.end_lineno or first.lineno) - first.lineno + 1
                found.append((prefix or "<module>", first.lineno, lines, text))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _DEFS):
                visit(child, f"{prefix}.{child.name}" if prefix else child.name)
            elif isinstance(child, ast.stmt):  # a def under if / try / with
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_docstrings_are_short(path: Path) -> None:
    where = path.relative_to(SRC.parent)
    long = [
        f"{where}:{line} {name}: {lines} lines"
        for name, line, lines, _ in docstrings(path)
        if lines > MAX_LINES
    ]
    assert not long, f"docstrings over {MAX_LINES} lines (detail goes to docs/):\n" + "\n".join(
        long
    )


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_docstrings_hold_no_measurement(path: Path) -> None:
    where = path.relative_to(SRC.parent)
    hits = []
    for name, line, _, text in docstrings(path):
        for i, row in enumerate(text.splitlines()):
            row = _INTERVAL.sub("", row)
            match = MEASURED.search(row)
            if match:
                hits.append(f"{where}:{line + i} {name}: {match.group(0)!r} in {row.strip()!r}")
    assert not hits, "measurements in docstrings (they go to benchmarks/RESULTS.md):\n" + (
        "\n".join(hits)
    )


def test_the_scan_finds_docstrings_and_measurements() -> None:
    """The scan itself: nested methods are found, and the regex tells a measurement from a
    setting or a size."""
    tree = docstrings(PACKAGE / "rotary" / "module.py")
    names = {name for name, *_ in tree}
    assert {"<module>", "RotaryEmbedding", "RotaryEmbedding.rotation"} <= names
    measured = ["took 22 ms", "35 of the 50 µs", "0.93x faster", "ten times slower", "4 GB/s"]
    assert [bool(MEASURED.search(s)) for s in measured] == [True] * len(measured)
    fine = ["64 MiB", "sampled every 5 ms", "2048 positions", "float32", "fp16 x 4"]
    assert [bool(MEASURED.search(_INTERVAL.sub("", s))) for s in fine] == [False] * len(fine)
