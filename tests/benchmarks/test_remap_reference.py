"""``benchmarks/remap_reference.py``: the parts that run without the references (argument
parsing, the venv stamp, the maps' first moved row, the comparisons and their table)."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "remap_reference.py"
_spec = importlib.util.spec_from_file_location("posenc_benchmark_remap_reference", PATH)
assert _spec is not None and _spec.loader is not None
rr: Any = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = rr  # its dataclasses look their module up
_spec.loader.exec_module(rr)


def test_parse_args_reads_both_checkouts(tmp_path: Path) -> None:
    args = rr.parse_args(["--longlm", str(tmp_path), "--string", str(tmp_path), "--reuse"])
    assert (args.longlm, args.string, args.reuse, args.reference_only) == (
        tmp_path,
        tmp_path,
        True,
        False,
    )
    assert args.out == rr.RESULTS / "remap_reference.json"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--longlm", "."], "--string"),
        (["--longlm", "/no/such/folder", "--string", "."], "--longlm /no/such/folder is not"),
    ],
    ids=["missing --string", "not a folder"],
)
def test_parse_args_refuses(argv: list[str], message: str, capsys: Any) -> None:
    with pytest.raises(SystemExit):
        rr.parse_args(argv)
    assert message in capsys.readouterr().err


def test_checkout_files_hashes_what_runs_and_names_the_flag(tmp_path: Path) -> None:
    (tmp_path / "string_for_llama.py").write_text("x = 1\n")
    assert rr.checkout_files("string", tmp_path) == {
        "string_for_llama.py": hashlib.sha256(b"x = 1\n").hexdigest()
    }
    with pytest.raises(SystemExit, match=r"--longlm .*SelfExtend\.py is missing.*cdbbb061"):
        rr.checkout_files("longlm", tmp_path)


def test_ensure_venv_keeps_a_venv_whose_stamp_matches(tmp_path: Path, monkeypatch: Any) -> None:
    folder = tmp_path / "refvenv-string"
    folder.mkdir()
    wanted = [rr.TORCH, *rr.REFERENCES["string"]["requirements"]]
    (folder / ".posenc-stamp.json").write_text(json.dumps(wanted))

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"ran {args}")

    monkeypatch.setattr(rr.subprocess, "run", never)
    assert rr.ensure_venv("string", cache=tmp_path) == folder / "bin" / "python"


def test_ensure_venv_installs_torch_first(tmp_path: Path, monkeypatch: Any) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(rr.subprocess, "run", lambda cmd, check: calls.append(list(cmd)))
    python = str(tmp_path / "refvenv-longlm" / "bin" / "python")
    log = io.StringIO()
    assert rr.ensure_venv("longlm", cache=tmp_path, log=log) == Path(python)
    pip = [python, "-m", "pip", "install", "-q"]
    assert calls[0][1:] == ["-m", "venv", "--clear", str(tmp_path / "refvenv-longlm")]
    assert calls[1:] == [
        [*pip, "torch==2.13.0"],
        [*pip, "transformers==4.38.2", "safetensors", "numpy"],
    ]
    stamp = json.loads((tmp_path / "refvenv-longlm" / ".posenc-stamp.json").read_text())
    assert stamp == ["torch==2.13.0", "transformers==4.38.2", "safetensors", "numpy"]


@pytest.mark.parametrize(
    "rows, text",
    [([], "none"), ([4], "4"), ([3, 4, 5, 9], "3-5, 9"), ([9, 1, 2], "1-2, 9")],
    ids=["empty", "one", "runs", "unsorted"],
)
def test_row_ranges(rows: list[int], text: str) -> None:
    assert rr.row_ranges(rows) == text


def test_compare_reports_rows_and_both_sides_of_the_line() -> None:
    ours = np.zeros((5, 3), dtype=np.float32)
    theirs = ours.copy()
    theirs[1, 2] = 5e-5  # below the tolerance
    theirs[3, 0] = -0.5
    theirs[4, 1] = 2.0
    got = rr.compare(theirs, ours, expect=(3, 5), tol=1e-4)
    assert got == {
        "max_abs": 2.0,
        "max_abs_expected_equal": float(np.float32(5e-5)),
        "max_abs_expected_different": 2.0,
        "rows_differing": [3, 4],
        "rows": 5,
        "per_row_max_abs": [0.0, float(np.float32(5e-5)), 0.0, 0.5, 2.0],
    }
    with pytest.raises(ValueError, match="shapes differ"):
        rr.compare(theirs, ours[:4])


@pytest.mark.parametrize(
    "differing, expect, exact, ok",
    [
        ([], None, True, True),
        ([2], None, True, False),
        ([3, 4], (3, 5), True, True),
        ([3], (3, 5), True, False),
        ([3, 4], (3, 5), False, True),
        ([3], (3, 5), False, True),
        ([4], (3, 5), False, False),
        ([3, 5], (3, 5), False, False),
        ([], (3, 5), False, False),
    ],
    ids=[
        "equal",
        "equal, one differs",
        "exact range",
        "exact range, one missing",
        "within, all",
        "within, first only",
        "within, first missing",
        "within, one outside",
        "within, none",
    ],
)
def test_verdict(differing: list[int], expect: Any, exact: bool, ok: bool) -> None:
    assert rr.verdict(differing, expect, exact) is ok


@given(group=st.integers(1, 8), window=st.integers(1, 24))
def test_self_extend_first_moved_row(group: int, window: int) -> None:
    """At ``i = W``, ``j = 0`` the grouped offset is ``W // G + W - W / G``: ``W`` exactly when
    G divides W (so row W is unmoved and W + 1 is the first moved row); never moved at G = 1."""
    spec = {"type": "self_extend", "group_size": group, "neighbor_window": window}
    case = rr.Case("c", "longlm", spec, 1)
    want = None if group == 1 else window + 1 if window % group == 0 else window
    assert case.first_moved_row(3 * window + 2) == want


@given(st.data())
def test_string_first_moved_row_is_the_shift(data: Any) -> None:
    shift = data.draw(st.integers(1, 40))
    local = data.draw(st.integers(0, shift - 1))
    case = rr.Case("c", "string", {"type": "string", "shift": shift, "local_window": local}, 1)
    assert case.first_moved_row(shift + 3) == shift
    assert case.first_moved_row(shift) is None
    assert case.relative(shift + 2, 1) == shift + 1 - shift + local


def test_comparisons_of_the_default_cases() -> None:
    got = [(c.reference, c.theirs, c.ours, c.expect, c.exact) for c in rr.comparisons()]
    g4, g3, s = "self_extend G=4 W=32", "self_extend G=3 W=32", "string S=32 W=8"
    assert got == [
        ("longlm", "plain", "posenc:plain", None, True),
        ("string", "plain", "posenc:plain", None, True),
        ("longlm", f"{g4}/prefill", f"posenc:{g4}/prefill", None, True),
        ("longlm", f"{g4}/decode", f"posenc:{g4}/decode", None, True),
        ("longlm", f"{g4}/prefill", "plain", (33, 96), True),
        ("longlm", f"{g3}/prefill", f"posenc:{g3}/prefill", None, True),
        ("longlm", f"{g3}/decode", f"posenc:{g3}/decode", None, True),
        ("longlm", f"{g3}/prefill", "plain", (32, 96), True),
        ("string", f"{s}/factor1/prefill", f"posenc:{s}/prefill", (32, 96), True),
        ("string", f"{s}/factor1/decode/1 layer", f"posenc:{s}/decode/1 layer", (32, 33), True),
        ("string", f"{s}/factor1/decode", f"posenc:{s}/decode", (32, 96), False),
        ("string", f"{s}/shipped/prefill", f"posenc:{s}/prefill", (1, 96), True),
        ("string", f"{s}/factor1/decode/1 layer", "plain/1 layer", (32, 96), True),
    ]


def test_evaluate_and_table() -> None:
    rows = [
        rr.Comparison("longlm", "m", "a", "posenc:a", None, "same"),
        rr.Comparison("longlm", "m", "b", "a", (1, 3), "control"),
    ]
    a = np.zeros((3, 2), dtype=np.float32)
    b = a.copy()
    b[1:, 0] = 1.5
    logits = {"longlm": {"a": a, "b": b}, "posenc": {"a": a + np.float32(2e-5)}}
    results = rr.evaluate(rows, logits)
    assert [(r["rows_differing"], r["pass"]) for r in results] == [([], True), ([1, 2], True)]
    assert rr.table(results).splitlines() == [
        "| reference | case | compared | rows differing | expected | max abs diff, rows "
        "expected equal | max abs diff, rows expected to differ | verdict |",
        "| --- | --- | --- | --- | --- | ---: | ---: | --- |",
        "| longlm | m | same | none (of 3) | none | 2.00e-05 |  | PASS |",
        "| longlm | m | control | 1-2 (of 3) | 1-2 | 0.00e+00 | 1.50e+00 | PASS |",
    ]
