"""Integer, number and position-list options take plain digits only (issue 24).

Python's ``int`` and ``float`` (and ``Fraction``) also read ``1_000``, ``+8``, `` 8 `` and
``1/3``: a typo there would be taken as a number. Each is refused in one line naming the
option, exit code 2; the plain spellings (``-3``, ``2.5``, ``1e3``, ``0, 10``) still work.
"""

from __future__ import annotations

import pytest

from ._command import run

PLOT = ["plot", "table", "-e", "sinusoidal", "--param", "dim=8", "-p", "0:8"]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["table", "sinusoidal", "--positions", "1_000"], "--positions"),
        (["table", "sinusoidal", "--positions", "+3"], "--positions"),
        (["table", "sinusoidal", "--positions", "1/3"], "--positions"),
        (["table", "sinusoidal", "--positions", "1 000"], "--positions"),
        (["table", "sinusoidal", "--positions", "0,,1"], "--positions"),
        (["table", "sinusoidal", "--positions", "0:1_0"], "--positions"),
        (["table", "sinusoidal", "--positions", "0:8:+1"], "--positions"),
        (["table", "sinusoidal", "--positions", "1e99999999"], "--positions"),
        (["table", "sinusoidal", "--dim", "20", "--channels", "1_0"], "--channels"),
        (["table", "sinusoidal", "--dim", "1_000"], "'--dim'"),
        (["table", "sinusoidal", "--dim", "+8"], "'--dim'"),
        (["table", "sinusoidal", "--dim", " 8"], "'--dim'"),
        (["table", "sinusoidal", "--dim", "8 "], "'--dim'"),
        (["table", "sinusoidal", "--digits", "0x3"], "'--digits'"),
        (["table", "sinusoidal", "--base", "1_0000"], "'--base'"),
        (["table", "sinusoidal", "--base", "+10000"], "'--base'"),
        (["table", "index", "--normalize", "length", "--length", "1_0"], "'--length'"),
        (["inspect", "rope", "--length", "1_000"], "'--length'"),
        (["inspect", "rope", "--max-distance", "+16"], "'--max-distance'"),
        (
            ["plot", "decay", "-e", "rope", "--max-distance", "1_0", "-o", "x.png"],
            "'--max-distance'",
        ),
        ([*PLOT, "--dpi", "1_00", "-o", "x.png"], "'--dpi'"),
        ([*PLOT, "--width", "1_0", "-o", "x.png"], "'--width'"),
        ([*PLOT, "--height", " 2", "-o", "x.png"], "'--height'"),
        (["plot", "bias", "-e", "alibi", "--max-heads", "+2", "-o", "x.png"], "'--max-heads'"),
        (["report", "--jobs", "1_0", "--out", "r"], "'--jobs'"),
    ],
)
def test_what_int_would_take_is_refused_naming_the_option(
    capsys, tmp_path, monkeypatch, args, option
):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *args)
    assert code == 2 and out == "" and err.count("\n") == 1, (code, err)
    assert err.startswith("posenc: error: ") and option in err and "Traceback" not in err
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("args", "first_column"),
    [
        (["--positions", "-3,0, 10"], ["-3", "0", "10"]),
        (["--positions", "1e3"], ["1000"]),
        (["--positions", "0:1:.5"], ["0.0", "0.5"]),
        (["--positions", " 2:4 "], ["2", "3"]),
    ],
)
def test_plain_spellings_still_work(capsys, args, first_column):
    code, out, err = run(capsys, "table", "sinusoidal", "--dim", "2", *args, "-f", "csv")
    assert code == 0, err
    assert [row.split(",")[0] for row in out.splitlines()[1:]] == first_column


def test_a_negative_integer_option_is_still_read(capsys):
    code, out, err = run(capsys, "table", "sinusoidal", "--dim", "-2")
    assert (code, out) == (
        2,
        "",
    ) and "dim must be >= 1, got -2" in err  # read as -2, refused by range
