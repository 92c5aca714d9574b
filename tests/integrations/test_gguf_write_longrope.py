"""LongRoPE's factors written into a GGUF copy (``write_longrope_gguf``) and the tensors of
``write_scaled_gguf``: llama.cpp's keys and tensors, read back by ``rotary_from_gguf`` as the
scaling written (float32 factors exactly), every other tensor's bytes unchanged, a bad
factor or architecture refused with nothing written."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.extend._tiny import tiny_llama_gguf

from posenc import PosEncError, RotaryEmbedding
from posenc.integrations.gguf import gguf_rope_metadata, rotary_from_gguf
from posenc.integrations.gguf_longrope import write_longrope_gguf
from posenc.integrations.gguf_write import write_scaled_gguf
from posenc.rotary.frequencies import LongRopeScaling

gguf = pytest.importorskip("gguf")

L, TARGET = 512, 1024  # the tiny file's context; head size 8: 4 rotated pairs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", context=L)


def _scaling(long: tuple[float, ...], **extra: Any) -> LongRopeScaling:
    return LongRopeScaling(
        short_factor=(1.0,) * len(long),
        long_factor=long,
        original_max_position=L,
        factor=TARGET / L,
        **extra,
    )


def _f32(values: Any) -> tuple[float, ...]:
    return tuple(np.asarray(values, dtype=np.float32).astype(np.float64).tolist())


def _tensors(path: Path) -> dict[str, tuple[int, str]]:
    """Each tensor's GGML type and the SHA-256 of its bytes."""
    reader = gguf.GGUFReader(path)
    return {
        t.name: (
            int(t.tensor_type),
            hashlib.sha256(np.ascontiguousarray(t.data).tobytes()).hexdigest(),
        )
        for t in reader.tensors
    }


FACTORS = {
    "float32": (1.0, 1.25, 1.75, 2.0),
    "not-float32": (1.0, 1.1, 1.3, 2.2),
    "flat": (2.0, 2.0, 2.0, 2.0),
}


@pytest.mark.parametrize("long", list(FACTORS.values()), ids=list(FACTORS))
def test_the_copy_reads_back_as_the_scaling_written(
    tiny: Path, tmp_path: Path, long: tuple
) -> None:
    copy = tmp_path / "copy.gguf"
    write_longrope_gguf(tiny, copy, _scaling(long), target=TARGET)
    back = rotary_from_gguf(copy, layout_for="transformers")
    scale = math.sqrt(1 + math.log(TARGET / L) / math.log(L))
    stored = _scaling(_f32(long))
    assert back.scaling == LongRopeScaling(
        short_factor=stored.short_factor,
        long_factor=stored.long_factor,  # float32 in the file: exactly those
        original_max_position=L,
        factor=TARGET / L,
        attention_factor=float(np.float32(scale)),
    )
    measured = RotaryEmbedding(8, base=1e4, layout="half", scaling=stored)
    positions = torch.arange(TARGET)[None]
    tolerance = 4 * TARGET * 2.0**-24  # posenc.extend.emit.tolerance for float32 keys
    for ours, theirs in zip(
        measured.cos_sin(positions, dtype=torch.float64),
        back.cos_sin(positions, dtype=torch.float64),
    ):
        torch.testing.assert_close(theirs, ours, atol=tolerance, rtol=0)


