"""``posenc table``: the printed tables against the float64 reference, the position syntax,
and one-line errors with exit code 2."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys

import numpy as np
import pytest

import posenc
from posenc import reference
from posenc.cli.table import MAX_ROWS, parse_positions

from ._command import console_script, run


def _rows(text: str) -> list[list[float]]:
    """The numeric rows of a text table: the lines of numbers below the header rule."""
    rows = []
    lines = text.splitlines()
    below = next(i for i, line in enumerate(lines) if "─" in line) + 1
    for line in lines[below:]:
        cells = line.split()
        try:
            rows.append([float(c) for c in cells])
        except ValueError:
            continue
    return [r for r in rows if r]


# --- output ----------------------------------------------------------------------------


def test_worked_example_text(capsys):
    code, out, err = run(capsys, "table", "sinusoidal", "--dim", "4", "--positions", "0:6")
    assert code == 0 and err == ""
    expected = [
        [p, math.sin(p), math.cos(p), math.sin(p / 100), math.cos(p / 100)] for p in range(6)
    ]
    np.testing.assert_allclose(_rows(out), expected, atol=5e-5, rtol=0)
    assert "sin ω₀" in out and "cos ω₁" in out
    assert "layout=interleaved" in out and "order=sin_cos" in out and "base=10000" in out


@pytest.mark.parametrize("layout", ["interleaved", "half", "flax"])
@pytest.mark.parametrize("order", ["sin_cos", "cos_sin"])
def test_csv_is_the_reference_exactly(capsys, layout, order):
    args = [
        "table",
        "sinusoidal",
        "-d",
        "7",
        "-p",
        "-2:3,0.5,1e4",
        "--layout",
        layout,
        "--order",
        order,
        "--base",
        "500",
        "-f",
        "csv",
    ]
    code, out, _ = run(capsys, *args)
    assert code == 0
    rows = list(csv.reader(io.StringIO(out)))
    header, body = rows[0], rows[1:]
    assert header[0] == "position" and len(header) == 8
    positions = [float(r[0]) for r in body]
    assert positions == [-2.0, -1.0, 0.0, 1.0, 2.0, 0.5, 10000.0]
    ref = reference.sinusoidal_table(positions, 7, base=500.0, layout=layout, order=order)
    np.testing.assert_allclose(
        np.array([[float(v) for v in r[1:]] for r in body]), ref, atol=1e-12, rtol=0
    )


def test_csv_header_names_the_channels(capsys):
    _, out, _ = run(
        capsys, "table", "sinusoidal", "-d", "5", "-p", "0", "--layout", "half", "-f", "csv"
    )
    assert out.splitlines()[0] == "position,sin0,sin1,sin2,cos0,cos1"


def test_json(capsys):
    code, out, _ = run(capsys, "table", "sinusoidal", "-d", "4", "-p", "0:6", "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["encoding"] == "sinusoidal" and data["dim"] == 4
    assert data["options"] == {"base": 10000.0, "layout": "interleaved", "order": "sin_cos"}
    assert data["positions"] == [0, 1, 2, 3, 4, 5]
    assert data["columns"] == ["sin0", "cos0", "sin1", "cos1"]
    assert data["frequencies"] == [1.0, 0.01]
    np.testing.assert_allclose(
        data["table"], reference.sinusoidal_table(np.arange(6), 4), atol=1e-12, rtol=0
    )


def test_digits_and_channels(capsys):
    code, out, _ = run(
        capsys,
        "table",
        "sinusoidal",
        "-d",
        "512",
        "-p",
        "1,2",
        "--channels",
        "0:2,510:512",
        "-f",
        "csv",
        "--digits",
        "3",
    )
    assert code == 0
    ref = reference.sinusoidal_table([1, 2], 512)[:, [0, 1, 510, 511]]
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == ["position", "sin0", "cos0", "sin255", "cos255"]
    assert [[float(v) for v in r[1:]] for r in rows[1:]] == np.round(ref, 3).tolist()


def test_text_digits(capsys):
    _, out, _ = run(capsys, "table", "sinusoidal", "-d", "2", "-p", "1", "--digits", "6")
    assert "0.841471" in out and "0.540302" in out


def test_wide_tables_are_not_squeezed(capsys):
    _, out, _ = run(capsys, "table", "sinusoidal", "-d", "32", "-p", "0:3")
    rows = _rows(out)
    assert len(rows) == 3 and all(len(r) == 33 for r in rows)


@pytest.mark.parametrize(
    ("normalize", "length", "scale"), [(None, None, 1), ("length", None, 5), ("length", "10", 10)]
)
def test_index_table(capsys, normalize, length, scale):
    args = ["table", "index", "-d", "3", "-p", "0:5", "-f", "csv"]
    args += ["--normalize", normalize] if normalize else []
    args += ["--length", length] if length else []
    code, out, _ = run(capsys, *args)
    assert code == 0
    body = [[float(v) for v in r] for r in list(csv.reader(io.StringIO(out)))[1:]]
    ref = reference.index_table(
        np.arange(5), 3, normalize=normalize, length=scale if normalize else None
    )
    np.testing.assert_array_equal(np.array(body)[:, 1:], ref)


def test_index_text(capsys):
    code, out, _ = run(capsys, "table", "index", "-d", "2", "-p", "0:3", "--normalize", "length")
    assert code == 0 and "p/L" in out and "L = 3" in out
    np.testing.assert_allclose(
        _rows(out), [[0, 0, 0], [1, 1 / 3, 1 / 3], [2, 2 / 3, 2 / 3]], atol=5e-5
    )


def test_help(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "table" in out
    code, out, _ = run(capsys, "table", "--help")
    assert code == 0 and "--positions" in out and "--format" in out


# --- position syntax -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("0:6", [0, 1, 2, 3, 4, 5]),
        (":3", [0, 1, 2]),
        ("2:9:3", [2, 5, 8]),
        ("5:0:-2", [5, 3, 1]),
        ("-3:0", [-3, -2, -1]),
        ("7", [7]),
        ("0,10,100", [0, 10, 100]),
        ("0:2,10:12", [0, 1, 10, 11]),
        ("0:1:0.25", [0.0, 0.25, 0.5, 0.75]),
        ("0.5, 1e3", [0.5, 1000.0]),
        ("1e3", [1000]),
    ],
)
def test_parse_positions(spec, expected):
    got = parse_positions(spec)
    assert got == expected and [type(v) for v in got] == [type(v) for v in expected]


def test_parse_positions_has_no_float_drift():
    got = parse_positions("0:1:0.1")
    assert len(got) == 10 and got[-1] == 0.9 and got[3] == 0.3


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("", "positions must be a range"),
        ("a", "got 'a' in 'a'"),
        ("nan", "got 'nan'"),
        ("inf", "got 'inf'"),
        ("0:", "positions range must have an end"),
        ("0:5:0", "positions step must not be 0"),
        ("5:0", "positions range '5:0' is empty"),
        ("1:2:3:4", "positions range must be 'a:b' or 'a:b:step'"),
        ("0:1e9", f"positions must hold at most {MAX_ROWS} values"),
    ],
)
def test_parse_positions_bad(spec, match):
    with pytest.raises(posenc.PosEncError, match=match):
        parse_positions(spec)


# --- bad arguments: one line on stderr, exit code 2 -----------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["table", "sinusoidal", "--dim", "0"], "dim must be >= 1, got 0"),
        (["table", "sinusoidal", "--dim", "x"], "Invalid value for '--dim'"),
        (
            ["table", "sinusoidal", "--layout", "diagonal"],
            "layout must be one of 'interleaved', 'half', 'flax', got 'diagonal'",
        ),
        (
            ["table", "sinusoidal", "--order", "cs"],
            "order must be one of 'sin_cos', 'cos_sin', got 'cs'",
        ),
        (
            ["table", "sinusoidal", "--layout", "flax", "--dim", "2"],
            "dim must be >= 4 for layout='flax' (rates spaced over dim // 2 - 1 steps), got 2",
        ),
        (["table", "sinusoidal", "--base", "1"], "base must be > 1.0, got 1.0"),
        (["table", "sinusoidal", "--base", "ten"], "Invalid value for '--base'"),
        (["table", "sinusoidal", "--positions", "0:x"], "positions must be plain numbers"),
        (["table", "sinusoidal", "--positions", "3:1"], "is empty"),
        (
            ["table", "sinusoidal", "--format", "xml"],
            "format must be one of 'text', 'csv', 'json', got 'xml'",
        ),
        (["table", "sinusoidal", "--digits", "-1"], "digits must be >= 0, got -1"),
        (
            ["table", "sinusoidal", "-d", "4", "--channels", "3:5"],
            r"channels must be integers in [0, dim) = [0, 4)",
        ),
        (
            ["table", "sinusoidal", "--normalize", "length"],
            "--normalize applies to index, not 'sinusoidal'",
        ),
        (["table", "index", "--layout", "half"], "--layout applies to sinusoidal, not 'index'"),
        (["table", "index", "--length", "4"], "--length applies only with --normalize length"),
        (
            ["table", "index", "--normalize", "max"],
            "--normalize must be one of 'length', got 'max'",
        ),
        (["table", "learned"], "'learned' has no fixed table (its table is trained weights"),
        (["table", "none"], "'none' has no fixed table (it adds nothing)"),
        (["table", "alibi"], "'alibi' has no fixed table (it is a bias encoding"),
        (["table", "rope"], "'rope' has no fixed table (it is a rotary encoding"),
        (["table", "wavelet"], "encoding must be one of 'sinusoidal', 'index', got 'wavelet'"),
        (["table"], "Missing argument 'encoding'"),
        (["table", "sinusoidal", "--colour"], "No such option: --colour"),
        (["table", "sinusoidal", "extra"], "Got unexpected extra argument"),
        (["tabel"], "No such command 'tabel'"),
        (
            ["table", "sinusoidal", "--dim", "200000", "--positions", "0:2"],
            "--dim: the text format shows at most 4096 channels, got 200000",
        ),
        (
            ["table", "sinusoidal", "-d", "8192", "-p", "0:2", "--channels", "0:5000"],
            "--channels: the text format shows at most 4096 channels, got 5000",
        ),
        (
            ["table", "sinusoidal", "--dim", "8", "--positions", "0:40000"],
            "the text format shows at most 200000 values, got 40000 positions x 8 channels",
        ),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(capsys, args, message):
    code, out, err = run(capsys, *args)
    assert code == 2
    assert out == ""
    assert err.startswith("posenc: error: ") and err.count("\n") == 1
    assert message in err


def test_a_large_table_streams_as_csv(capsys):
    """The text format's limits are the layout's: csv prints the same table."""
    code, out, _ = run(
        capsys, "table", "sinusoidal", "--dim", "8", "--positions", "0:40000", "--format", "csv"
    )
    assert code == 0 and len(out.splitlines()) == 40001


def test_no_arguments_shows_help_and_exits_2(capsys):
    code, out, _ = run(capsys)
    assert code == 2 and "table" in out


# --- the installed commands --------------------------------------------------------------


def test_python_dash_m_posenc():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "posenc",
            "table",
            "sinusoidal",
            "--dim",
            "4",
            "--positions",
            "0:6",
            "--format",
            "csv",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.reader(io.StringIO(proc.stdout)))[1:]
    np.testing.assert_allclose(
        [[float(v) for v in r[1:]] for r in rows],
        reference.sinusoidal_table(np.arange(6), 4),
        atol=1e-12,
    )


def test_console_script_error_has_no_traceback():
    proc = console_script("table", "sinusoidal", "--layout", "diagonal")
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr == "posenc: error: --layout must be one of 'interleaved', 'half', 'flax', "
        "got 'diagonal'\n"
    )
