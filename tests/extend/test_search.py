"""``posenc extend --search``: the per-band factor search on a tiny random Llama.

The seeds against PI's, NTK's and YaRN's own frequencies (and transformers' YaRN); the
candidates monotone, bounded, float32; the same seed the same candidates and scores; a
resumed or interrupted search the uninterrupted one; the budget; the saved state refused
for other settings; the settings' refusals; the ``search`` units measured and exported
(transformers' config, whose model gives the measured logits without posenc).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.extend._tiny import tiny_llama

from posenc import PosEncError
from posenc.extend import measure
from posenc.extend.data import Document
from posenc.extend.model import Loaded, load_model, scaled
from posenc.extend.run import run_extend
from posenc.extend.search import project, run_search, search_scaling, seed_factors
from posenc.extend.search_state import STATE_FILE, validation_document
from posenc.extend.settings import ExtendSettings
from posenc.integrations.transformers import rotary_from_config, unpatch
from posenc.rotary.frequencies import rope_frequencies

CONTEXT = 64  # the tiny model's L: candidates score in milliseconds
TARGET = 2 * CONTEXT
TEXT = (Path(__file__).resolve().parents[2] / "src" / "posenc" / "rotary" / "module.py").read_text()


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("llama"), context=CONTEXT)


@pytest.fixture(scope="module")
def loaded(llama: Path) -> Loaded:
    return load_model(llama, dtype="float32", device="cpu", context=None)


@pytest.fixture(scope="module")
def validation(loaded: Loaded) -> Document:
    return validation_document(loaded.tokenizer, [], TARGET)


def _search(loaded: Loaded, doc: Document, out: Path, **options: Any) -> Any:
    args = {"seed": 0, "minutes": 60.0, "target": TARGET, "length": TARGET, "evaluations": 12}
    return run_search(loaded, doc, out, **{**args, **options})


def _state(out: Path) -> dict[str, Any]:
    return json.loads((out / STATE_FILE).read_text())


def _scored(out: Path) -> list[tuple]:
    """What a search decided: every candidate scored, in order (not its seconds)."""
    return [(c["factors"], c["nll"], c["origin"], c["generation"]) for c in _state(out)["scored"]]


# --- the seeds ---------------------------------------------------------------------------


@pytest.mark.parametrize("factor", [1.5, 2.0, 4.0])
def test_the_seeds_are_pi_ntk_and_yarn_frequency_ratios(factor: float) -> None:
    dim, base, trained = 64, 1e4, 4096
    seeds = seed_factors(dim, base, factor, trained)
    i = np.arange(dim // 2)
    np.testing.assert_allclose(seeds["pi"], np.full(dim // 2, factor), rtol=1e-15)
    np.testing.assert_allclose(seeds["ntk"], factor ** (2 * i / (dim - 2)), rtol=1e-13)
    config = transformers.LlamaConfig(
        hidden_size=dim * 4,
        num_attention_heads=4,
        max_position_embeddings=int(trained * factor),
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": base,
            "factor": factor,
            "original_max_position_embeddings": trained,
        },
    )
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    theirs, _ = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    plain = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    np.testing.assert_allclose(seeds["yarn"], plain / theirs.double().numpy(), rtol=1e-6)


def test_the_first_three_candidates_are_the_seeds_in_float32(
    loaded: Loaded, validation: Document, tmp_path: Path
) -> None:
    _search(loaded, validation, tmp_path, evaluations=3)
    rope = rotary_from_config(loaded.model.config, layer_type=None)
    factor = TARGET / CONTEXT
    plain, _ = rope_frequencies(rope.rotary_dim, base=rope.base)
    specs = {
        "pi": {"type": "linear", "factor": factor},
        "ntk": {"type": "ntk", "factor": factor},
        "yarn": {"type": "yarn", "factor": factor, "original_max_position": CONTEXT},
    }
    scored = _state(tmp_path)["scored"]
    assert [c["origin"] for c in scored] == ["pi", "ntk", "yarn"]
    for candidate, (name, spec) in zip(scored, specs.items()):
        ratio = (plain / rope_frequencies(rope.rotary_dim, base=rope.base, scaling=spec)[0]).numpy()
        expected = ratio.astype(np.float32).astype(np.float64)
        np.testing.assert_array_equal(np.asarray(candidate["factors"]), expected, err_msg=name)


# --- the candidates ----------------------------------------------------------------------

factors_lists = st.lists(st.floats(0.01, 100.0, allow_nan=False), min_size=1, max_size=16)


@settings(max_examples=200, deadline=None)
@given(values=factors_lists, cap=st.floats(1.0, 64.0))
def test_project_gives_a_monotone_bounded_float32_candidate(
    values: list[float], cap: float
) -> None:
    out = project(np.asarray(values), cap)
    assert out.shape == (len(values),)
    assert (np.diff(out) >= 0).all() and out.min() >= 1.0 and out.max() <= cap
    np.testing.assert_array_equal(out, out.astype(np.float32).astype(np.float64))
    np.testing.assert_array_equal(project(out, cap), out)  # a candidate is its own projection


@settings(max_examples=100, deadline=None)
@given(values=factors_lists)
def test_project_keeps_a_candidate_and_pools_a_violation(values: list[float]) -> None:
    ordered = np.sort(np.clip(np.asarray(values), 1.0, 8.0)).astype(np.float32).astype(np.float64)
    np.testing.assert_array_equal(project(ordered, 8.0), ordered)
    if len(values) >= 2:  # two bands out of order meet at their geometric mean
        pooled = project(np.asarray([4.0, 1.0]), 8.0)
        np.testing.assert_array_equal(pooled, np.full(2, float(np.float32(2.0))))


def test_every_candidate_is_monotone_bounded_and_float32(
    loaded: Loaded, validation: Document, tmp_path: Path
) -> None:
    _search(loaded, validation, tmp_path, evaluations=20)
    state = _state(tmp_path)
    cap = 2.0 * TARGET / CONTEXT
    assert state["generation"] >= 2
    for candidate in state["scored"] + state["pending"]:
        f = np.asarray(candidate["factors"])
        assert f.shape == (loaded.head_dim // 2,)
        assert (np.diff(f) >= 0).all() and f.min() >= 1.0 and f.max() <= cap, candidate
        np.testing.assert_array_equal(f, f.astype(np.float32).astype(np.float64))
    keys = [tuple(c["factors"]) for c in state["scored"]]
    assert len(set(keys)) == len(keys)  # no candidate scored twice


def test_a_score_is_the_validation_perplexity_of_its_scaling(
    loaded: Loaded, validation: Document, tmp_path: Path
) -> None:
    result = _search(loaded, validation, tmp_path, evaluations=10)
    model = scaled(loaded, result.scaling)
    try:
        nll = measure.nll_by_position(model, list(validation.ids[:TARGET]))
    finally:
        unpatch(model)
    assert result.ppl == math.exp(float(nll.mean()))
    best = min(c["nll"] for c in _state(tmp_path)["scored"])
    assert result.ppl == math.exp(best) == result.record["best"]["ppl"]
    assert result.record["best_ppl_by_evaluation"][-1] == result.ppl


# --- determinism, resume, budget -----------------------------------------------------------


def test_the_same_seed_gives_the_same_candidates_and_scores(
    loaded: Loaded, validation: Document, tmp_path: Path
) -> None:
    _search(loaded, validation, tmp_path / "a")
    _search(loaded, validation, tmp_path / "b")
    _search(loaded, validation, tmp_path / "c", seed=1)
    assert _scored(tmp_path / "a") == _scored(tmp_path / "b")
    a, c = _scored(tmp_path / "a"), _scored(tmp_path / "c")
    assert a[:3] == c[:3] and a[3:] != c[3:]  # the seeds alike; the children drawn anew


@pytest.mark.parametrize("how", ["stopped", "interrupted"])
def test_a_resumed_search_is_the_uninterrupted_one(
    loaded: Loaded, validation: Document, tmp_path: Path, how: str
) -> None:
    whole = _search(loaded, validation, tmp_path / "whole", evaluations=14)
    part = tmp_path / "part"
    if how == "stopped":
        _search(loaded, validation, part, evaluations=5)
    else:

        def kill(kind: str, info: dict[str, Any]) -> None:
            if info["done"] == 9:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            _search(loaded, validation, part, evaluations=14, on_event=kill)
    resumed = _search(loaded, validation, part, evaluations=14, resume=True)
    assert _scored(part) == _scored(tmp_path / "whole")
    assert resumed.scaling == whole.scaling


def test_the_budget_stops_before_the_next_evaluation_and_a_rerun_goes_on(
    loaded: Loaded, validation: Document, tmp_path: Path
) -> None:
    first = _search(loaded, validation, tmp_path, minutes=1e-9, evaluations=None)
    assert first.record["evaluated"] == 1 and first.record["stopped"] == "budget"
    more = _search(loaded, validation, tmp_path, evaluations=4, resume=True)
    assert more.record["evaluated"] == 4 and more.record["stopped"] == "evaluations"
    again = _search(loaded, validation, tmp_path, evaluations=6)  # no resume: starts over
    assert again.record["evaluated"] == 6 and len(_state(tmp_path)["scored"]) == 6


def test_each_evaluation_is_told_with_the_best_so_far(
    loaded: Loaded, validation: Document, tmp_path: Path
) -> None:
    events: list[tuple[str, dict]] = []
    _search(loaded, validation, tmp_path, on_event=lambda k, i: events.append((k, i)))
    scored = _state(tmp_path)["scored"]
    told, spent, best = [], 0.0, None
    for i, c in enumerate(scored):
        spent += c["seconds"]
        if best is None or c["nll"] < best["nll"]:
            best = c
        told.append(
            (
                "search",
                {
                    "done": i + 1,
                    "nll": c["nll"],
                    "generation": c["generation"],
                    "origin": c["origin"],
                    "seconds": spent,
                    "budget": 3600.0,
                    "evaluations": 12,
                    "best": {"nll": best["nll"], "origin": best["origin"]},
                },
            )
        )
    assert events == told


@pytest.mark.parametrize(("population", "evaluations"), [(4, 4), (4, 5), (8, 3)])
def test_the_record_holds_the_bands_and_the_generations_scored(
    loaded: Loaded, validation: Document, tmp_path: Path, population: int, evaluations: int
) -> None:
    result = _search(loaded, validation, tmp_path, population=population, evaluations=evaluations)
    scored = _state(tmp_path)["scored"]
    assert result.record["generations"] == len({c["generation"] for c in scored})
    assert result.record["generations"] == (1 if evaluations <= population else 2)
    rope = rotary_from_config(loaded.model.config, layer_type=None)
    plain, _ = rope_frequencies(rope.rotary_dim, base=rope.base)
    bands = result.record["bands"]
    np.testing.assert_array_equal(bands["wavelength"], (2 * math.pi / plain).tolist())
    firsts = {c["origin"]: c["factors"] for c in scored[:3]}
    for name in ("pi", "ntk", "yarn"):  # as scored, whether the budget reached them or not
        assert bands[name] == firsts.get(name, bands[name])
        assert len(bands[name]) == rope.rotary_dim // 2


def _tampered(out: Path, change: Any) -> None:
    state = _state(out)
    change(state)
    (out / STATE_FILE).write_text(json.dumps(state))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"seed": 1}, "seed differ"),
        ({"length": CONTEXT + 1}, "length differ"),
        ({"population": 6}, "population differ"),
        ({"target": 3 * CONTEXT}, "target differ"),
    ],
    ids=["seed", "length", "population", "target"],
)
def test_a_state_of_other_settings_is_refused_in_one_line(
    loaded: Loaded, validation: Document, tmp_path: Path, change: dict, named: str
) -> None:
    _search(loaded, validation, tmp_path, evaluations=2)
    with pytest.raises(PosEncError, match=named) as info:
        _search(loaded, validation, tmp_path, evaluations=3, resume=True, **change)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("tamper", "named"),
    [
        (lambda s: s["scored"][0]["factors"].__setitem__(0, 0.5), r"scored\[0\]\['factors'\]\[0\]"),
        (lambda s: s["scored"][1]["factors"].reverse(), "non-decreasing"),
        (lambda s: s["scored"][1]["factors"].__setitem__(0, 1.1), "float32"),
        (lambda s: s["pending"][0].__setitem__("origin", "guess"), "origin"),
        (lambda s: s.__setitem__("extra", 1), "extra"),
        (lambda s: s["scored"][0].__setitem__("nll", "low"), "nll"),
    ],
    ids=["below-1", "decreasing", "not-float32", "origin", "unknown-key", "nll"],
)
def test_a_damaged_state_is_refused_naming_the_field(
    loaded: Loaded, validation: Document, tmp_path: Path, tamper: Any, named: str
) -> None:
    _search(loaded, validation, tmp_path, evaluations=2)  # PI (all equal), then NTK (rising)
    _tampered(tmp_path, tamper)
    with pytest.raises(PosEncError, match=named):
        _search(loaded, validation, tmp_path, evaluations=3, resume=True)


def test_a_state_that_is_not_json_is_refused(
    loaded: Loaded, validation: Document, tmp_path: Path
) -> None:
    (tmp_path / STATE_FILE).write_text("{not json")
    with pytest.raises(PosEncError, match="not JSON"):
        _search(loaded, validation, tmp_path, resume=True)


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"search": 0}, "search must be > 0"),
        ({"search": -1.0}, "search must be > 0"),
        ({"search": math.nan}, "search must be finite"),
        ({"search": math.inf}, "search must be finite"),
        ({"search": "5"}, "search must be a number"),
        ({"search": 1e9}, "search must be <="),
        ({"search": 1.0, "search_length": 1.0}, "search_length must be one of"),
        ({"search": 1.0, "search_length": 0.5}, "search_length must be one of"),
        ({"search": 1.0, "search_length": 1.7}, "search_length must be one of"),
        ({"search": 1.0, "search_length": math.nan}, "search_length must be finite"),
        ({"search_length": 1.5}, "search_length needs search"),
        ({"search_population": 8}, "search_population needs search"),
        ({"search": 1.0, "search_population": 3}, "search_population must be >= 4"),
        ({"search": 1.0, "to": 1.0, "multiples": [1.0]}, "search needs a length past L"),
    ],
    ids=lambda v: str(v) if not isinstance(v, dict) else "-".join(f"{k}={v[k]}" for k in v),
)
def test_bad_search_settings_are_refused_naming_them(
    llama: Path, options: dict, named: str
) -> None:
    with pytest.raises(PosEncError, match=named):
        ExtendSettings.from_options(llama, **{"multiples": [1.0, 1.5], **options})


def test_search_length_defaults_to_the_longest_length(llama: Path) -> None:
    given = ExtendSettings.from_options(llama, to=3.0, search=2.0)
    assert (given.search, given.search_length, given.search_population) == (2.0, 3.0, 8)
    assert ExtendSettings.from_options(llama).search is None


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"length": CONTEXT}, "length must be >="),
        ({"target": CONTEXT}, "target must be >="),
        ({"population": 3}, "population must be >="),
        ({"evaluations": 0}, "evaluations must be >="),
        ({"minutes": 0.0}, "minutes must be > 0"),
        ({"minutes": math.nan}, "minutes must be finite"),
        ({"seed": -1}, "seed must be >="),
    ],
    ids=[
        "length-L",
        "target-L",
        "population-3",
        "evaluations-0",
        "minutes-0",
        "minutes-nan",
        "seed",
    ],
)
def test_run_search_refuses_bad_arguments(
    loaded: Loaded, validation: Document, tmp_path: Path, options: dict, named: str
) -> None:
    with pytest.raises(PosEncError, match=named):
        _search(loaded, validation, tmp_path, **options)


def test_the_validation_document_is_none_of_the_evaluation_documents(
    loaded: Loaded, validation: Document, monkeypatch: pytest.MonkeyPatch
) -> None:
    second = validation_document(loaded.tokenizer, [validation], TARGET)
    assert second.sha256 != validation.sha256 and len(second.ids) >= TARGET
    from posenc.extend import search_state

    small = sorted(Path(search_state.__file__).parent.glob("*.py"))[:3]
    monkeypatch.setattr(search_state, "stdlib_sources", lambda count: small)
    with pytest.raises(PosEncError, match="--search-length: no standard-library source"):
        validation_document(loaded.tokenizer, [], 10**6)


# --- the search units, the export -----------------------------------------------------------


@pytest.fixture(scope="module")
def run(llama: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("run")
    text = folder / "doc.txt"
    text.write_text(TEXT)
    out = folder / "out"
    options = {"to": 2.0, "texts": [str(text)], "trials": 0, "scalings": ["none", "yarn"]}
    settings = ExtendSettings.from_options(llama, search=0.02, **options)
    return out, run_extend(settings, out_dir=out, plot=False)


def test_the_search_units_measure_the_best_factors_at_every_length(
    run: tuple[Path, dict], loaded: Loaded
) -> None:
    _, results = run
    found = results["search"]
    assert found["validation"]["name"] not in [d["name"] for d in results["documents"]]
    units = [r for r in results["records"] if r["scaling"] == "search"]
    assert [(r["length"], r["factor"]) for r in units] == [(64, 2.0), (96, 2.0), (128, 2.0)]
    scaling = search_scaling(found["best"]["long_factor"], CONTEXT, TARGET)
    for record in units:
        assert list(record["rope"]["long_factor"]) == found["best"]["long_factor"]
    model = scaled(loaded, scaling)
    try:
        ids = loaded.tokenizer(TEXT)["input_ids"][:TARGET]
        nll = measure.nll_by_position(model, ids)
    finally:
        unpatch(model)
    assert units[-1]["ppl"] == pytest.approx(math.exp(float(nll.mean())), rel=1e-12)


def test_the_exported_config_runs_the_measured_model_in_transformers(
    run: tuple[Path, dict], loaded: Loaded, llama: Path
) -> None:
    out, results = run
    folder = out / "search"
    config = transformers.AutoConfig.from_pretrained(folder)
    params = config.rope_parameters
    assert params["rope_type"] == "longrope" and config.max_position_embeddings == TARGET
    assert params["long_factor"] == results["search"]["best"]["long_factor"]
    assert params["factor"] == 2.0 and params["original_max_position_embeddings"] == CONTEXT
    back = rotary_from_config(config, layer_type=None).scaling
    assert back.long_factor == tuple(results["search"]["best"]["long_factor"])
    # transformers alone (no posenc) from that config: the logits posenc's patch measured
    plain = transformers.AutoModelForCausalLM.from_pretrained(llama, config=config).eval()
    scaling = search_scaling(params["long_factor"], CONTEXT, TARGET)
    ids = torch.tensor([loaded.tokenizer(TEXT)["input_ids"][:TARGET]])
    model = scaled(loaded, scaling)
    try:
        with torch.no_grad():
            ours, theirs = model(ids).logits, plain(ids).logits
    finally:
        unpatch(model)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_a_resumed_run_keeps_the_search_and_its_units(run: tuple[Path, dict], llama: Path) -> None:
    out, results = run
    text = Path(results["settings"]["texts"][0])
    settings = ExtendSettings.from_options(
        llama, to=2.0, texts=[str(text)], trials=0, scalings=["none", "yarn"], search=0.02
    )
    events: list[str] = []
    again = run_extend(
        settings, out_dir=out, plot=False, resume=True, on_event=lambda k, i: events.append(k)
    )
    assert "step" not in events  # every unit kept, none measured again
    assert again["search"]["best"] == results["search"]["best"]
    assert json.loads(json.dumps(again["records"])) == json.loads(json.dumps(results["records"]))


def test_the_page_of_a_run_with_a_search(run: tuple[Path, dict], tmp_path: Path) -> None:
    import base64
    import html
    import io
    import re

    import matplotlib.image

    from posenc.extend.page import write_page

    _, results = run
    found = results["search"]
    paths = write_page(results, tmp_path)
    assert [p.name for p in paths] == ["ppl_by_position.png", "search.png", "index.html"]
    page = paths[-1].read_text(encoding="utf-8")
    section = page.split('<section id="search">')[1].split("</section>")[0]
    text = html.unescape(re.sub(r"<[^>]+>", "", section))
    n = found["evaluated"]
    assert f"of {found['validation']['name']}, a standard-library source" in text
    assert f"over its first {TARGET} tokens (2 L; the evaluation runs to {TARGET})" in text
    assert f"It scored {n} candidate{'' if n == 1 else 's'} in {found['generations']} " in text
    assert f"with validation perplexity {found['best']['ppl']:.4g} against PI " in text
    assert "search/config.json: rope_type longrope, short factors all 1" in text
    assert str(tmp_path) not in text
    image = re.search(r'base64,([A-Za-z0-9+/=]+)"[^>]*data-file="search.png"', page)
    assert image is not None
    pixels = matplotlib.image.imread(io.BytesIO(base64.b64decode(image[1])), format="png")
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100


# --- the command ------------------------------------------------------------------------------


def test_the_command_searches_and_writes_the_export(capsys, llama: Path, tmp_path: Path) -> None:
    from tests.cli._command import run as command

    text, out = tmp_path / "doc.txt", tmp_path / "out"
    text.write_text(TEXT)
    args = ["extend", str(llama), "--out", str(out), "--text", str(text), "--trials", "0"]
    args += ["--scalings", "none", "--lengths", "1.5", "--search", "0.01", "--search-length", "1.5"]
    code, _, err = command(capsys, *args)
    assert code in (0, None), err
    results = json.loads((out / "results.json").read_text())
    assert results["search"]["length"] == 96 and results["search"]["target"] == TARGET
    search = {r["key"] for r in results["records"] if r["scaling"] == "search"}
    assert search == {"search-96-2", "search-128-2"}  # the lengths measured (--lengths 1.5, 2)
    assert (out / "search" / "config.json").is_file() and (out / STATE_FILE).is_file()
    lines = [line for line in err.splitlines() if line.startswith("search: candidate ")]
    assert len(lines) == results["search"]["evaluated"]  # one line per evaluation
    best = results["search"]["best"]
    assert f"best {best['ppl']:.4g} ({best['origin']})" in lines[-1]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--search", "0"], "--search must be > 0"),
        (["--search", "nan"], "--search"),
        (["--search", "1", "--search-length", "1.7"], "search_length must be one of"),
        (["--search-length", "1.5"], "search_length needs search"),
    ],
    ids=["zero", "nan", "length-not-measured", "length-alone"],
)
def test_the_command_refuses_bad_search_options_in_one_line(
    capsys, llama: Path, tmp_path: Path, args: list[str], named: str
) -> None:
    from tests.cli._command import run as command

    code, _, err = command(capsys, "extend", str(llama), "--out", str(tmp_path / "o"), *args)
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1, err
