"""``posenc report --quick``: the files it says it writes, report.json against its schema, the
page's rows and embedded figures, and one-line errors with exit code 2."""

from __future__ import annotations

import base64
import copy
import json
import re
import sys
import types

import pytest
from PIL import Image

from posenc import PosEncError, registry
from posenc._base import AdditiveEncoding
from posenc.cli import main
from posenc.report import LENGTHGEN_SETTINGS, build_report, validate_report

from ._command import run


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One ``posenc report --quick`` run shared by the tests of this file."""
    out = tmp_path_factory.mktemp("report")
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "--out", str(out), "--quick"])
    assert exit_info.value.code == 0
    return out, json.loads((out / "report.json").read_text())


def test_report_writes_what_it_says(quick):
    out, data = quick
    assert (out / "index.html").is_file() and (out / "report.json").is_file()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == sorted(f["file"] for f in data["figures"])
    for record in data["figures"]:
        with Image.open(out / record["file"]) as im:
            assert im.format == "PNG" and im.size == (record["width"], record["height"])


def test_report_json_follows_its_schema(quick):
    _, data = quick
    validate_report(data)
    assert data["settings"]["quick"] is True
    assert [e["name"] for e in data["encodings"]] == registry.names()
    assert [e["error"] for e in data["encodings"]] == [None] * len(registry.names())
    for entry in data["encodings"]:
        assert entry["kind"] == registry.get(entry["name"]).kind
        assert entry["figures"], entry["name"]
        props = entry["properties"]
        assert len(props["boundedness"]["norms"]) == data["settings"]["positions"]
        assert len(props["decay"]["distances"]) == data["settings"]["max_distance"] + 1
    assert data["seconds"]["total"] > 0


def test_report_numbers_are_the_known_answers(quick):
    _, data = quick
    rows = {e["name"]: e["summary"] for e in data["encodings"]}
    assert rows["sinusoidal"]["bounded"] and rows["sinusoidal"]["offset_only"]
    assert rows["rope"]["unique"] and rows["rope"]["shift_residual"] < 1e-5
    assert not rows["index"]["bounded"] and rows["index"]["first_swamping"] == 2.0
    assert not rows["none"]["unique"] and rows["alibi"]["shift_residual"] is None
    demos = data["demonstrations"]
    assert demos["mean_pooling"]["tells_apart"] is False
    assert demos["attention"][0]["permutation_equivariant"] is True


def test_report_runs_the_length_generalization_study(quick):
    _, data = quick
    lg = data["lengthgen"]
    assert lg["status"] == "ok", lg["reason"]
    settings = LENGTHGEN_SETTINGS[True]
    names = [n for n in settings["encodings"] if n in registry.names()]
    seeds = list(settings["seeds"])
    runs = lg["results"]["runs"]
    assert [(r["encoding"], r["seed"]) for r in runs] == [(n, s) for n in names for s in seeds]
    assert lg["results"]["eval_lens"] == list(settings["eval_lens"])
    assert lg["figure"] == "lengthgen.png" and lg["headline"] == "headline.png"
    assert list(lg["results"]["summary"]) == names


def test_quick_study_shows_alibi_flat_and_sinusoidal_and_rope_rising(quick):
    """The promise of --quick, measured: two seeds, every check of the study holds (ALiBi
    within 10% of its perplexity at L up to 8L for each seed, sinusoidal and RoPE >= 1.15x
    on average)."""
    _, data = quick
    lg = data["lengthgen"]
    assert [c["holds"] for c in lg["checks"]] == [True] * 3, lg["checks"]
    longest = str(max(lg["results"]["eval_lens"]))
    assert lg["ratios"]["alibi"][longest]["max"] <= 1.1
    for label in ("sinusoidal", "rope"):
        assert lg["ratios"][label][longest]["mean"] >= 1.15
    comp = lg["comparison"]
    assert comp["sentence"].startswith("Agrees with Press et al.")
    assert [r["encoding"] for r in comp["rows"]] == ["sinusoidal", "rope", "alibi"]
    # the one pair of Press et al.'s order this study has, at each length past L
    assert [(v["a"], v["b"]) for v in comp["verdicts"]] == [("rope", "sinusoidal")] * 3
    assert all(v["verdict"] in ("better", "level", "worse") for v in comp["verdicts"])
    rows = lg["results"]["comparisons"]["rows"]
    assert [r["differences"] for r in rows if r["expect"]] == [
        v["differences"] for v in comp["verdicts"]
    ]


def test_page_leads_with_the_answer(quick):
    out, _ = quick
    page = (out / "index.html").read_text()
    answer, properties = page.index('<section id="answer">'), page.index('id="properties"')
    assert answer < properties < page.index('<section id="lengthgen">')
    head = page[answer:properties]
    assert 'data-file="headline.png"' in head and 'id="ratio-table"' in head
    assert 'id="comparison-sentence"' in head and head.count('<li class="yes">') == 3
    assert 'id="verdict-table"' in head  # Press et al.'s order, pair by pair, over the seeds
    assert head.count("rope against sinusoidal") == 3  # at 2L, 4L and 8L


def test_page_has_a_row_per_encoding_and_embeds_every_figure(quick):
    out, data = quick
    page = (out / "index.html").read_text()
    rows = re.findall(r'<tr class="encoding-row[^"]*" data-encoding="([^"]+)"', page)
    assert rows == registry.names()
    embedded = dict(
        re.findall(r'<img src="data:image/png;base64,([^"]+)"[^>]*data-file="([^"]+)"', page)[i][
            ::-1
        ]
        for i in range(len(data["figures"]))
    )
    assert sorted(embedded) == sorted(f["file"] for f in data["figures"])
    for file, b64 in embedded.items():
        assert base64.b64decode(b64) == (out / file).read_bytes()
    assert 'src="http' not in page and "<script" not in page  # self-contained
    assert 'id="demo-a"' in page and 'id="lengthgen-table"' in page


def test_validate_report_names_the_first_problem(quick):
    _, data = quick
    broken = copy.deepcopy(data)
    del broken["encodings"][0]["summary"]["bounded"]
    with pytest.raises(
        PosEncError,
        match=r"report field encodings\[0\]\['summary'\]\['bounded'\] must be present",
    ):
        validate_report(broken)
    broken = copy.deepcopy(data)
    broken["settings"]["positions"] = "many"
    with pytest.raises(
        PosEncError, match=r"report field settings\['positions'\] must be an integer"
    ):
        validate_report(broken)
    broken = copy.deepcopy(data)
    broken["extra"] = 1
    with pytest.raises(
        PosEncError, match=r"report field extra must be absent \(not a key of report\)"
    ):
        validate_report(broken)


def test_report_says_when_the_experiments_are_absent(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "posenc.experiments.lengthgen", None)  # import fails
    data = build_report(tmp_path, quick=True, encodings=["sinusoidal", "alibi"])
    assert data["lengthgen"]["status"] == "absent"
    assert "not available" in data["lengthgen"]["reason"]
    page = (tmp_path / "index.html").read_text()
    assert 'id="lengthgen-absent"' in page and "not part of this build" in page
    validate_report(json.loads((tmp_path / "report.json").read_text()))


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("{tmp}/file.txt", "--out must be a directory"),
        ("{tmp}/file.txt/sub", "cannot be created (Not a directory)"),
        ("/proc/posenc-report", "cannot be created"),
        ("", "--out must not be empty, got ''"),
        ("  ", "--out must not be empty, got '  '"),
    ],
)
def test_bad_out_is_one_line_and_exit_2(capsys, tmp_path, out, message):
    (tmp_path / "file.txt").write_text("x")
    code, stdout, err = run(capsys, "report", "--out", out.format(tmp=tmp_path), "--quick")
    assert code == 2 and stdout == "" and err.count("\n") == 1
    assert err.startswith("posenc: error: ") and message in err


class _NeedsFoo(AdditiveEncoding):
    """A registered encoding the analysis defaults cannot build (it requires ``foo``)."""

    name = "needs_foo"

    def __init__(self, foo: int) -> None:
        super().__init__()
        self.dim = foo


def _registered(monkeypatch, cls: type) -> None:
    """``cls`` in the registry under its name, from a module of its own, for one test."""
    module = types.ModuleType(f"posenc_test_{cls.name}")
    attribute = cls.__name__.lstrip("_")
    setattr(module, attribute, cls)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(registry._ENTRIES, cls.name, f"{module.__name__}:{attribute}")


def test_an_encoding_that_cannot_be_measured_gets_an_error_row(tmp_path, monkeypatch):
    _registered(monkeypatch, _NeedsFoo)
    data = build_report(tmp_path, quick=True, encodings=["needs_foo", "index"], lengthgen=False)
    validate_report(json.loads((tmp_path / "report.json").read_text()))
    bad, good = data["encodings"]
    assert "needs the argument 'foo'" in bad["error"] and bad["summary"] is None
    assert good["error"] is None and data["lengthgen"]["status"] == "skipped"
    page = (tmp_path / "index.html").read_text()
    assert '<tr class="encoding-row error" data-encoding="needs_foo">' in page
    assert page.count('class="encoding-row') == 2


class _Scripted(AdditiveEncoding):
    """An encoding whose error message is HTML: the page must show it, not run it."""

    name = "scripted"

    def __init__(self) -> None:
        raise PosEncError("<script>alert('x')</script> & <b>bold</b>")


def test_text_in_the_page_is_escaped(tmp_path, monkeypatch):
    _registered(monkeypatch, _Scripted)
    data = build_report(tmp_path, quick=True, encodings=["scripted", "index"], lengthgen=False)
    assert "<script>alert" in data["encodings"][0]["error"]  # the JSON keeps the raw text
    page = (tmp_path / "index.html").read_text()
    assert "<script>alert" not in page and "<b>bold</b>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in page


def test_report_without_matplotlib_names_the_extra(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if absent
    code, out, err = run(capsys, "report", "--out", str(tmp_path), "--quick")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "pip install 'posenc[plot]'" in err


def test_build_report_rejects_bad_encodings(tmp_path):
    with pytest.raises(PosEncError, match="name must be one of"):
        build_report(tmp_path, encodings=["nosuch"])
    with pytest.raises(PosEncError, match="at least one encoding"):
        build_report(tmp_path, encodings=[])