def test_the_copy_holds_llama_cpps_longrope_keys_and_float32_tensors(
    tiny: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy.gguf"
    done = write_longrope_gguf(tiny, copy, _scaling(FACTORS["not-float32"]), target=TARGET)
    held = gguf_rope_metadata(copy)
    assert held["llama.context_length"] == TARGET
    assert held["llama.rope.scaling.type"] == "longrope"
    assert held["llama.rope.scaling.original_context_length"] == L
    assert held["llama.rope.scaling.attn_factor"] == float(
        np.float32(math.sqrt(1 + math.log(2) / math.log(L)))
    )
    assert "llama.rope.scaling.factor" not in held  # llama.cpp would divide every frequency
    assert held["rope_factors_long.weight"] == list(_f32(FACTORS["not-float32"]))
    assert held["rope_factors_short.weight"] == [1.0] * 4
    before, after = _tensors(tiny), _tensors(copy)
    added = {"rope_factors_long.weight", "rope_factors_short.weight"}
    assert set(after) == set(before) | added and done["tensors"] == len(before) + 2
    assert {n: after[n] for n in before} == before  # every weight's bytes as they were
    assert {after[n][0] for n in added} == {int(gguf.GGMLQuantizationType.F32)}


def test_a_transformers_spelled_scaling_writes_the_same_copy(tiny: Path, tmp_path: Path) -> None:
    long = FACTORS["float32"]
    spelled = {
        "rope_type": "longrope",
        "short_factor": [1.0] * 4,
        "long_factor": list(long),
        "original_max_position_embeddings": L,
        "factor": TARGET / L,
    }
    a = write_longrope_gguf(tiny, tmp_path / "a.gguf", _scaling(long), target=TARGET)
    b = write_longrope_gguf(tiny, tmp_path / "b.gguf", spelled, target=TARGET)
    assert a["tensor_sha256"] == b["tensor_sha256"] and a["set"] == b["set"]


def test_an_input_s_own_scaling_is_replaced(tiny: Path, tmp_path: Path) -> None:
    """A file with YaRN keys and Llama 3's ``rope_freqs`` (which llama.cpp would take over
    the long factors) and an old LongRoPE pair: the copy says the new LongRoPE alone."""
    own = tmp_path / "own.gguf"
    rope = "llama.rope.scaling."
    write_scaled_gguf(
        tiny,
        own,
        {rope + "type": "yarn", rope + "factor": 4.0, rope + "yarn_beta_fast": 16.0},
        tensors={"rope_freqs.weight": [1.0, 1.0, 2.0, 4.0], "rope_factors_long.weight": [3.0] * 4},
    )
    copy = tmp_path / "copy.gguf"
    write_longrope_gguf(own, copy, _scaling(FACTORS["float32"]), target=TARGET)
    held = gguf_rope_metadata(copy)
    assert sorted(k for k in held if k.startswith(rope)) == [
        rope + "attn_factor",
        rope + "original_context_length",
        rope + "type",
    ]
    assert "rope_freqs.weight" not in held
    assert held["rope_factors_long.weight"] == list(FACTORS["float32"])
    names = [t.name for t in gguf.GGUFReader(copy).tensors]
    assert (
        names.index("rope_factors_long.weight")
        == [t.name for t in gguf.GGUFReader(own).tensors].index("rope_factors_long.weight") - 1
    )  # in place (rope_freqs, before it, removed)


def test_the_copy_loads_in_transformers(tiny: Path, tmp_path: Path) -> None:
    import transformers

    write_longrope_gguf(tiny, tmp_path / "copy.gguf", _scaling(FACTORS["flat"]), target=TARGET)
    ours = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="copy.gguf")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tiny.parent, gguf_file=tiny.name)
    for (name, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def _qwen2(folder: Path) -> Path:
    path = folder / "qwen2.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(L)
    writer.add_embedding_length(32)
    writer.add_block_count(1)
    writer.add_head_count(4)
    writer.add_rope_freq_base(1e4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


BAD = {
    "nan": ({"long_factor": (1.0, math.nan, 2.0, 2.0)}, "long_factor"),
    "inf": ({"long_factor": (1.0, 1.0, math.inf, 2.0)}, "long_factor"),
    "zero": ({"long_factor": (0.0, 1.0, 1.0, 2.0)}, "long_factor"),
    "negative": ({"long_factor": (1.0, 1.0, 1.0, -2.0)}, "long_factor"),
    "short-nan": ({"short_factor": (math.nan, 1.0, 1.0, 1.0)}, "short_factor"),
    "count": ({"long_factor": (1.0, 2.0), "short_factor": (1.0, 1.0)}, "long_factor must hold"),
    "not-longrope": ({"type": "yarn"}, "longrope"),
    "rope_theta": ({"rope_theta": 1e4}, "rope_theta"),
}


@pytest.mark.parametrize(("change", "named"), list(BAD.values()), ids=list(BAD))
def test_a_bad_scaling_is_refused_and_nothing_written(
    tiny: Path, tmp_path: Path, change: dict, named: str
) -> None:
    spec: dict[str, Any] = {
        "type": "longrope",
        "short_factor": (1.0,) * 4,
        "long_factor": FACTORS["float32"],
        "original_max_position": L,
        "factor": 2.0,
    }
    if change.get("type") == "yarn":
        spec = {"type": "yarn", "factor": 2.0, "original_max_position": L}
    elif "rope_theta" in change:
        spec = {"rope_type": "longrope", **{k: v for k, v in spec.items() if k != "type"}, **change}
    else:
        spec.update(change)
    with pytest.raises(PosEncError, match=named):
        write_longrope_gguf(tiny, tmp_path / "copy.gguf", spec, target=TARGET)
    assert list(tmp_path.iterdir()) == []


def test_an_architecture_llama_cpp_reads_no_factors_for_is_refused(tmp_path: Path) -> None:
    src = _qwen2(tmp_path)
    with pytest.raises(PosEncError, match=r"only for the architectures .* got 'qwen2'"):
        write_longrope_gguf(
            src, tmp_path / "copy.gguf", _scaling(FACTORS["float32"]), target=TARGET
        )
    assert not (tmp_path / "copy.gguf").exists()


@pytest.mark.parametrize("target", [0, -5, 1.5, "1024"])
def test_a_bad_target_is_refused(tiny: Path, tmp_path: Path, target: Any) -> None:
    with pytest.raises(PosEncError, match="target"):
        write_longrope_gguf(tiny, tmp_path / "copy.gguf", _scaling(FACTORS["flat"]), target=target)


TENSORS = {
    "nan": ({"x.weight": [1.0, math.nan]}, r"tensors\['x.weight'\] must hold numbers finite"),
    "float32-overflow": ({"x.weight": [1e39]}, "finite in float32"),
    "2-d": ({"x.weight": [[1.0, 2.0]]}, "1-D"),
    "empty": ({"x.weight": []}, "non-empty"),
    "text": ({"x.weight": ["a"]}, "list of numbers"),
    "name": ({"": [1.0]}, "tensors keys"),
    "long-name": ({"x" * 64: [1.0]}, "tensors keys"),
    "not-a-mapping": ([1.0], "tensors must be a mapping"),
}


@pytest.mark.parametrize(("tensors", "named"), list(TENSORS.values()), ids=list(TENSORS))
def test_bad_tensors_are_refused_naming_them(
    tiny: Path, tmp_path: Path, tensors: Any, named: str
) -> None:
    with pytest.raises(PosEncError, match=named):
        write_scaled_gguf(tiny, tmp_path / "copy.gguf", {}, tensors=tensors)
    assert list(tmp_path.iterdir()) == []


def test_tensors_are_added_replaced_and_removed(tiny: Path, tmp_path: Path) -> None:
    first = tmp_path / "first.gguf"
    write_scaled_gguf(tiny, first, {}, tensors={"extra.weight": [1.5, 2.5], "output.weight": None})
    names = [t.name for t in gguf.GGUFReader(first).tensors]
    assert names[-1] == "extra.weight" and "output.weight" not in names
    second = tmp_path / "second.gguf"
    write_scaled_gguf(first, second, {}, tensors={"extra.weight": [3.0]})
    reader = gguf.GGUFReader(second)
    assert [t.name for t in reader.tensors] == names
    np.testing.assert_array_equal(reader.tensors[-1].data, np.array([3.0], dtype=np.float32))
