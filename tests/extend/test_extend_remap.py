"""``posenc extend`` with the position maps (Self-Extend, STRING) and on hybrid models, on
tiny random models saved as transformers folders and a tiny GGUF file: each paper's
parameters, which units share numbers, the records and the page, the engines that run a map
(llama.cpp's group attention for Self-Extend) and the refusals of the others, ``--save``,
and models whose long-range layers have no RoPE (Cohere 2, EXAONE 4, Kimi Linear) or some
NoPE layers (SmolLM3)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")
pytest.importorskip("gguf")

from tests.extend._tiny import tiny_llama, tiny_llama_gguf
from tests.extend._tiny_hybrid import tiny_hybrid

from posenc import PosEncError
from posenc.extend.emit import check_emit, write_emit
from posenc.extend.model import (
    Loaded,
    active_map,
    load_model,
    map_changes,
    scaled,
    scaling_for,
    split_spec,
)
from posenc.extend.run import plan_units, run_extend
from posenc.extend.save import save_extended
from posenc.extend.settings import ExtendSettings
from posenc.integrations.engines import ENGINES, POSENC_ONLY, engine_setting
from posenc.integrations.spelling import to_rope_parameters
from posenc.integrations.transformers import unpatch
from posenc.remap import self_extend_for, string_for

TEXT = (Path(__file__).resolve().parents[2] / "src" / "posenc" / "rotary" / "module.py").read_text()
MAPS = ["none", "yarn", "self-extend", "string"]


def _load(path: Path) -> Loaded:
    return load_model(path, dtype="float32", device="cpu", context=None)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def loaded(llama: Path) -> Loaded:
    return _load(llama)


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    return _load(tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf"))


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("text") / "doc.txt"
    path.write_text(TEXT * 2)
    return path


@pytest.fixture(scope="module")
def run(
    llama: Path, text_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    """none, YaRN and both maps up to 3 L (STRING's shift for 3 L is L itself)."""
    out = tmp_path_factory.mktemp("out")
    settings = ExtendSettings.from_options(
        llama, to=3.0, texts=[str(text_file)], trials=1, scalings=MAPS, scaling="string"
    )
    return out, run_extend(settings, out_dir=out)


def _records(run: tuple[Path, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["key"]: r for r in run[1]["records"]}


# --- each paper's parameters ---------------------------------------------------------------


@pytest.mark.parametrize("factor", [1.0, 1.5, 2.0, 3.0])
def test_scaling_for_gives_each_papers_parameters(loaded: Loaded, factor: float) -> None:
    target = round(512 * factor)
    assert scaling_for("self-extend", factor, loaded) == self_extend_for(512, target).to_config()
    string = string_for(512, target).to_config()
    if factor > 1.0:  # past L, STRING runs with YaRN at the factor
        string["scaling"] = scaling_for("yarn", factor, loaded)
    spec = scaling_for("string", factor, loaded)
    assert spec == string
    assert split_spec(spec) == (string_for(512, target).to_config(), string.get("scaling"))
    assert split_spec(scaling_for("yarn", factor, loaded))[0] is None


@pytest.mark.parametrize(
    ("spec", "length", "moves"),
    [
        ({"type": "self_extend", "group_size": 4, "neighbor_window": 128}, 128, False),
        ({"type": "self_extend", "group_size": 4, "neighbor_window": 128}, 129, True),
        ({"type": "self_extend", "group_size": 1, "neighbor_window": 16}, 4096, False),
        ({"type": "string", "shift": 100, "local_window": 10}, 100, False),
        ({"type": "string", "shift": 100, "local_window": 10}, 101, True),
        (
            {"type": "string", "shift": 100, "local_window": 10, "scaling": {"type": "yarn"}},
            101,
            True,
        ),
        ({"type": "yarn", "factor": 2.0, "original_max_position": 512}, 4096, False),
        (None, 4096, False),
    ],
)
def test_a_map_changes_a_unit_only_where_it_moves_a_pair(
    loaded: Loaded, spec: Any, length: int, moves: bool
) -> None:
    assert map_changes(spec, length) is moves
    expected = split_spec(spec)[0] if moves else None
    assert active_map(loaded, spec, length) == expected


def test_the_quick_run_plans_both_maps(llama: Path) -> None:
    settings = ExtendSettings.from_options(llama, quick=True)
    units = plan_units(settings, settings.lengths_for(1000), 1000, configured=False)
    assert [u for u in units if u[0] in ("self-extend", "string")] == [
        ("self-extend", 1250, 1.25),
        ("string", 1250, 1.25),
    ]


# --- the run: records, sharing, the page ----------------------------------------------------


def test_every_remapped_record_holds_its_map(run: tuple[Path, dict[str, Any]]) -> None:
    records = _records(run)
    for r in records.values():
        target = round(r["factor"] * 512)
        if r["scaling"] == "self-extend":
            assert r["map"] == self_extend_for(512, target).to_config(), r["key"]
            assert r["map_changes"] and r["rope"] == r["map"], r["key"]
        elif r["scaling"] == "string":
            assert r["map"] == string_for(512, target).to_config(), r["key"]
            assert r["rope"]["scaling"] == {
                "type": "yarn",
                "factor": r["factor"],
                "original_max_position": 512,
            }
        else:
            assert r["map"] is None and r["map_changes"] is False, r["key"]


def test_a_map_that_moves_no_pair_takes_the_numbers_of_what_it_then_is(
    run: tuple[Path, dict[str, Any]],
) -> None:
    records = _records(run)
    # set for 3 L, STRING's shift is L: at L no pair moves, and it is YaRN factor 3 there
    quiet, yarn = records["string-512-3"], records["yarn-512-3"]
    assert quiet["map_changes"] is False and quiet["same_as"] == "yarn-512-3"
    assert quiet["ppl"] == yarn["ppl"] and quiet["by_bucket"] == yarn["by_bucket"]
    for key in ("string-768-1.5", "string-1536-3", "self-extend-512-3", "self-extend-1536-3"):
        assert records[key]["map_changes"] and records[key]["same_as"] is None, key


def test_a_remapped_unit_never_takes_another_settings_pass(
    run: tuple[Path, dict[str, Any]],
) -> None:
    for r in _records(run).values():
        if r["shared_pass"] is not None:
            assert r["shared_pass"].startswith(f"{r['scaling']}-"), r["key"]
            assert r["shared_pass"].endswith(f"-{r['factor']:g}"), r["key"]
    records = _records(run)
    assert records["self-extend-512-3"]["shared_pass"] == "self-extend-1536-3"


def test_the_page_shows_each_maps_parameters_and_where_it_runs(
    run: tuple[Path, dict[str, Any]], loaded: Loaded
) -> None:
    out, results = run
    html = (out / "index.html").read_text()
    se = self_extend_for(512, 1536)
    assert 'id="maps"' in html and "Position maps" in html
    assert f"group size G {se.group_size}, neighbour window W {se.neighbor_window}" in html
    string = string_for(512, 1536)
    assert f"shift S {string.shift}, local window W {string.local_window}" in html
    assert "yarn factor 3" in html and "moves no pair at 512" in html
    assert "the map moves no pair at this length: the numbers of yarn-512-3" in html
    # the written setting is STRING: no engine runs it, posenc's patch does
    assert results["chosen"]["spec"] == scaling_for("string", 3.0, loaded)
    assert 'id="engine-posenc"' in html and "from posenc.integrations.transformers import" in html
    assert f"it runs in {POSENC_ONLY}" in html
    for engine, item in results["emit"].items():
        assert item["refused"].endswith(POSENC_ONLY), engine


# --- the engines ----------------------------------------------------------------------------


def test_self_extend_is_llama_cpps_group_attention_and_refused_elsewhere(
    gguf_model: Loaded, tmp_path: Path
) -> None:
    results = write_emit(gguf_model, "self-extend", 2.0, 1024, tmp_path, list(ENGINES))
    se = self_extend_for(512, 1024)
    item = results["llama.cpp"]
    argv = shlex.split(item["command"])
    assert argv[:5] == ["llama-completion", "-m", "tiny.gguf", "-c", "1024"]
    group = ["--grp-attn-n", str(se.group_size), "--grp-attn-w", str(se.neighbor_window)]
    assert argv[-6:] == [*group, "--batch-size", str(se.neighbor_window)]
    assert item["settings"]["group_attention"] == {
        "grp_attn_n": se.group_size,
        "grp_attn_w": se.neighbor_window,
    }
    assert any("llama-server" in w for w in item["warnings"])
    assert any("pos_div" in w and "2 p_old - p_new" in w for w in item["warnings"])
    script = (tmp_path / "emit" / "llama.cpp" / "command.sh").read_text()
    assert item["command"] in script and "llama-server" not in script.splitlines()[-1]
    for engine in ("transformers", "vllm", "sglang", "gguf", "ollama"):
        reason = results[engine]["refused"]
        assert reason.endswith(POSENC_ONLY) and "llama-completion" in reason, engine
    assert not (tmp_path / "emit" / "gguf").exists()  # no copy written for a refusal


def test_string_is_refused_by_every_engine(gguf_model: Loaded, tmp_path: Path) -> None:
    results = write_emit(gguf_model, "string", 2.0, 1024, tmp_path, list(ENGINES))
    for engine in ENGINES:
        reason = results[engine]["refused"]
        named = "gguf" if engine == "ollama" else engine  # ollama runs the GGUF copy
        assert f"engine {named!r} cannot take scaling 'string'" in reason, engine
        assert reason.endswith(f"it runs in {POSENC_ONLY}"), engine
    with pytest.raises(PosEncError, match=r"engine 'llama\.cpp' cannot take scaling 'string'"):
        write_emit(gguf_model, "string", 2.0, 1024, tmp_path, ["llama.cpp"], strict=True)


@pytest.mark.parametrize(
    ("engines", "scaling", "is_gguf", "match"),
    [
        (["vllm"], "string", False, "engine 'vllm' cannot take scaling 'string'"),
        (["llama.cpp"], "string", True, "engine 'llama.cpp' cannot take scaling 'string'"),
        (["transformers"], "self-extend", False, "'transformers' cannot take scaling"),
        (["gguf"], "self-extend", True, "'gguf' cannot take scaling 'self_extend'"),
        (["ollama"], "self-extend", True, "'ollama' cannot take scaling 'self_extend'"),
    ],
)
def test_check_emit_refuses_a_map_an_engine_cannot_run(
    engines: list[str], scaling: str, is_gguf: bool, match: str
) -> None:
    with pytest.raises(PosEncError, match=match) as info:
        check_emit(engines, scaling, is_gguf)
    assert str(info.value).endswith(POSENC_ONLY)


def test_check_emit_lets_llama_cpp_run_self_extend() -> None:
    check_emit(["llama.cpp"], "self-extend", True)
    check_emit(["llama.cpp"], "self-extend", False)


@pytest.mark.parametrize(
    ("position_map", "match"),
    [
        (
            {"type": "self_extend", "group_size": 4, "neighbor_window": 250},
            "neighbor_window 250 is not a multiple of group_size 4",
        ),
        ({"type": "self_extend", "group_size": 0, "neighbor_window": 8}, "group_size"),
        ({"type": "string", "shift": 8, "local_window": 8}, "local_window must be < shift"),
        ({"type": "rerope"}, "position_map 'type' must be one of"),
        ({"type": "string", "shift": 8}, "missing"),
        ("self_extend", "position_map must be a position map"),
    ],
)
def test_a_bad_or_unrunnable_map_is_refused_naming_it(position_map: Any, match: str) -> None:
    params = to_rope_parameters(None, base=1e4, rotary_dim=64)
    with pytest.raises(PosEncError, match=match):
        engine_setting(
            "llama.cpp",
            params,
            trained=4096,
            target=8192,
            arch="llama",
            model="m.gguf",
            position_map=position_map,
        )


def test_save_refuses_a_map_and_writes_nothing(loaded: Loaded, tmp_path: Path) -> None:
    for name in ("self-extend", "string"):
        with pytest.raises(PosEncError, match=f"--save cannot write {name}") as info:
            save_extended(loaded, name, 2.0, 1024, tmp_path / name)
        assert POSENC_ONLY in str(info.value)
        assert not (tmp_path / name).exists()


# --- hybrid models ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hybrids(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    kinds = ("cohere2", "exaone4", "smollm3", "kimi_linear")
    return {k: tiny_hybrid(tmp_path_factory.mktemp(k), k) for k in kinds}


@pytest.mark.parametrize("model_type", ["cohere2", "exaone4"])
def test_nope_long_range_models_are_told_and_run_none_only(
    hybrids: dict[str, Path], text_file: Path, tmp_path: Path, model_type: str
) -> None:
    got = _load(hybrids[model_type])
    assert (got.rope_layers, got.scalable) == ([True, False], False)
    assert got.note is not None and got.note.startswith(
        f"{model_type}: its full-attention layers have no RoPE; sliding-window RoPE layers "
        "are left as the config says"
    )
    settings = ExtendSettings.from_options(
        hybrids[model_type], to=2.0, texts=[str(text_file)], trials=0, scalings=MAPS
    )
    notes: list[Any] = []
    results = run_extend(
        settings,
        out_dir=tmp_path,
        on_event=lambda k, i: notes.append(i["note"]) if k == "loaded" else None,
    )
    assert notes == [got.note] and results["model_note"] == got.note
    assert {r["scaling"] for r in results["records"]} == {"none"}
    html = (tmp_path / "index.html").read_text()
    assert 'id="model-note"' in html and "its full-attention layers have no RoPE" in html
    assert "layers without RoPE (left as they are)" in html
    forced = ExtendSettings.from_options(
        hybrids[model_type], to=2.0, texts=[str(text_file)], trials=0, scaling="yarn"
    )
    with pytest.raises(PosEncError, match=f"--scaling yarn cannot run on model .*{model_type}"):
        run_extend(forced, out_dir=tmp_path / "forced")


def test_smollm3_remaps_its_rope_layers_and_says_so(
    hybrids: dict[str, Path], text_file: Path, tmp_path: Path
) -> None:
    got = _load(hybrids["smollm3"])
    assert (got.rope_layers, got.scalable) == ([True, False], True)
    assert got.note == (
        "smollm3: layer 1 has no RoPE and is left as the config says; scalings and position "
        "maps apply to its 1 RoPE layer only"
    )
    model = scaled(got, scaling_for("self-extend", 2.0, got))
    unpatch(model)
    settings = ExtendSettings.from_options(
        hybrids["smollm3"],
        to=2.0,
        multiples=[2.0],
        texts=[str(text_file)],
        trials=0,
        scalings=["none", "self-extend"],
    )
    results = run_extend(settings, out_dir=tmp_path)
    assert {r["key"] for r in results["records"]} == {
        "none-512-1",
        "none-1024-1",
        "self-extend-1024-2",
    }
    assert results["model_note"] == got.note
    assert got.note in (tmp_path / "index.html").read_text().replace("&#x27;", "'")


def test_kimi_linear_is_refused_naming_its_type(hybrids: dict[str, Path]) -> None:
    with pytest.raises(PosEncError, match=r"\(kimi_linear\): no RoPE to scale or remap") as info:
        _load(hybrids["kimi_linear"])
    assert "\n" not in str(info.value)


def test_string_past_3l_runs_within_the_yarn_scaled_context(loaded: Loaded) -> None:
    # set for 4 L, STRING's shift (4 L / 3) passes L but not L x YaRN's factor 4
    spec = scaling_for("string", 4.0, loaded)
    assert spec["shift"] == string_for(512, 2048).shift > 512
    assert spec["scaling"]["type"] == "yarn" and spec["scaling"]["factor"] == 4.0
    unpatch(scaled(loaded, spec))
    with pytest.raises(PosEncError, match=r"x the scaling.s factor 1.25\b") as info:
        scaled(loaded, {**spec, "scaling": {**spec["scaling"], "factor": 1.25}})
    assert "\n" not in str(info.value)
