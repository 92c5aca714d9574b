"""``posenc extend``'s answer, names, page and memory without a model: better / level by
``experiments.comparisons``' rule paired by document, the scaling names from the rotary
registry, every file of the page written atomically, and the peak memory read by psutil."""

from __future__ import annotations

import os
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from posenc.experiments.comparisons import paired_verdict
from posenc.extend import measure
from posenc.extend.answer import RULE, answer, compare, paired
from posenc.extend.settings import (
    CONFIG,
    FACTOR_SCALINGS,
    NONE,
    SCALING_NAMES,
    UNSCALED,
    ExtendSettings,
)
from posenc.rotary.frequencies import SCALINGS

YARN = {"ppl_by_document": {"a.py": 5.4, "b.py": 5.1, "c.py": 6.0}}
NTK = {"ppl_by_document": {"a.py": 5.5, "b.py": 5.0, "c.py": 6.1}}
LINEAR = {"ppl_by_document": {"a.py": 20.1, "b.py": 19.0, "c.py": 22.3}}
DYNAMIC = {"ppl_by_document": {"a.py": 5.61, "b.py": 5.26, "c.py": 6.04}}
ONE = {"ppl_by_document": {"a.py": 5.0}}
HALF = {"ppl_by_document": {"a.py": 2.5}}


# --- better / level: the comparisons' rule, paired by document ------------------------------


@pytest.mark.parametrize(
    ("a", "b", "verdict"),
    [
        (YARN, NTK, "level"),  # lower on two documents of three
        (YARN, LINEAR, "better"),
        (LINEAR, YARN, "worse"),
        (YARN, DYNAMIC, "level"),  # lower on every document, but the spread holds 0
        (HALF, ONE, "level"),  # one document: no interval, whatever the margin
        (ONE, {"ppl_by_document": {"b.py": 9.0}}, "level"),  # no document in common
    ],
    ids=["mixed", "clearly-lower", "clearly-higher", "lower-everywhere-spread", "one", "none"],
)
def test_compare_is_the_paired_rule(a: dict, b: dict, verdict: str) -> None:
    assert compare(a, b) == verdict


def test_paired_holds_the_differences_by_document_and_their_interval() -> None:
    got = paired(YARN, LINEAR)
    differences = [5.4 - 20.1, 5.1 - 19.0, 6.0 - 22.3]
    mean, interval, verdict = paired_verdict(differences)
    assert got == {
        "documents": ["a.py", "b.py", "c.py"],
        "differences": differences,
        "mean": mean,
        "interval": interval,
        "verdict": verdict,
    }
    assert verdict == "better" and interval is not None and interval[1] < 0


def test_no_document_in_common_has_no_mean() -> None:
    assert paired(ONE, {"ppl_by_document": {}}) == {
        "documents": [],
        "differences": [],
        "mean": None,
        "interval": None,
        "verdict": "level",
    }


def _unit(scaling: str, length: int, factor: float, docs: dict[str, float]) -> dict[str, Any]:
    return {
        "key": f"{scaling}-{length}-{factor:g}",
        "scaling": scaling,
        "factor": factor,
        "length": length,
        "ppl": sum(docs.values()) / len(docs),
        "ppl_last_quarter": max(docs.values()),
        "passkey_accuracy": 0.5,
        "seconds": 1.0,
        "peak_bytes": 2**30,
        "same_as": None,
        "ppl_by_document": docs,
        "by_bucket": [
            {"start": 0, "stop": length // 2, "ppl": 3.0},
            {"start": length // 2, "stop": length, "ppl": 4.0},
        ],
        "passkey": [{"depth": 0.5, "trials": 2, "hits": 1}],
    }


def _records() -> list[dict[str, Any]]:
    return [
        _unit("none", 512, 1.0, {"a": 5.0, "b": 6.0, "c": 7.0}),
        _unit("yarn", 512, 2.0, {"a": 5.2, "b": 6.3, "c": 7.1}),
        _unit("ntk", 512, 2.0, {"a": 5.1, "b": 6.1, "c": 7.2}),
        _unit("none", 1024, 1.0, {"a": 20.0, "b": 25.0, "c": 30.0}),
        _unit("yarn", 1024, 2.0, {"a": 5.4, "b": 5.1, "c": 6.0}),
        _unit("ntk", 1024, 2.0, {"a": 5.5, "b": 5.0, "c": 6.1}),
    ]


def test_the_answer_per_length_with_its_verdicts_intervals_and_cost() -> None:
    records = _records()
    r = {x["key"]: x for x in records}
    got = answer({"records": records, "trained_context": 512})
    vs = {k: paired(r["yarn-1024-2"], r[k]) for k in ("ntk-1024-2", "none-1024-1")}
    costs = {k: paired(r[k], r["none-512-1"]) for k in ("yarn-512-2", "ntk-512-2")}
    assert got["per_length"] == [
        {
            "length": 512,
            "best": "none",
            "factor": 1.0,
            "ppl": 6.0,
            "passkey_accuracy": 0.5,
            "level_with_best": ["none"],
            "verdicts": {},
            "intervals": {},
        },
        {
            "length": 1024,
            "best": "yarn",
            "factor": 2.0,
            "ppl": r["yarn-1024-2"]["ppl"],
            "passkey_accuracy": 0.5,
            "level_with_best": ["yarn", "ntk"],
            "verdicts": {k: v["verdict"] for k, v in vs.items()},
            "intervals": {k: v["interval"] for k, v in vs.items()},
        },
    ]
    assert got["per_length"][1]["verdicts"] == {"ntk-1024-2": "level", "none-1024-1": "better"}
    assert got["cost_at_L"] == [
        {
            "scaling": name,
            "factor": 2.0,
            "ppl": r[f"{name}-512-2"]["ppl"],
            "ppl_none": 6.0,
            "verdict": costs[f"{name}-512-2"]["verdict"],
            "interval": costs[f"{name}-512-2"]["interval"],
        }
        for name in ("yarn", "ntk")
    ]
    assert got["sentence"] == (
        "Trained at 512 tokens: at 512 tokens use none (ppl 6); at 1024 tokens use yarn "
        "(factor 2), level with ntk (ppl 5.5)."
    )


# --- the scaling names: the registry's, beside extend's own -----------------------------------


def test_the_names_are_the_registrys_factor_scalings_between_none_and_config() -> None:
    assert FACTOR_SCALINGS == ("linear", "ntk", "dynamic", "yarn")
    assert all(name in SCALINGS for name in FACTOR_SCALINGS)
    assert SCALING_NAMES == (NONE, *FACTOR_SCALINGS, CONFIG) == ("none", *FACTOR_SCALINGS, "config")
    assert UNSCALED == ("none", "config")
    assert ExtendSettings.scalings == SCALING_NAMES


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("none", None),
        ("linear", {"type": "linear", "factor": 2.0}),
        ("ntk", {"type": "ntk", "factor": 2.0}),
        ("dynamic", {"type": "dynamic", "factor": 2.0, "max_position": 512}),
        ("yarn", {"type": "yarn", "factor": 2.0, "original_max_position": 512}),
        ("config", "the model's own"),
    ],
)
def test_scaling_for_sets_the_factor_and_L_where_the_registry_takes_it(
    name: str, expected: Any
) -> None:
    pytest.importorskip("transformers")
    from posenc.extend.model import scaling_for
    from posenc.rotary.frequencies import parse_scaling

    loaded: Any = types.SimpleNamespace(trained=512, configured="the model's own")
    got = scaling_for(name, 2.0, loaded)
    assert got == expected
    if isinstance(got, dict):  # the registry builds it
        assert parse_scaling(got).type == name
    if name not in UNSCALED:
        assert scaling_for(name, 1.0, loaded) is None  # factor 1: no scaling


