"""``posenc compare``: a study's comparisons read again from its results.json (a record of
this release or an earlier one), on all its seeds or some, printed, as JSON, or written
back; a file that is not a study's results is one line, exit code 2."""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

import pytest

from posenc.cli import main

from ._results import tiny_results, write_tiny_results


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(["compare", *argv])
    out, err = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 0), out, err


def test_a_record_without_comparisons_gets_each_label_against_the_first(tmp_path, capsys):
    path = write_tiny_results(tmp_path / "results.json")
    code, out, err = _run(capsys, str(path), "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["study"] is None and record["verdict"]["status"] == "no claim"
    rows = {(r["a"], r["b"], r["length"]): r["verdict"] for r in record["rows"]}
    assert rows == {
        ("none", "rope", 8): "worse",  # above RoPE in every seed, beyond the spread
        ("none", "rope", 16): "level",
        ("alibi", "rope", 8): "level",  # the seeds overlap
        ("alibi", "rope", 16): "better",
    }
    assert json.loads(path.read_text()) == tiny_results()  # without --write, untouched


def test_the_table_and_the_folder(tmp_path, capsys):
    write_tiny_results(tmp_path / "results.json")
    code, out, err = _run(capsys, str(tmp_path))  # the folder holding results.json
    assert code == 0, err
    assert "comparisons over 3 seeds (95% t interval)" in out
    assert "NoPE above RoPE at L" in " ".join(out.split())


def test_seeds_select_and_write_makes_the_record_again(tmp_path, capsys):
    path = write_tiny_results(tmp_path / "results.json")
    code, _, err = _run(capsys, str(path), "--seeds", "0,2", "--write", "--study", "prope")
    assert code == 0, err
    data = json.loads(path.read_text())
    if importlib.util.find_spec("matplotlib") is not None:  # the study folder's figure
        assert (tmp_path / "lengthgen.png").read_bytes()[:4] == b"\x89PNG"
    assert data["seeds"] == [0, 2] and {r["seed"] for r in data["runs"]} == {0, 2}
    assert data["summary"]["rope"]["8"]["ppl"] == {"mean": 6.05, "min": 6.0, "max": 6.1}
    comp = data["comparisons"]
    assert comp["study"] == "prope"
    # prope compares 0.75-RoPE, RoPE, 0.25-RoPE and NoPE pairwise: no pair of it is here
    assert comp["verdict"]["status"] == "not tested" and comp["rows"] == []
    assert comp["verdict"]["untested"] == [
        "0.75-RoPE against RoPE",
        "RoPE against 0.25-RoPE",
        "0.25-RoPE against NoPE",
    ]
    # the study recorded is the one read next time
    code, out, _ = _run(capsys, str(path), "--json")
    assert json.loads(out)["study"] == "prope"


def test_a_study_run_records_its_comparisons(tmp_path, capsys):
    out_dir = tmp_path / "out"
    argv = [
        "lengthgen", "--out", str(out_dir), "--quiet", "--study", "counting", "--steps", "2",
        "--seeds", "0,1", "--dim", "16", "--heads", "2", "--eval-lens", "64,128",
        "--encodings", "cope,t5", "--no-plot", "--eval-examples", "4",
    ]  # fmt: skip
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code in (0, None), capsys.readouterr().err
    data = json.loads((out_dir / "results.json").read_text())
    comp = data["comparisons"]
    assert comp["study"] == "counting"
    assert [(r["a"], r["b"], r["length"], r["expect"]) for r in comp["rows"]] == [
        ("cope", "t5", 64, "better"),
        ("cope", "t5", 128, None),
    ]
    for row in comp["rows"]:
        a = [
            100 * (1 - r["eval"][str(row["length"])]["accuracy"])
            for r in data["runs"]
            if r["encoding"] == "cope"
        ]
        assert row["a_values"] == pytest.approx(a) and row["seeds"] == [0, 1]
    assert "T5 against sinusoidal" in comp["verdict"]["untested"]
    # read again, the same record
    capsys.readouterr()
    code, out, _ = _run(capsys, str(out_dir), "--json")
    assert code == 0 and json.loads(out) == comp


def _mutated(data: dict[str, Any], where: str, value: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(data))
    *path, last = where.split(".")
    node: Any = data
    for key in path:
        node = node[int(key)] if isinstance(node, list) else node[key]
    key: Any = int(last) if isinstance(node, list) else last
    if value is _DROP:
        del node[key]
    else:
        node[key] = value
    return data


_DROP = object()


@pytest.mark.parametrize(
    ("where", "value", "named"),
    [
        ("runs", _DROP, "runs must be a non-empty list"),
        ("runs", [], "runs must be a non-empty list"),
        ("task", 3, "task must be a string"),
        ("metric", "bleu", "metric must be 'ppl' or 'accuracy'"),
        ("train_len", 0, "train_len must be an integer >= 1"),
        ("train_len", True, "train_len must be an integer >= 1"),
        ("eval_lens", [8, "16"], "eval_lens must be a non-empty list of integers"),
        ("runs.0", "rope", "runs[0] must be an object"),
        ("runs.0.encoding", "", "runs[0]['encoding'] must be a run label"),
        ("runs.1.seed", 1.5, "runs[1]['seed'] must be an integer"),
        ("runs.0.eval", [], "runs[0]['eval'] must be an object"),
        ("runs.0.eval.8", 7, "runs[0]['eval']['8'] must be an object"),
        ("runs.0.eval.8.ppl", "6.0", "runs[0]['eval']['8']['ppl'] must be a number"),
        ("runs.0.eval.8.splits", 1, "runs[0]['eval']['8']['splits'] must be an object"),
        ("runs.1.seed", 0, "runs must hold each (encoding, seed) once"),
        ("comparisons", {"study": 5}, "comparisons.study must be a study name"),
        ("comparisons", {"study": "sorting"}, "study must be one of counting"),
    ],
)
def test_a_record_that_is_not_a_study_is_one_line(tmp_path, capsys, where, value, named):
    path = write_tiny_results(tmp_path / "results.json", _mutated(tiny_results(), where, value))
    code, _, err = _run(capsys, str(path))
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("posenc: error: ") and named in err, err


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (b"{", "is not valid JSON"),
        (b"\xff\xfe", "is not UTF-8 text"),
        (b"[1, 2]", "must be a JSON object (a results.json of posenc lengthgen)"),
        (b"[" * 100_000 + b"]" * 100_000, "nests JSON arrays or objects too deep"),
        (b"1" * 5000, "holds an integer of over 4300 digits"),
    ],
    ids=["truncated", "not-utf8", "a-list", "deep", "digits"],
)
def test_a_file_that_is_not_json_is_one_line(tmp_path, capsys, content, named):
    path = tmp_path / "results.json"
    path.write_bytes(content)
    code, _, err = _run(capsys, str(path))
    assert code == 2 and named in err and err.count("\n") == 1, err


