"""``posenc inspect``: the property table in the terminal, and its JSON."""

from __future__ import annotations

import json

import pytest

from ._command import run


@pytest.mark.parametrize(
    ("name", "verdicts"),
    [
        ("sinusoidal", ["bounded", "unique", "holds", "yes"]),
        ("index", ["grows", "fails", "no"]),
        ("alibi", ["grows", "unique", "yes"]),
        ("none", ["bounded", "collisions"]),
    ],
)
def test_inspect_prints_the_property_table(capsys, name, verdicts):
    code, out, err = run(capsys, "inspect", name, "--length", "96", "--max-distance", "16")
    assert (code, err) == (0, "")
    assert out.lstrip().startswith(name)
    for prop in ("boundedness", "uniqueness", "depends only on k", "decay"):
        assert prop in out
    words = out.split()
    for verdict in verdicts:
        assert verdict in words, (verdict, out)


def test_inspect_json_holds_every_number(capsys):
    code, out, _ = run(
        capsys,
        "inspect",
        "rope",
        "--param",
        "head_dim=16",
        "--length",
        "40",
        "--max-distance",
        "8",
        "--json",
    )
    data = json.loads(out)
    assert code == 0 and data["config"]["head_dim"] == 16
    assert len(data["boundedness"]["norms"]) == 40 and len(data["decay"]["similarity"]) == 9
    assert data["shift"]["linear_map_holds"] is True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["inspect", "nosuch"], "name must be one of"),
        (["inspect", "rope", "--length", "1"], "--length must be >= 2, got 1"),
        (["inspect", "rope", "--max-distance", "0"], "--max-distance must be >= 1, got 0"),
        (["inspect", "rope", "--param", "head_dim=7"], "head_dim"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("posenc: error: ") and message in err
