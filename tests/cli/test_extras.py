"""The command after a plain `pip install posenc` (no `plot` extra): every subcommand that
draws nothing works, one that needs matplotlib says so in one line and exits with code 2,
and lengthgen writes its results without a figure unless --plot asks for one."""

from __future__ import annotations

import json
import sys

import pytest

from ._command import run


@pytest.fixture
def no_matplotlib(monkeypatch):
    """matplotlib absent, as after a plain install (importing it raises ImportError)."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


@pytest.mark.parametrize(
    "args",
    [
        ("table", "sinusoidal", "--dim", "4", "--positions", "0:3"),
        ("inspect", "rope", "--length", "64"),
        ("--help",),
    ],
    ids=["table", "inspect", "help"],
)
def test_commands_that_draw_nothing_work(no_matplotlib, capsys, args):
    code, out, err = run(capsys, *args)
    assert code == 0 and out and not err


@pytest.mark.parametrize(
    "args",
    [
        ("plot", "table", "--encoding", "sinusoidal", "--out", "{tmp}/t.png"),
        ("report", "--out", "{tmp}/report", "--quick"),
        ("lengthgen", "--task", "copy", "--plot", "--out", "{tmp}/lg"),
    ],
    ids=["plot", "report", "lengthgen-plot"],
)
def test_commands_that_draw_name_the_extra_in_one_line(no_matplotlib, capsys, tmp_path, args):
    code, out, err = run(capsys, *(a.format(tmp=tmp_path) for a in args))
    assert code == 2 and not out
    assert err.count("\n") == 1 and err.startswith("posenc: error:") and "posenc[plot]" in err
    assert not (tmp_path / "lg").exists()  # refused before anything trained


def test_lengthgen_without_matplotlib_writes_results_and_no_figure(no_matplotlib, capsys, tmp_path):
    out_dir = tmp_path / "lg"
    args = ["lengthgen", "--task", "copy", "--encodings", "none", "--train-len", "8"]
    args += ["--eval-lens", "8,16", "--steps", "2", "--dim", "16", "--layers", "1"]
    args += ["--heads", "2", "--eval-examples", "4", "--quiet", "--out", str(out_dir)]
    code, _, err = run(capsys, *args)
    assert code in (0, None), err
    results = json.loads((out_dir / "results.json").read_text())
    assert [r["encoding"] for r in results["runs"]] == ["none"]
    assert not (out_dir / "lengthgen.png").exists()
