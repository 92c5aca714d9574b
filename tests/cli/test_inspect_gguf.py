"""``posenc inspect --gguf FILE`` on synthetic GGUF files and on the real checkpoints."""

from __future__ import annotations

import json

import pytest
from tests import _real_models
from tests.integrations.test_gguf import _BASIC, CASES, write_gguf

from posenc.integrations.gguf import rotary_from_gguf

from ._command import run

pytest.importorskip("gguf")

_BY_NAME = {c.name: c for c in CASES}


def _file(tmp_path, name):
    case = _BY_NAME[name]
    return write_gguf(tmp_path / f"{name}.gguf", case.arch, case.keys, case.tensors)


@pytest.mark.parametrize(
    "name",
    [
        "llama_plain",
        "gemma3_sliding_and_full",
        "qwen2vl_mrope",
        "phi3_longrope",
        "cohere2_full_layers_nope",
    ],
)
def test_inspect_prints_each_layer_type(capsys, tmp_path, name):
    path = _file(tmp_path, name)
    code, out, err = run(capsys, "inspect", "--gguf", str(path))
    assert code in (0, None), err
    for word in (
        "architecture:",
        "context length",
        "layout:",
        "rotary_dim:",
        "inverse frequencies:",
        "scaling:",
        "attention scale:",
        "config:",
    ):
        assert word in out, word
    code, out, _ = run(capsys, "inspect", "--gguf", str(path), "--json")
    data = json.loads(out)
    assert data["architecture"] == _BY_NAME[name].arch
    for layer_type, enc in data["layers"].items():
        if not enc["rotates"]:
            continue
        rope = rotary_from_gguf(path, layer=None if layer_type == "all" else layer_type)
        assert enc["config"] == json.loads(json.dumps(rope.to_config()))
        assert enc["layers"] and enc["rotary_dim"] == rope.rotary_dim


def test_inspect_reads_the_facts(capsys, tmp_path):
    def summary(name):
        _, out, _ = run(capsys, "inspect", "--gguf", str(_file(tmp_path, name)), "--json")
        return json.loads(out)

    llama = summary("llama_plain")["layers"]["all"]
    assert (llama["layout"], llama["layout_transformers"]) == ("interleaved", "half")
    assert llama["llama_cpp_rope_type"] == "NORM"
    gemma = summary("gemma3_sliding_and_full")
    assert gemma["layers"]["sliding_attention"]["base"] == 1e4
    assert gemma["layers"]["full_attention"]["layers"] == [5]
    assert "LinearScaling(factor=8.0" in gemma["layers"]["full_attention"]["scaling"]
    assert gemma["metadata"]["gemma3.attention.sliding_window"] == 512
    qwen = summary("qwen2vl_mrope")["layers"]["all"]
    assert qwen["sections"] == [16, 24, 24] and qwen["llama_cpp_rope_type"] == "MROPE"
    cohere = summary("cohere2_full_layers_nope")["layers"]
    assert cohere["no_rope"] == {"layers": [3, 7], "rotates": False}
    phi = summary("phi3_longrope")
    assert len(phi["metadata"]["rope_factors_long.weight"]) == 48
    _, out, _ = run(capsys, "inspect", "--gguf", str(_file(tmp_path, "cohere2_full_layers_nope")))
    assert "layers without RoPE (2 layers: 3, 7)" in out
    assert "layer type sliding_attention (6 layers: 0-2, 4-6):" in out


@pytest.mark.parametrize(
    ("arch", "message"),
    [
        ("gpt2", "architecture 'gpt2' has no RoPE"),
        ("bert", "architecture 'bert' has no RoPE"),
        ("llama4", "does not read its per-layer RoPE"),
    ],
)
def test_refused_file_is_one_line(capsys, tmp_path, arch, message):
    path = write_gguf(tmp_path / "m.gguf", arch, {**_BASIC, "rope.freq_base": 1e4})
    code, out, err = run(capsys, "inspect", "--gguf", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("posenc: error: ") and message in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "--gguf must be an existing file"),
        (b"{}", "is not a GGUF file"),
        (b"GGUF\x03\x00\x00\x00" + b"\xff" * 40, "cannot be read"),
    ],
)
def test_bad_file_is_one_line(capsys, tmp_path, content, message):
    path = tmp_path / "model.gguf"
    if content is not None:
        path.write_bytes(content)
    code, out, err = run(capsys, "inspect", "--gguf", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_gguf_with_another_source_or_param(capsys, tmp_path):
    path = str(_file(tmp_path, "llama_plain"))
    for args in (("rope", "--gguf", path), ("--hf-config", path, "--gguf", path)):
        code, _, err = run(capsys, "inspect", *args)
        assert code == 2 and "give one of ENCODING, --hf-config or --gguf" in err
    code, _, err = run(capsys, "inspect", "--gguf", path, "--param", "head_dim=8")
    assert code == 2 and "--param does not apply to --gguf" in err
    code, _, err = run(capsys, "inspect", "--gguf", "  ")
    assert code == 2 and "--gguf must not be empty" in err


@pytest.mark.real_model
@pytest.mark.parametrize(
    ("name", "lines"),
    [
        (
            "smollm2",
            [
                "architecture: llama, context length 8192, 30 layers",
                "layer type all (30 layers: 0-29):",
                "layout: interleaved for the GGUF tensors as stored, half for the weights "
                "as transformers loads them",
            ],
        ),
        (
            "gemma3",
            [
                "architecture: gemma3, context length 32768, 18 layers",
                "layer type sliding_attention (15 layers: 0-4, 6-10, 12-16):",
                "layer type full_attention (3 layers: 5, 11, 17):",
            ],
        ),
    ],
)
def test_inspect_real_file(capsys, name, lines):
    path = _real_models.require(name)
    code, out, err = run(capsys, "inspect", "--gguf", str(path))
    assert code in (0, None), err
    for line in lines:
        assert line in out, line


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_huge_block_count_is_refused_naming_the_key(capsys, tmp_path, arch):
    """Each layer is listed: block_count = 2**32 - 1 would loop for hours; refused in one
    line naming the key, before the layers are read (issue 24)."""
    keys = {**_BASIC, "block_count": 2**32 - 1, "rope.freq_base": 1e4}
    path = write_gguf(tmp_path / "m.gguf", arch, keys)
    code, out, err = run(capsys, "inspect", "--gguf", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert f"{arch}.block_count must be at most 65536" in err and str(2**32 - 1) in err


def test_a_long_metadata_list_prints_summarised(capsys, tmp_path):
    """Phi-3's LongRoPE factor tensors print as a count, a range and the first values; the
    config line leaves the scaling to the lines above it (issue 24)."""
    code, out, err = run(capsys, "inspect", "--gguf", str(_file(tmp_path, "phi3_longrope")))
    assert code == 0, err
    assert max(map(len, out.splitlines())) <= 200, max(out.splitlines(), key=len)
    assert " values in [" in out and '"scaling": "longrope (as above)"' in out
