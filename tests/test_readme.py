"""The README stays true: its python blocks run, in order, in one namespace; the output it
shows for ``posenc table`` is what the command prints; its Quickstart commands exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from posenc.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(language: str) -> list[tuple[int, str]]:
    """``(line number, code)`` of every fenced block in ``language``, in order."""
    text = README.read_text(encoding="utf-8")
    return [
        (text[: m.start()].count("\n") + 1, m.group(2))
        for m in FENCE.finditer(text)
        if m.group(1) == language
    ]


def test_python_blocks_run_in_order(tmp_path, monkeypatch):
    blocks = _blocks("python")
    assert blocks, "the README's API tour has python examples"
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    namespace: dict = {"__name__": "__readme__"}
    for line, code in blocks:
        try:
            exec(compile(code, f"README.md:{line}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"the python block at README.md line {line} fails: {e!r}") from e


def _table_sessions() -> list[tuple[str, list[str]]]:
    """``$ posenc table ...`` commands of console blocks, with the output shown under them."""
    sessions = []
    for _, block in _blocks("console"):
        command, output = None, []
        for text in [*block.splitlines(), "$"]:
            if text.startswith("$"):
                if command and command.startswith("posenc table") and output:
                    sessions.append((command, output))
                command, output = text[1:].strip(), []
            else:
                output.append(text)
    return sessions


@pytest.mark.parametrize(
    "session", _table_sessions(), ids=lambda s: s[0] if isinstance(s, tuple) else s
)
def test_shown_table_output_is_true(session, capsys):
    command, expected = session
    with pytest.raises(SystemExit) as exit_info:
        main(shlex.split(command)[1:])
    assert exit_info.value.code == 0
    printed = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert printed == [line.rstrip() for line in expected]


def test_quickstart_commands_are_make_targets():
    makefile = (README.parent / "Makefile").read_text(encoding="utf-8")
    commands = [
        line.split("#")[0].strip() for _, block in _blocks("bash") for line in block.splitlines()
    ]
    quickstart = [c for c in commands if c.startswith("make ")]
    assert quickstart[:2] == ["make demo", "make test"]
    for command in quickstart:
        assert re.search(rf"^{command.split()[1]}:", makefile, re.MULTILINE), command
