"""``posenc plot``: every kind writes the image it says; bad input is one line and exit 2."""

from __future__ import annotations

import errno
import os
import sys

import pytest
from PIL import Image

from ._command import run

KINDS = [
    ("table", ["-e", "sinusoidal", "--positions", "0:32"]),
    ("table", ["-e", "rope", "--param", "head_dim=16"]),
    ("similarity", ["-e", "rope", "--positions", "0:24"]),
    ("decay", ["-e", "sinusoidal", "-e", "alibi", "--max-distance", "16"]),
    ("bias", ["-e", "t5", "--param", "num_heads=2", "--positions", "0:12"]),
    ("clock", ["-e", "xpos", "--positions", "0:4"]),
]


@pytest.mark.parametrize(("kind", "args"), KINDS, ids=[f"{k}-{a[1]}" for k, a in KINDS])
def test_plot_writes_a_png_of_the_requested_size(capsys, tmp_path, kind, args):
    out = tmp_path / f"{kind}.png"
    code, stdout, err = run(
        capsys,
        "plot",
        kind,
        *args,
        "--out",
        str(out),
        "--width",
        "5",
        "--height",
        "3",
        "--dpi",
        "40",
    )
    assert (code, err) == (0, "")
    assert stdout.strip() == f"wrote {out}"
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size == (200, 120)


def test_plot_writes_svg(capsys, tmp_path):
    out = tmp_path / "t.svg"
    code, _, _ = run(capsys, "plot", "table", "-e", "index", "--out", str(out))
    assert code == 0 and "<svg" in out.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["table", "-e", "nosuch", "-o", "{tmp}/x.png"], "name must be one of"),
        (["table", "-e", "sinusoidal", "-o", "{tmp}/x.jpg"], "--out must end in .png or .svg"),
        (["table", "-e", "sinusoidal", "-o", "{tmp}/missing/x.png"], "--out folder does not exist"),
        (["table", "-e", "sinusoidal", "-o", "{tmp}"], "--out must end in"),
        (["table", "-e", "sinusoidal", "-p", "5:5", "-o", "{tmp}/x.png"], "is empty"),
        (["similarity", "-e", "alibi", "-o", "{tmp}/x.png"], "similarity needs an additive"),
        (["bias", "-e", "rope", "-o", "{tmp}/x.png"], "must be a bias encoding"),
        (["table", "-e", "rope", "--param", "head_dim", "-o", "{tmp}/x.png"], "KEY=VALUE"),
        (["table", "-e", "rope", "--param", "nope=1", "-o", "{tmp}/x.png"], "cannot build 'rope'"),
        (
            ["decay", "-e", "sinusoidal", "--max-distance", "0", "-o", "{tmp}/x.png"],
            "--max-distance must be >= 1, got 0",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, args, message):
    code, out, err = run(capsys, "plot", *(a.format(tmp=tmp_path) for a in args))
    assert code == 2 and out == ""
    assert err.startswith("posenc: error: ") and err.count("\n") == 1, err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "x.png").exists()


def test_an_out_that_cannot_be_written_is_one_line_naming_out(capsys):
    """/proc takes no new file: one line naming --out, exit code 2 (as root, where the
    folder passes the permission check and the write itself fails); elsewhere the folder
    is not writable, the environment's refusal: exit code 1."""
    code, out, err = run(capsys, "plot", "table", "-e", "sinusoidal", "-o", "/proc/posenc-t.png")
    assert code == (2 if os.geteuid() == 0 else 1) and out == ""
    assert err.startswith("posenc: error: --out ") and err.count("\n") == 1, err
    assert "'/proc/posenc-t.png'" in err and "Traceback" not in err


@pytest.mark.parametrize("name", ["x" * 300 + ".png", "x" * 250 + ".png"], ids=["300", "250"])
def test_a_name_the_system_refuses_is_one_line_exit_2(capsys, tmp_path, name):
    """A name over the file system's 255 bytes: one line naming --out, exit code 2; one of
    250 (the temporary file beside it is named short) is written."""
    out_file = tmp_path / name
    code, out, err = run(capsys, "plot", "table", "-e", "sinusoidal", "-o", str(out_file))
    if len(name) > 255:
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith(f"posenc: error: --out {str(out_file)!r} cannot be ")
        assert "(File name too long)" in err
    else:
        assert code == 0 and out_file.exists(), err
    assert [p.name for p in tmp_path.iterdir()] == ([] if len(name) > 255 else [name])


def test_a_failed_write_is_one_line_exit_2_and_leaves_nothing(capsys, tmp_path, monkeypatch):
    """Any OSError of the write itself (here the rename across devices) is one line naming
    --out, exit code 2, and the temporary file is removed."""

    def cross_device(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "replace", cross_device)
    out_file = tmp_path / "x.png"
    code, out, err = run(capsys, "plot", "table", "-e", "sinusoidal", "-o", str(out_file))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err == (
        f"posenc: error: --out {str(out_file)!r} cannot be written (Invalid cross-device link)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_written_file_replaces_an_older_one_whole(capsys, tmp_path):
    out_file = tmp_path / "x.png"
    out_file.write_bytes(b"old")
    code, out, err = run(capsys, "plot", "table", "-e", "sinusoidal", "-o", str(out_file))
    assert code == 0 and out == f"wrote {out_file}\n", err
    assert out_file.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["x.png"]


def test_missing_matplotlib_is_one_line_naming_the_extra(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if absent
    code, out, err = run(capsys, "plot", "table", "-e", "sinusoidal", "-o", str(tmp_path / "x.png"))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "pip install 'posenc[plot]'" in err
