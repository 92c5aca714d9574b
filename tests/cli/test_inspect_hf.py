"""``posenc inspect --hf-config PATH`` on the published configs of tests/data/hf_configs."""

from __future__ import annotations

import json
import pathlib

import pytest

from ._command import run

CONFIGS = pathlib.Path(__file__).parents[1] / "data" / "hf_configs"
FIXTURES = sorted(p.stem for p in CONFIGS.glob("*.json"))


@pytest.mark.parametrize("name", FIXTURES)
def test_inspect_prints_the_encoding(capsys, name):
    path = str(CONFIGS / f"{name}.json")
    code, out, err = run(capsys, "inspect", "--hf-config", path)
    assert code in (0, None), err
    for word in ("model_type:", "layout:", "rotary_dim:", "inverse frequencies:", "scaling:"):
        assert word in out
    assert "attention scale:" in out and "max |cos/sin error|" in out
    code, out, _ = run(capsys, "inspect", "--hf-config", path, "--json")
    data = json.loads(out)
    assert data["transformers"]["status"] == "compared"
    for layer_type, err in data["transformers"]["max_error"].items():
        enc = data["layers"][layer_type]
        worst = max(data["transformers"]["positions"]) * 3.1e-7 * enc["attention_scale"]
        assert err <= worst + 2e-6, (layer_type, err)


def test_inspect_reads_each_family_right(capsys):
    def layers(name):
        _, out, _ = run(capsys, "inspect", "--hf-config", str(CONFIGS / f"{name}.json"), "--json")
        return json.loads(out)["layers"]

    gptj = layers("gptj_6b")["all"]
    assert (gptj["layout"], gptj["rotary_dim"], gptj["head_dim"]) == ("interleaved", 64, 256)
    gemma = layers("gemma3_1b_it")
    assert gemma["sliding_attention"]["base"] == 1e4 and gemma["full_attention"]["base"] == 1e6
    llama = layers("llama3_1_8b")["all"]
    assert "Llama3Scaling(factor=8.0" in llama["scaling"] and llama["base"] == 5e5
    scout = layers("llama4_scout_17b_16e_instruct")["all"]  # text_config, complex freqs_cis
    assert (scout["layout"], scout["rotary_dim"], scout["base"]) == ("interleaved", 128, 5e5)
    assert "Llama3Scaling(factor=16.0" in scout["scaling"]
    for name, head_dim in (("phi3_5_mini_instruct", 96), ("phi4_mini_instruct", 128)):
        phi = layers(name)["all"]  # Phi-4-mini: partial_rotary_factor 0.75
        assert (phi["layout"], phi["rotary_dim"], phi["head_dim"]) == ("half", 96, head_dim)
        assert phi["scaling"].startswith("LongRopeScaling(") and "type='longrope'" in phi["scaling"]


def test_refused_config_is_one_line(capsys, tmp_path):
    # HunYuan-VL's sections over doubled channels: posenc refuses it, naming the family
    path = tmp_path / "config.json"
    config = {"model_type": "hunyuan_vl_text", "hidden_size": 64, "num_attention_heads": 4}
    path.write_text(json.dumps(config))
    code, out, err = run(capsys, "inspect", "--hf-config", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("posenc: error: ") and "model_type 'hunyuan_vl_text'" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "must be an existing file"),
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "must hold a JSON object"),
    ],
)
def test_bad_file_is_one_line(capsys, tmp_path, content, message):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    code, out, err = run(capsys, "inspect", "--hf-config", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err


def test_encoding_and_hf_config_together_or_neither(capsys):
    path = str(CONFIGS / "llama3_1_8b.json")
    code, _, err = run(capsys, "inspect", "rope", "--hf-config", path)
    assert code == 2 and "not both" in err
    code, _, err = run(capsys, "inspect")
    assert code == 2 and "missing ENCODING" in err
    code, _, err = run(capsys, "inspect", "--hf-config", path, "--param", "head_dim=8")
    assert code == 2 and "--param does not apply" in err
