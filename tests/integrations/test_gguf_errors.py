"""``rotary_from_gguf``'s refusals (one line, naming the file, the key or the value) and the
header reader on files ``gguf.GGUFWriter`` writes, or bytes written here by hand."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest

import posenc
from posenc.integrations._gguf_file import open_gguf
from posenc.integrations.gguf import gguf_rope_metadata, rotary_from_gguf

from .test_gguf import _BASIC, write_gguf

gguf = pytest.importorskip("gguf")

_LLAMA = {**_BASIC, "rope.freq_base": 1e4}

REFUSED = [
    ("gpt2", "gpt2", {**_BASIC}, {}, "architecture 'gpt2' has no RoPE (learned absolute"),
    ("bert", "bert", {**_BASIC}, {}, "architecture 'bert' has no RoPE (learned absolute"),
    ("bloom", "bloom", {**_BASIC}, {}, "has no RoPE (ALiBi)"),
    ("mamba", "mamba", {**_BASIC}, {}, "has no RoPE (a recurrent model"),
    ("t5", "t5", {**_BASIC}, {}, "has no RoPE (T5 relative position buckets)"),
    ("llama4_nope_layers", "llama4", {**_LLAMA}, {}, "does not read its per-layer RoPE"),
    ("unknown_arch", "notanarch", {**_LLAMA}, {}, "does not know llama.cpp's RoPE of it"),
    (
        "no_context_length",
        "llama",
        {k: v for k, v in _LLAMA.items() if k != "context_length"},
        {},
        "missing the key 'llama.context_length'",
    ),
    (
        "no_block_count",
        "llama",
        {k: v for k, v in _LLAMA.items() if k != "block_count"},
        {},
        "missing the key 'llama.block_count'",
    ),
    (
        "no_head_size",
        "llama",
        {k: v for k, v in _LLAMA.items() if k != "attention.head_count"},
        {},
        "missing the key 'llama.attention.key_length'",
    ),
    (
        "unknown_scaling_type",
        "llama",
        {**_LLAMA, "rope.scaling.type": "dynamic"},
        {},
        "rope.scaling.type (llama.cpp's names) must be one of 'none', 'linear', 'yarn', "
        "'longrope', got 'dynamic'",
    ),
    (
        "factor_below_one",
        "llama",
        {**_LLAMA, "rope.scaling.factor": 0.5},
        {},
        "llama.rope.scaling.factor must be >= 1.0, got 0.5",
    ),
    (
        "base_not_above_one",
        "llama",
        {**_LLAMA, "rope.freq_base": 0.5},
        {},
        "llama.rope.freq_base must be > 1.0, got 0.5",
    ),
    (
        "odd_rotary_dim",
        "phi2",
        {**_LLAMA, "rope.dimension_count": 31},
        {},
        "rope.dimension_count must be even and at most the head size 64, got 31",
    ),
    (
        "rotary_dim_past_head",
        "phi2",
        {**_LLAMA, "rope.dimension_count": 128},
        {},
        "at most the head size 64, got 128",
    ),
    (
        "longrope_without_tensors",
        "phi3",
        {**_LLAMA, "rope.scaling.type": "longrope"},
        {},
        "'longrope' needs the tensors rope_factors_long.weight and rope_factors_short.weight",
    ),
    (
        "longrope_one_tensor",
        "phi3",
        {**_LLAMA},
        {"rope_factors_long.weight": np.ones(32)},
        "needs both tensors",
    ),
    (
        "yarn_over_freq_factors",
        "llama",
        {**_LLAMA, "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0},
        {"rope_freqs.weight": np.ones(32)},
        "a YaRN ramp over per-frequency factors",
    ),
    (
        "ext_factor_half",
        "grok",
        {
            **_LLAMA,
            "rope.scaling.type": "yarn",
            "rope.scaling.factor": 4.0,
            "rope.scaling.yarn_ext_factor": 0.5,
        },
        {},
        "yarn_ext_factor must be 0 or 1 for posenc",
    ),
    (
        "attn_factor_on_linear",
        "llama",
        {**_LLAMA, "rope.scaling.factor": 2.0, "rope.scaling.attn_factor": 1.5},
        {},
        "an attention factor (llama.rope.scaling.attn_factor * yarn_attn_factor = 1.5) on "
        "'linear' scaling",
    ),
    (
        "ntk_alpha",
        "hunyuan-dense",
        {**_LLAMA, "rope.scaling.alpha": 1000.0},
        {},
        "Hunyuan's NTK-aware alpha",
    ),
    (
        "freqs_wrong_length",
        "llama",
        {**_LLAMA},
        {"rope_freqs.weight": np.ones(10)},
        "tensor rope_freqs.weight must hold n_rot / 2 = 32 factors",
    ),
    (
        "freqs_not_positive",
        "llama",
        {**_LLAMA},
        {"rope_freqs.weight": -np.ones(32)},
        "must hold positive finite factors",
    ),
    ("mrope_without_sections", "qwen2vl", {**_LLAMA}, {}, "rope.dimension_sections"),
    (
        "sections_wrong_sum",
        "qwen2vl",
        {**_LLAMA, "rope.dimension_sections": [8, 8, 8, 0]},
        {},
        "must sum to n_rot / 2 = 32, got [8, 8, 8]",
    ),
    (
        "section_gap",
        "qwen2vl",
        {**_LLAMA, "rope.dimension_sections": [16, 0, 16]},
        {},
        "must have no empty section before the last",
    ),
    (
        "swa_pattern_length",
        "gemma3",
        {
            **_LLAMA,
            "attention.sliding_window": 512,
            "attention.sliding_window_pattern": [True, False, True],
        },
        {},
        "sliding_window_pattern must hold one flag per layer (2), got 3",
    ),
]


@pytest.mark.parametrize(
    ("name", "arch", "keys", "tensors", "message"), REFUSED, ids=[r[0] for r in REFUSED]
)
def test_refused_in_one_line(tmp_path, name, arch, keys, tensors, message):
    path = write_gguf(tmp_path / f"{name}.gguf", arch, keys, tensors)
    with pytest.raises(posenc.PosEncError) as info:
        rotary_from_gguf(path)
    text = str(info.value)
    assert "\n" not in text and text.startswith(repr(str(path))), text
    assert message in text, text


def _gemma(tmp_path: Path) -> Path:
    return write_gguf(
        tmp_path / "g.gguf",
        "gemma3",
        {**_LLAMA, "block_count": 12, "rope.freq_base": 1e6, "attention.sliding_window": 512},
    )


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        (None, "layer must be given for"),
        (12, "layer must be <= 11, got 12"),
        (-1, "layer must be >= 0, got -1"),
        (1.5, "layer must be an integer, got 1.5"),
        (True, "layer must be an integer, got True"),
        ("global", "layer must be a layer index or a layer type of"),
    ],
)
def test_bad_layer(tmp_path, layer, message):
    with pytest.raises(posenc.PosEncError) as info:
        rotary_from_gguf(_gemma(tmp_path), layer=layer)
    assert message in str(info.value)


def test_layer_without_rope(tmp_path):
    path = write_gguf(
        tmp_path / "c.gguf",
        "cohere2",
        {**_LLAMA, "block_count": 8, "attention.sliding_window": 4096},
    )
    assert rotary_from_gguf(path).to_config() == rotary_from_gguf(path, layer=0).to_config()
    for layer in (3, 7, "full_attention"):
        with pytest.raises(posenc.PosEncError, match="has no RoPE"):
            rotary_from_gguf(path, layer=layer)


def test_layer_type_name_on_a_uniform_file(tmp_path):
    path = write_gguf(tmp_path / "l.gguf", "llama", _LLAMA)
    with pytest.raises(posenc.PosEncError, match=r"None \(one type\); got 'full_attention'"):
        rotary_from_gguf(path, layer="full_attention")


def test_bad_layout_for(tmp_path):
    path = write_gguf(tmp_path / "l.gguf", "llama", _LLAMA)
    with pytest.raises(
        posenc.PosEncError, match="layout_for must be one of 'gguf', 'transformers', got 'hf'"
    ):
        rotary_from_gguf(path, layout_for="hf")


# --- the file itself ---------------------------------------------------------------------


def _header(version: int = 3, keys: list[bytes] = (), order: str = "<") -> bytes:
    """A GGUF header with no tensors and the given encoded key-value pairs."""
    out = b"GGUF" + struct.pack(order + "IQQ", version, 0, len(keys))
    return out + b"".join(keys)


def _string(text: str, order: str = "<") -> bytes:
    data = text.encode()
    return struct.pack(order + "Q", len(data)) + data


def _kv_string(key: str, value: str) -> bytes:
    return _string(key) + struct.pack("<I", 8) + _string(value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a gguf file at all, just text", "is not a GGUF file: it starts with b'not '"),
        (b"GGU", "is not a GGUF file"),
        (b"GGUF\x03\x00", "cannot be read: it ends inside its header"),
        (_header(version=1), "is GGUF version 1; posenc reads versions 2 and 3"),
        (
            _header(keys=[_string("general.architecture") + struct.pack("<I", 99)]),
            "its header ends early or does not parse",
        ),
        (
            _header(keys=[_kv_string("general.architecture", "llama")])[:-3],
            "its header ends early or does not parse",
        ),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 2**40), "its header ends early or does not parse"),
        (_header(keys=[_kv_string("general.name", "x")]), "has no general.architecture key"),
    ],
    ids=["text", "short", "truncated", "version1", "bad_type", "cut", "huge_count", "no_arch"],
)
def test_bad_file_in_one_line(tmp_path, content, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(posenc.PosEncError) as info:
        rotary_from_gguf(path)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert repr(str(path)) in str(info.value)


def test_missing_file_and_directory(tmp_path):
    for target in (tmp_path / "absent.gguf", tmp_path):
        with pytest.raises(posenc.PosEncError, match="must be an existing GGUF file"):
            rotary_from_gguf(target)
        with pytest.raises(posenc.PosEncError, match="must be an existing GGUF file"):
            gguf_rope_metadata(target)


def test_not_a_path_nor_a_reader():
    with pytest.raises(
        posenc.PosEncError,
        match=re.escape(
            "path_or_reader must be a path to a GGUF file or a gguf.GGUFReader, got int"
        ),
    ):
        rotary_from_gguf(3)


def test_header_reader_agrees_with_gguf_reader(tmp_path):
    """Every key and every float tensor read as gguf's own reader reads them, string
    arrays skipped (a tokenizer's vocabulary), big-endian files too."""
    for order, endian in (("<", gguf.GGUFEndian.LITTLE), (">", gguf.GGUFEndian.BIG)):
        path = tmp_path / f"m{order == '>'}.gguf"
        writer = gguf.GGUFWriter(str(path), "llama", endianess=endian)
        writer.add_context_length(4096)
        writer.add_rope_freq_base(5e5)
        writer.add_token_list([f"tok{i}" for i in range(5000)])
        writer.add_token_scores([float(i) for i in range(5000)])
        writer.add_array("llama.rope.dimension_sections", [1, 2, 3])
        writer.add_bool("llama.flag", True)
        writer.add_tensor("rope_freqs.weight", np.arange(1, 33, dtype=np.float32))
        writer.add_tensor("a.weight", np.arange(6, dtype=np.float16).reshape(2, 3))
        writer.add_tensor("b.weight", np.full((3, 7), 0.5, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        src, reader = open_gguf(path), gguf.GGUFReader(str(path))
        assert src.get("general.architecture") == "llama"
        assert src.get("llama.context_length") == 4096 and src.get("llama.rope.freq_base") == 5e5
        assert src.get("llama.rope.dimension_sections") == [1, 2, 3]
        assert src.get("llama.flag") is True
        assert src.get("tokenizer.ggml.tokens").count == 5000
        assert src.get("tokenizer.ggml.scores").count == 5000
        for tensor in reader.tensors:
            np.testing.assert_array_equal(src.tensor(tensor.name), np.asarray(tensor.data).ravel())
        assert src.tensor("absent.weight") is None


def test_quantized_rope_tensor_refused(tmp_path):
    path = tmp_path / "q.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in _LLAMA.items():
        (writer.add_uint32 if isinstance(value, int) else writer.add_float32)(f"llama.{key}", value)
    data = gguf.quants.quantize(np.ones((1, 32), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("rope_freqs.weight", data, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    # a path and a gguf.GGUFReader are read by the one reader, and refused alike
    for source, name in ((path, repr(str(path))), (gguf.GGUFReader(str(path)), "the GGUFReader")):
        with pytest.raises(
            posenc.PosEncError,
            match=rf"^{re.escape(name)}: tensor 'rope_freqs.weight' has ggml type 8; posenc "
            r"reads F32 or F16 RoPE tensors only",
        ):
            rotary_from_gguf(source)


def _hostile_reader(tmp_path, data):
    """A real gguf.GGUFReader whose memory map is replaced by ``data``: a header the
    reader itself would refuse, handed to posenc through the reader."""
    path = tmp_path / "r.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    reader = gguf.GGUFReader(str(path))
    reader.data = data
    return reader


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (np.frombuffer(b"GGUF" + struct.pack("<I", 3) + b"\x00" * 3, np.uint8), "ends early"),
        # a header claiming 2^60 keys, and an array of 2^60 values: refused, never read
        (
            np.frombuffer(b"GGUF" + struct.pack("<IQQ", 3, 0, 2**60), np.uint8),
            "ends early or does not parse",
        ),
        (
            np.frombuffer(
                b"GGUF"
                + struct.pack("<IQQQ", 3, 0, 1, 1)
                + b"k"
                + struct.pack("<IIQ", 9, 6, 2**60),
                np.uint8,
            ),
            "ends early or does not parse",
        ),
        (np.frombuffer(b"ggml" + b"\x00" * 40, np.uint8), "is not a GGUF file"),
    ],
    ids=["short", "keys-2pow60", "array-2pow60", "magic"],
)
def test_a_readers_bytes_are_held_to_the_paths_rules(tmp_path, data, message):
    with pytest.raises(posenc.PosEncError, match=rf"^the GGUFReader .*{message}"):
        rotary_from_gguf(_hostile_reader(tmp_path, data))


@pytest.mark.parametrize(
    "data",
    [np.zeros(64, np.float32), np.zeros((8, 8), np.uint8), np.zeros(128, np.uint8)[::2], None],
    ids=["float32", "2-d", "strided", "none"],
)
def test_a_reader_without_its_bytes_is_refused(tmp_path, data):
    with pytest.raises(
        posenc.PosEncError,
        match=r"^path_or_reader must be a path to a GGUF file or a gguf.GGUFReader, got GGUFReader$",
    ):
        rotary_from_gguf(_hostile_reader(tmp_path, data))