def test_scaling_for_refuses_a_name_extend_does_not_know() -> None:
    pytest.importorskip("transformers")
    from posenc import PosEncError
    from posenc.extend.model import scaling_for

    loaded: Any = types.SimpleNamespace(trained=512, configured=None)
    with pytest.raises(
        PosEncError,
        match=r"^scaling must be one of none, linear, ntk, dynamic, yarn, config, got 'llama3'$",
    ):
        scaling_for("llama3", 1.0, loaded)


# --- the page: every file written atomically, the rule stated ---------------------------------


def _results() -> dict[str, Any]:
    records = _records()
    results: dict[str, Any] = {
        "lengths": [512, 1024],
        "trained_context": 512,
        "records": records,
        "model": {"name": "tiny", "model_type": "llama", "parameters": 10, "files": {}},
        "settings": {"depths": [0.5], "scalings": ["none", "ntk", "yarn"]},
        "documents": [{"name": n, "tokens": 2000} for n in "abc"],
        "layer_types_scaled": [None],
        "device": "cpu",
        "threads": 1,
        "posenc": "0",
    }
    results["answer"] = answer(results)
    return results


def test_the_page_states_the_rule_and_embeds_its_figures(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from posenc.extend.page import write_page

    paths = write_page(_results(), tmp_path)
    assert paths == [
        tmp_path / "ppl_by_position.png",
        tmp_path / "passkey.png",
        tmp_path / "index.html",
    ]
    html = paths[2].read_text()
    assert html.count("data:image/png;base64,") == 2
    assert RULE in html and _results()["answer"]["sentence"] in html
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)


@pytest.mark.parametrize("file", ["ppl_by_position.png", "passkey.png", "index.html"])
def test_a_page_killed_mid_write_keeps_each_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file: str
) -> None:
    pytest.importorskip("matplotlib")
    from posenc.extend.page import write_page

    for name in ("ppl_by_position.png", "passkey.png", "index.html"):
        (tmp_path / name).write_bytes(b"the previous run's " + name.encode())
    replace = os.replace

    def killed(src: Any, dst: Any) -> None:
        if Path(dst).name == file:
            raise KeyboardInterrupt  # a kill between the temporary file and its rename
        replace(src, dst)

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_page(_results(), tmp_path)
    assert (tmp_path / file).read_bytes() == b"the previous run's " + file.encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "index.html",
        "passkey.png",
        "ppl_by_position.png",
    ]


# --- memory: psutil's resident set ------------------------------------------------------------


def test_the_peak_resident_memory_sees_an_allocation() -> None:
    psutil = pytest.importorskip("psutil")
    size = 256 * 2**20
    with measure.measured(torch.device("cpu")) as cost:
        block = torch.ones(size // 4, dtype=torch.float32)  # touched: resident
        time.sleep(0.1)  # a few of the sampler's 5 ms ticks while it is held
        del block
    rss = psutil.Process().memory_info().rss
    assert cost.base_bytes > 0 and cost.peak_bytes >= cost.base_bytes + size * 0.9
    assert abs(cost.base_bytes - rss) < 4 * size  # the same measure as psutil's, of this process


def test_available_memory_is_psutils() -> None:
    psutil = pytest.importorskip("psutil")
    got = measure.available_bytes(torch.device("cpu"))
    assert abs(got - psutil.virtual_memory().available) < 2**30