def test_missing_files_fifos_and_unknown_seeds(tmp_path, capsys):
    code, _, err = _run(capsys, str(tmp_path / "nowhere.json"))
    assert code == 2 and "does not exist" in err
    code, _, err = _run(capsys, str(tmp_path))  # a folder without results.json
    assert code == 2 and "does not exist" in err
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    code, _, err = _run(capsys, str(fifo))
    assert code == 2 and "must be a regular file, got a FIFO" in err
    path = write_tiny_results(tmp_path / "results.json")
    code, _, err = _run(capsys, str(path), "--seeds", "0,7")
    assert code == 2 and "--seeds must be seeds of the results (0, 1, 2), got 7" in err
    for bad in ("0,,1", "0,0", "x"):
        code, _, err = _run(capsys, str(path), "--seeds", bad)
        assert code == 2 and err.startswith("posenc: error: --seeds"), err
    code, _, err = _run(capsys, str(path), "--study", "sorting")
    assert code == 2 and "--study must be one of" in err


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path, capsys, monkeypatch):
    import posenc.experiments.results as results

    monkeypatch.setattr(results, "RESULTS_MAX_BYTES", 100)
    path = write_tiny_results(tmp_path / "results.json")
    code, _, err = _run(capsys, str(path))
    assert code == 2 and "more than the 100 bytes it can be here" in err


def test_write_goes_back_into_the_file_read(tmp_path, capsys):
    path = write_tiny_results(tmp_path / "old-results.json")
    code, out, err = _run(capsys, str(path), "--write")
    assert code == 0, err
    assert f"wrote {path}" in out
    assert "comparisons" in json.loads(path.read_text())
    assert not (tmp_path / "results.json").exists() and not (tmp_path / "lengthgen.png").exists()


def test_non_finite_numbers_in_a_file_are_left_out_and_written_as_null(tmp_path, capsys):
    """json reads NaN and Infinity: they never reach an interval, and --write keeps the
    file standard JSON."""
    text = json.dumps(tiny_results()).replace('"ppl": 6.2}', '"ppl": NaN}', 1)
    path = tmp_path / "results.json"
    path.write_text(text.replace('"ppl": 8.3}', '"ppl": Infinity}', 1))
    code, out, err = _run(capsys, str(path), "--json", "--write")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    at_l = next(r for r in rows if (r["a"], r["length"]) == ("none", 8))
    assert at_l["seeds"] == [0, 2]  # seed 1: RoPE's NaN and NoPE's infinity left out
    written = path.read_text()
    assert "NaN" not in written and "Infinity" not in written
    json.loads(written, parse_constant=lambda c: pytest.fail(f"{c} in the file"))
