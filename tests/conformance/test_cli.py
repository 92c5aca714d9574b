"""``posenc vectors`` and ``posenc conformance`` end to end: files written, exit codes 0, 1
and 2, one-line errors, the JSON results."""

from __future__ import annotations

import json
import re
import textwrap

import pytest
from tests.cli._command import run

ADAPTERS = textwrap.dedent(
    """
    import numpy as np
    from posenc import reference
    from posenc.conformance import Adapter

    def good(positions, dim, *, base):
        return reference.sinusoidal_table(positions, dim, base=base).astype(np.float32)

    def concatenated(positions, dim, *, base):  # the tutorial's [sin | cos] halves
        return reference.sinusoidal_table(positions, dim, base=base, layout="half")

    GOOD = Adapter("good", "table", "sinusoidal", good, convention={"layout": "interleaved"})
    BAD = [Adapter("concat", "table", "sinusoidal", concatenated,
                   convention={"layout": "interleaved"})]
    NOT_ADAPTER = 3
    """
)


@pytest.fixture
def adapters(tmp_path):
    path = tmp_path / "my_adapters.py"
    path.write_text(ADAPTERS)
    return path


def test_vectors_then_conformance_passes(capsys, tmp_path, adapters):
    code, out, err = run(capsys, "vectors", "--out", str(tmp_path / "v"), "--cases", "sinusoidal.*")
    assert (code, err) == (0, "")
    assert out.startswith("wrote 18 cases to ")
    code, out, err = run(
        capsys, "conformance", f"{adapters}:GOOD", "--vectors", str(tmp_path / "v")
    )
    assert (code, err) == (0, "")
    assert "6 passed, 0 failed, 0 skipped" in out


def test_a_mismatch_exits_1_with_the_words(capsys, tmp_path, adapters):
    report = tmp_path / "results.json"
    code, out, err = run(
        capsys,
        "conformance",
        f"{adapters}:BAD",
        "--cases",
        "sinusoidal.interleaved.d64@*",
        "--json",
        str(report),
    )
    assert code == 1 and err == ""
    assert "[sin | cos] concatenated where the convention interleaves" in out
    data = json.loads(report.read_text())
    assert data["ok"] is False
    assert [r["deviation"] for r in data["results"]] == [
        "[sin | cos] concatenated where the convention interleaves"
    ] * 2


BAD_INPUT = [
    ("no-colon", ["conformance", "{adapters}"], "SPEC must be 'module:attr'"),
    ("missing-attr", ["conformance", "{adapters}:NOPE"], "'NOPE' not found"),
    ("not-adapter", ["conformance", "{adapters}:NOT_ADAPTER"], "must name an Adapter"),
    ("no-module", ["conformance", "no_such_module_xyz:A"], "module 'no_such_module_xyz' not found"),
    ("no-file", ["conformance", "/nonexistent/x.py:A"], "SPEC must be an existing file"),
    ("bad-cases", ["conformance", "{adapters}:GOOD", "--cases", "zzz*"], "match no case"),
    (
        "bad-vectors",
        ["conformance", "{adapters}:GOOD", "--vectors", "{tmp}"],
        "manifest .* does not exist",
    ),
    (
        "bad-json",
        ["conformance", "{adapters}:GOOD", "--json", "{tmp}/x.txt"],
        "--json must end in .json",
    ),
    ("out-file", ["vectors", "--out", "{adapters}"], "--out must be a directory"),
    ("empty-cases", ["vectors", "--out", "{tmp}/v", "--cases", ""], "--cases must not be empty"),
]


@pytest.mark.parametrize(
    ("argv", "message"), [b[1:] for b in BAD_INPUT], ids=[b[0] for b in BAD_INPUT]
)
def test_bad_input_exits_2_in_one_line(capsys, tmp_path, adapters, argv, message):
    argv = [a.format(adapters=adapters, tmp=tmp_path) for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2, (out, err)
    assert err.startswith("posenc: error: ") and err.count("\n") == 1
    assert re.search(message, err), err
