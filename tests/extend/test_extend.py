"""``posenc extend`` on tiny random models saved as transformers folders (every run) and
the real SmolLM2 GGUF (when fetched): the units, the numbers against a direct
computation, resume, the saved config against transformers' own RoPE, the refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

import itertools

import transformers
from tests import _real_models
from tests.extend._tiny import byte_tokenizer, tiny_gemma3, tiny_llama

from posenc import PosEncError
from posenc.extend import measure
from posenc.extend.model import load_model, scaled, scaling_for
from posenc.extend.run import execution_order, plan_units, run_extend
from posenc.extend.save import save_extended
from posenc.extend.settings import ExtendSettings
from posenc.integrations.transformers import PatchedRotaryEmbedding, unpatch

TEXT = (Path(__file__).resolve().parents[2] / "src" / "posenc" / "rotary" / "module.py").read_text()
REQUIRED = (
    "scaling",
    "factor",
    "length",
    "ppl",
    "ppl_last_quarter",
    "probes",
    "scores",
    "seconds",
    "peak_bytes",
)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gemma3(tmp_path_factory.mktemp("gemma3"))


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("text") / "doc.txt"
    path.write_text(TEXT * 2)
    return path


def _settings(model: Path, text: Path, **options: object) -> ExtendSettings:
    defaults = {"to": 2.0, "texts": [str(text)], "trials": 1}
    return ExtendSettings.from_options(model, **{**defaults, **options})


@pytest.fixture(scope="module")
def run(
    llama: Path, text_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("out")
    return out, run_extend(_settings(llama, text_file), out_dir=out)


# --- the units and the record -----------------------------------------------------------------


def test_plan_units_none_everywhere_each_scaling_at_its_factor(llama: Path) -> None:
    settings = ExtendSettings.from_options(llama, to=2.0, scalings=["none", "linear", "yarn"])
    units = plan_units(settings, settings.lengths_for(1000), 1000, configured=False)
    assert units == [
        ("none", 1000, 1.0),
        ("linear", 1000, 2.0),
        ("yarn", 1000, 2.0),
        ("none", 1500, 1.0),
        ("linear", 1500, 1.5),
        ("yarn", 1500, 1.5),
        ("none", 2000, 1.0),
        ("linear", 2000, 2.0),
        ("yarn", 2000, 2.0),
    ]


def test_quick_is_none_and_the_maps_at_1_25_L_asking_the_passkey(llama: Path) -> None:
    settings = ExtendSettings.from_options(llama, quick=True)
    assert (settings.to, settings.documents, settings.trials) == (1.25, 1, 1)
    assert settings.tasks == ("passkey",)
    units = plan_units(settings, settings.lengths_for(8192), 8192, configured=False)
    assert units == [("none", 8192, 1.0), ("none", 10240, 1.0)] + [
        (s, 10240, 1.25) for s in ("self-extend", "string")
    ]
    given = ExtendSettings.from_options(llama, quick=True, scalings=["none", "linear"])
    assert given.scalings == ("none", "linear")  # what is given wins over --quick's


def test_units_run_longest_first_within_a_scaling_and_factor() -> None:
    units = [("none", 10, 1.0), ("yarn", 10, 2.0), ("none", 20, 1.0), ("yarn", 20, 2.0)]
    assert execution_order(units) == [2, 0, 3, 1]


def test_results_hold_one_record_per_unit_with_every_field(run: tuple[Path, dict]) -> None:
    out, results = run
    saved = json.loads((out / "results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    keys = [r["key"] for r in results["records"]]
    assert len(keys) == len(set(keys)) == 21  # none, 4 scalings and 2 maps, x 3 lengths
    for record in results["records"]:
        for field in REQUIRED:
            assert field in record, (record["key"], field)
        assert record["peak_bytes"] > 0 and record["seconds"] >= 0
    assert results["model"]["files"]["config.json"] and results["trained_context"] == 512
    html = (out / "index.html").read_text()
    # 512 byte tokens are too short for the probes' needles: no probe figure, only perplexity
    assert all("probes_skipped" in r for r in results["records"])
    assert html.count("data:image/png;base64,") == 1 and results["answer"]["lead"] in html
    assert str(out) not in html and "emit" in results


def test_dynamic_at_L_is_no_scaling_and_takes_its_numbers(run: tuple[Path, dict]) -> None:
    records = {r["key"]: r for r in run[1]["records"]}
    dynamic, none = records["dynamic-512-2"], records["none-512-1"]
    assert dynamic["same_as"] == "none-512-1" and dynamic["ppl"] == none["ppl"]
    assert records["yarn-512-2"]["same_as"] is None  # YaRN at factor 2 changes the angles at L


def test_perplexity_is_the_direct_computation(llama: Path, text_file: Path) -> None:
    loaded = load_model(llama, dtype="float32", device="cpu", context=None)
    ids = loaded.tokenizer(text_file.read_text())["input_ids"][:700]
    nll = measure.nll_by_position(loaded.model, ids)
    with torch.no_grad():
        logits = loaded.model(torch.tensor([ids])).logits[0, :-1].double()
    expected = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="none")
    torch.testing.assert_close(nll, expected, rtol=1e-5, atol=1e-5)
    got = measure.perplexities([nll, nll.flip(0)], 700, 128)
    both = torch.stack([nll, nll.flip(0)])
    assert got["ppl"] == pytest.approx(math.exp(both.mean().item()), rel=1e-12)
    assert got["ppl_last_quarter"] == pytest.approx(
        math.exp(both[:, 700 - 175 - 1 :].mean().item()), rel=1e-12
    )
    assert [(b["start"], b["stop"]) for b in got["by_bucket"]] == [
        (0, 128),
        (128, 256),
        (256, 384),
        (384, 512),
        (512, 640),
        (640, 700),
    ]
    assert got["by_bucket"][0]["ppl"] == pytest.approx(
        math.exp(both[:, :127].mean().item()), rel=1e-12
    )


@pytest.mark.parametrize("name", ["linear", "ntk", "dynamic", "yarn"])
def test_a_unit_runs_the_scaling_it_names(llama: Path, name: str) -> None:
    from posenc import RotaryEmbedding

    loaded = load_model(llama, dtype="float32", device="cpu", context=None)
    model = scaled(loaded, scaling_for(name, 2.0, loaded))
    try:
        rotary = next(m for m in model.modules() if isinstance(m, PatchedRotaryEmbedding))
        rope = rotary.ropes[None]
        expected = RotaryEmbedding(8, base=10000.0, scaling=scaling_for(name, 2.0, loaded))
        positions = torch.arange(1024)[None]
        for got, want in zip(rope.cos_sin(positions), expected.cos_sin(positions)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    finally:
        unpatch(model)


def test_gemma3_scales_only_its_global_layers(gemma: Path) -> None:
    loaded = load_model(gemma, dtype="float32", device="cpu", context=None)
    assert loaded.scaled_types == ["full_attention"]
    model = scaled(loaded, scaling_for("yarn", 2.0, loaded))
    try:
        rotary = next(m for m in model.modules() if isinstance(m, PatchedRotaryEmbedding))
        assert rotary.ropes["full_attention"].scaling.type == "yarn"
        assert rotary.ropes["sliding_attention"].scaling is None
        assert rotary.ropes["sliding_attention"].base == 10000.0
    finally:
        unpatch(model)


# --- resume -------------------------------------------------------------------------------------


def test_resume_keeps_every_unit_and_other_settings_do_not(
    llama: Path, text_file: Path, tmp_path: Path
) -> None:
    settings = _settings(llama, text_file, scalings=["none", "yarn"])
    first = run_extend(settings, out_dir=tmp_path)
    steps: list[dict] = []
    again = run_extend(
        settings,
        out_dir=tmp_path,
        resume=True,
        on_event=lambda k, i: steps.append(i) if k == "step" else None,
    )
    assert steps == [] and again["records"] == first["records"]
    more = _settings(llama, text_file, scalings=["none", "ntk", "yarn"], to=2.0)
    events: list[tuple] = []
    run_extend(
        more,
        out_dir=tmp_path,
        resume=True,
        on_event=lambda k, i: events.append((k, i.get("scaling"))),
    )
    measured = {
        s for (k, s), (after, _) in itertools.pairwise(events) if k == "unit" and after == "step"
    }
    assert measured == {"ntk"}  # a scaling added: the units of before are kept
    other = _settings(llama, text_file, scalings=["none", "yarn"], seed=1)
    run_extend(
        other,
        out_dir=tmp_path,
        resume=True,
        on_event=lambda k, i: steps.append(i) if k == "step" else None,
    )
    assert steps  # a different seed is another run: every unit measured again


# --- one forward pass for the lengths of a scaling and factor ---------------------------------


def test_the_longer_pass_gives_the_shorter_lengths_their_perplexity(
    llama: Path, text_file: Path, tmp_path: Path
) -> None:
    settings = _settings(llama, text_file, scalings=["none", "yarn", "dynamic"], trials=0)
    records = {r["key"]: r for r in run_extend(settings, out_dir=tmp_path, plot=False)["records"]}
    assert records["none-512-1"]["shared_pass"] == "none-1024-1"
    assert records["yarn-512-2"]["shared_pass"] == "yarn-1024-2"
    assert records["dynamic-1024-2"]["shared_pass"] is None  # its angles depend on the length
    assert records["dynamic-512-2"]["same_as"] == "none-512-1"
    loaded = load_model(llama, dtype="float32", device="cpu", context=None)
    ids = loaded.tokenizer(text_file.read_text())["input_ids"][:512]
    for key, name in (("none-512-1", "none"), ("yarn-512-2", "yarn")):
        model = scaled(loaded, scaling_for(name, 2.0, loaded))
        try:
            alone = measure.nll_by_position(model, ids)
        finally:
            unpatch(model)
        assert records[key]["ppl"] == pytest.approx(math.exp(alone.mean().item()), rel=1e-5)


def test_a_haystacks_perplexity_leaves_its_needles_out(
    llama: Path, text_file: Path, tmp_path: Path
) -> None:
    # byte tokens: every task's needles need about 2,400 of them
    settings = _settings(llama, text_file, scalings=["none", "yarn"], context=1536, multiples=[1])
    results = run_extend(settings, out_dir=tmp_path, plot=False)
    records = {r["key"]: r for r in results["records"]}
    record = records["none-3072-1"]
    assert record["probes"] and set(record["scores"]) == {
        "passkey",
        "multikey",
        "multivalue",
        "vartrack",
    }
    assert "probes_skipped" in records["none-1536-1"]  # too short for the needles
    assert 0 < record["tokens"] < 3071 - 500  # the needles' and the instruction's not counted
    ids = {p["id"] for p in record["probes"]}
    assert ids == {p["id"] for p in records["yarn-3072-2"]["probes"]}  # the same prompts
    assert records["none-1536-1"]["shared_pass"] is None  # doc 0 is the haystack: no pass


def test_filler_losses_are_nan_on_the_needles() -> None:
    from types import SimpleNamespace

    from posenc.extend.run import _filler_losses

    nll = torch.arange(9, dtype=torch.float64)  # predicts tokens 1..9 of a 10-token haystack
    got = _filler_losses(nll, SimpleNamespace(needles=((3, 5),)), 12)
    want = torch.tensor([0, 1, math.nan, math.nan, 4, 5, 6, 7, 8, math.nan, math.nan])
    torch.testing.assert_close(got, want.double(), equal_nan=True)


# --- --save: transformers loads it, and its RoPE is posenc's ------------------------------------


@pytest.mark.parametrize("name", ["linear", "ntk", "dynamic", "yarn"])
def test_saved_model_loads_without_posenc_and_matches_the_patched_one(
    llama: Path, name: str, tmp_path: Path
) -> None:
    loaded = load_model(llama, dtype="float32", device="cpu", context=None)
    ids = torch.tensor([loaded.tokenizer(TEXT)["input_ids"][:1024]])
    model = scaled(loaded, scaling_for(name, 2.0, loaded))
    try:
        with torch.no_grad():
            patched = model(ids).logits
    finally:
        unpatch(model)
    folder = save_extended(loaded, name, 2.0, 1024, tmp_path / "saved")
    plain = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        theirs = plain(ids).logits
    torch.testing.assert_close(theirs, patched, rtol=1e-4, atol=1e-4)
    assert json.loads((folder / "config.json").read_text())["rope_parameters"]["rope_type"] == (
        "default" if name == "ntk" else name
    )


def test_save_refuses_a_folder_that_holds_files(llama: Path, tmp_path: Path) -> None:
    (tmp_path / "x").write_text("")
    loaded = load_model(llama, dtype="float32", device="cpu", context=None)
    with pytest.raises(PosEncError, match="--save must name a new or empty folder"):
        save_extended(loaded, "yarn", 2.0, 1024, tmp_path)


# --- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"to": 0.5}, "to must be"),
        ({"to": float("nan")}, "to must be"),
        ({"scalings": []}, "scalings must name at least one"),
        ({"scalings": ["yarn", "yarn"]}, "must not repeat"),
        ({"scalings": ["rope"]}, "scalings must be one of"),
        ({"depths": (0.0,)}, "strictly between 0 and 1"),
        ({"tasks": []}, "tasks must name at least one"),
        ({"tasks": ["niah"]}, "tasks must be one of"),
        ({"emit": ["vllm", "vllm"]}, "emit must not repeat"),
        ({"emit": ["tgi"]}, "emit must be one of"),
        ({"bar": 0.0}, "bar must be > 0"),
        ({"bar": 1.5}, "bar must be <= 1"),
        ({"ppl_tolerance": -0.1}, "ppl_tolerance must be >= 0"),
        ({"scaling": "rope"}, "scaling must be one of"),
        ({"multiples": (3.0,), "to": 2.0}, "multiples"),
        ({"multiples": "1,2"}, "must be a list or tuple"),
        ({"trials": -1}, "trials must be"),
        ({"dtype": "int8"}, "dtype must be one of"),
        ({"context": 3}, "context must be"),
        ({"bogus": 1}, "unknown option"),
        ({"scalings": {"none"}}, "scalings must be a list or tuple"),
        ({"device": "nan"}, "device must be a device name"),
        ({"device": "meta"}, "device must be 'cpu'"),
        ({"multiples": (1.0, float("nan"))}, "multiples"),
    ],
)
def test_settings_refuse_bad_options(llama: Path, options: dict, match: str) -> None:
    with pytest.raises(PosEncError, match=match):
        ExtendSettings.from_options(llama, **options)


def test_models_that_cannot_be_measured_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PosEncError, match="no such path"):
        load_model(tmp_path / "absent", dtype="float32", device="cpu", context=None)
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(PosEncError, match=r"a model folder or a \.gguf file"):
        load_model(tmp_path / "weights.bin", dtype="float32", device="cpu", context=None)
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(PosEncError, match="cannot read this GGUF file"):
        load_model(tmp_path / "bad.gguf", dtype="float32", device="cpu", context=None)
    with pytest.raises(PosEncError, match=r"has no config\.json"):
        load_model(tmp_path, dtype="float32", device="cpu", context=None)
    gpt2 = tmp_path / "gpt2"
    config = transformers.GPT2Config(vocab_size=260, n_embd=16, n_layer=1, n_head=2, n_positions=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(gpt2)
    byte_tokenizer().save_pretrained(gpt2)
    with pytest.raises(PosEncError, match="no RoPE to scale"):
        load_model(gpt2, dtype="float32", device="cpu", context=None)


def test_a_length_beyond_memory_is_refused_before_it_runs(
    llama: Path, text_file: Path, tmp_path: Path
) -> None:
    settings = _settings(llama, text_file, context=10**7, to=64.0)
    with pytest.raises(PosEncError, match=r"--to: a forward of 640000000 tokens needs about"):
        run_extend(settings, out_dir=tmp_path)
    assert not (tmp_path / "results.json").exists()


def test_no_document_long_enough_is_one_line(llama: Path, tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    short.write_text("def f(): pass\n")
    with pytest.raises(PosEncError, match="no document has 1024 tokens"):
        run_extend(_settings(llama, short), out_dir=tmp_path / "out")


# --- the real model -----------------------------------------------------------------------------


@pytest.mark.real_model
@pytest.mark.slow
def test_smollm2_gguf_runs_end_to_end(tmp_path: Path) -> None:
    path = _real_models.require("smollm2")
    settings = ExtendSettings.from_options(
        path, context=256, to=2.0, scalings=["none", "yarn"], documents=1, trials=1
    )
    results = run_extend(settings, out_dir=tmp_path)
    assert results["model"]["model_type"] == "llama" and results["model"]["files"][path.name]
    by_key = {r["key"]: r for r in results["records"]}
    assert set(by_key) == {
        "none-256-1",
        "yarn-256-2",
        "none-384-1",
        "yarn-384-1.5",
        "none-512-1",
        "yarn-512-2",
    }
    # SmolLM2 was trained at 8192: at 512 tokens it reads code well with or without YaRN
    assert all(r["ppl"] < 30 for r in by_key.values())


def test_a_gguf_files_own_scaling_is_read_back(tmp_path: Path) -> None:
    """transformers' GGUF reader drops ``rope.scaling.*``; ``config`` puts it back."""
    pytest.importorskip("gguf")
    from tests.integrations.test_gguf import write_gguf

    from posenc.extend.model import _gguf_scaling

    keys = {
        "context_length": 32768,
        "block_count": 2,
        "embedding_length": 64,
        "attention.head_count": 4,
        "rope.freq_base": 1e6,
        "rope.scaling.type": "yarn",
        "rope.scaling.factor": 4.0,
        "rope.scaling.original_context_length": 8192,
    }
    path = write_gguf(tmp_path / "yarn.gguf", "qwen2", keys)
    scaling = _gguf_scaling(path, None)
    assert (scaling.type, scaling.factor, scaling.original_max_position) == ("yarn", 4.0, 8192)
    plain = write_gguf(
        tmp_path / "plain.gguf", "qwen2", {k: v for k, v in keys.items() if "scaling" not in k}
    )
    assert _gguf_scaling(plain, None) is None
