"""``posenc extend --emit`` on a tiny random Llama written as a GGUF file by the ``gguf``
package and on tiny transformers folders (every run; nothing mocked but posenc's own
spelling, where a wrong one must be caught): the GGUF copy (tensor bytes, keys, safety),
every engine's artifact for every scaling, read back against the measured module."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gguf")

import gguf
import transformers
from tests.extend._tiny import tiny_gemma3, tiny_llama, tiny_llama_gguf

from posenc import PosEncError
from posenc.extend import emit
from posenc.extend.emit import check_emit, default_engines, tolerance, write_emit
from posenc.extend.model import Loaded, load_model, scaled, scaling_for
from posenc.integrations import engines
from posenc.integrations.gguf import gguf_rope_metadata, rotary_from_gguf
from posenc.integrations.gguf_write import FREE_MARGIN, write_scaled_gguf
from posenc.integrations.transformers import PatchedRotaryEmbedding, rotary_from_config, unpatch

TARGET = 1024  # twice the tiny models' trained context
FACTORED = ("linear", "ntk", "yarn", "dynamic")
#: The engines that cannot take dynamic NTK (vLLM's and SGLang's are a table fixed at one
#: length; llama.cpp has none).
NO_DYNAMIC = ("vllm", "sglang", "llama.cpp", "gguf", "ollama")


def _file_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tensor_sha(path: Path) -> str:
    digest = hashlib.sha256()
    for tensor in gguf.GGUFReader(path).tensors:
        digest.update(np.ascontiguousarray(tensor.data).tobytes())
    return digest.hexdigest()


def _fields(path: Path) -> dict[str, tuple[list[int], Any]]:
    return {
        name: ([int(t) for t in f.types], f.contents())
        for name, f in gguf.GGUFReader(path).fields.items()
        if not name.startswith("GGUF.")
    }


def _load(path: Path) -> Loaded:
    return load_model(path, dtype="float32", device="cpu", context=None)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def gguf_model(tiny_gguf: Path) -> Loaded:
    return _load(tiny_gguf)


@pytest.fixture(scope="module")
def yarn_gguf(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    """A GGUF file with its own scaling (YaRN factor 8 of 128 tokens): ``config``."""
    path = tmp_path_factory.mktemp("yarn-gguf") / "tiny-yarn.gguf"
    keys = {
        "llama.rope.scaling.type": "yarn",
        "llama.rope.scaling.factor": 8.0,
        "llama.rope.scaling.original_context_length": 128,
    }
    write_scaled_gguf(tiny_gguf, path, keys)
    return _load(path)


@pytest.fixture(scope="module")
def folder_model(tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    return _load(tiny_llama(tmp_path_factory.mktemp("llama")))


@pytest.fixture(scope="module")
def linear_folder(tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    """A model folder whose config has its own scaling (linear factor 2): ``config``."""
    folder = tiny_llama(tmp_path_factory.mktemp("llama-linear"))
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}
    (folder / "config.json").write_text(json.dumps(config))
    return _load(folder)


@pytest.fixture(scope="module")
def gemma_model(tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    return _load(tiny_gemma3(tmp_path_factory.mktemp("gemma3")))


# --- the tiny GGUF file -------------------------------------------------------------------------


def test_tiny_gguf_loads_in_transformers_with_its_tokenizer(
    tiny_gguf: Path, gguf_model: Loaded
) -> None:
    assert tiny_gguf.stat().st_size < 1 << 20
    keys = gguf_rope_metadata(tiny_gguf)
    assert not [k for k in keys if "scaling" in k]
    assert (gguf_model.trained, type(gguf_model.model).__name__) == (512, "LlamaForCausalLM")
    text = "def f(x):\n    return x + 1  # é"
    ids = gguf_model.tokenizer(text)["input_ids"]
    assert ids[0] == 1  # BOS
    assert gguf_model.tokenizer.decode(ids, skip_special_tokens=True).strip() == text
    with torch.no_grad():
        logits = gguf_model.model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 260) and torch.isfinite(logits).all()


def test_tiny_gguf_stores_q_and_k_as_llama_cpp_rotates_them(
    tiny_gguf: Path, gguf_model: Loaded
) -> None:
    """q . k after RoPE: the file's permuted tensors with llama.cpp's pairing equal
    transformers' un-permuted weights with its own."""
    stored = {
        t.name: torch.from_numpy(np.array(t.data)) for t in gguf.GGUFReader(tiny_gguf).tensors
    }
    attention = gguf_model.model.model.layers[0].self_attn
    x = torch.randn(1, 7, 32, dtype=torch.float64)
    positions = torch.arange(7)
    scores = []
    for layout, wq, wk in (
        ("gguf", stored["blk.0.attn_q.weight"], stored["blk.0.attn_k.weight"]),
        ("transformers", attention.q_proj.weight, attention.k_proj.weight),
    ):
        rope = rotary_from_gguf(tiny_gguf, layout_for=layout)
        q = (x @ wq.double().T).view(1, 7, 4, 8).transpose(1, 2)
        k = (x @ wk.double().T).view(1, 7, 2, 8).transpose(1, 2).repeat_interleave(2, dim=1)
        q, k = rope(q, k, positions)
        scores.append(q @ k.transpose(-1, -2))
    torch.testing.assert_close(scores[0], scores[1], rtol=1e-12, atol=1e-12)


# --- write_scaled_gguf --------------------------------------------------------------------------

YARN_KEYS = {
    "llama.context_length": 1024,
    "llama.rope.scaling.type": "yarn",
    "llama.rope.scaling.factor": 2.0,
    "llama.rope.scaling.original_context_length": 512,
}


def test_the_copy_has_the_keys_asked_the_same_tensor_bytes_and_the_input_untouched(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    before = _file_sha(tiny_gguf)
    dst = tmp_path / "yarn.gguf"
    done = write_scaled_gguf(tiny_gguf, dst, YARN_KEYS)
    assert _file_sha(tiny_gguf) == before
    assert done == {
        "src": str(tiny_gguf),
        "dst": str(dst),
        "tensors": 21,
        "set": YARN_KEYS,
        "bytes": dst.stat().st_size,
        "tensor_sha256": _tensor_sha(tiny_gguf),
    }
    assert _tensor_sha(dst) == _tensor_sha(tiny_gguf)
    old, new = _fields(tiny_gguf), _fields(dst)
    assert {k: v for k, v in new.items() if k not in YARN_KEYS} == {
        k: v for k, v in old.items() if k not in YARN_KEYS
    }
    uint32, float32, string = 4, 6, 8
    assert {k: new[k] for k in YARN_KEYS} == {
        "llama.context_length": ([uint32], 1024),
        "llama.rope.scaling.type": ([string], "yarn"),
        "llama.rope.scaling.factor": ([float32], 2.0),
        "llama.rope.scaling.original_context_length": ([uint32], 512),
    }
    assert [t.name for t in gguf.GGUFReader(dst).tensors] == [
        t.name for t in gguf.GGUFReader(tiny_gguf).tensors
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["yarn.gguf"]  # no temporary left


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(7, ([4], 7), id="int-uint32"),
        pytest.param(-7, ([5], -7), id="negative-int32"),
        pytest.param(1.5, ([6], 1.5), id="float-float32"),
        pytest.param(True, ([7], True), id="bool"),
        pytest.param("x", ([8], "x"), id="str"),
        pytest.param(np.float64(0.1), ([12], 0.1), id="numpy-float64"),
        pytest.param(np.uint64(2**40), ([10], 2**40), id="numpy-uint64"),
        pytest.param(gguf.RopeScalingType.YARN, ([8], "yarn"), id="enum"),
    ],
)
def test_a_new_key_is_typed_as_llama_cpp_reads_it(
    tiny_gguf: Path, tmp_path: Path, value: Any, expected: tuple
) -> None:
    dst = tmp_path / "typed.gguf"
    write_scaled_gguf(tiny_gguf, dst, {"llama.posenc.test": value})
    assert _fields(dst)["llama.posenc.test"] == expected


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [
        pytest.param(5, "UINT64", ([10], 5), id="int-as-uint64"),
        pytest.param(2, "FLOAT32", ([6], 2.0), id="int-as-float32"),
        pytest.param(np.float64(0.5), "FLOAT32", ([6], 0.5), id="numpy-as-float32"),
        pytest.param("yarn", "STRING", ([8], "yarn"), id="string"),
    ],
)
def test_types_given_win(
    tiny_gguf: Path, tmp_path: Path, value: Any, kind: str, expected: tuple
) -> None:
    dst = tmp_path / "typed.gguf"
    write_scaled_gguf(
        tiny_gguf, dst, {"llama.context_length": value}, types={"llama.context_length": kind}
    )
    assert _fields(dst)["llama.context_length"] == expected


@pytest.mark.parametrize(
    ("value", "kind", "message"),
    [
        pytest.param(5, "STRING", r"must be a STRING value, got int 5", id="int-as-string"),
        pytest.param("x", "UINT32", r"must be a UINT32 value, got str 'x'", id="str-as-uint32"),
        pytest.param(
            5, "ARRAY", r"types\['llama.k'\] must name a scalar GGUF value type", id="array"
        ),
        pytest.param(
            5, "UINT24", r"types\['llama.k'\] must name a scalar GGUF value type", id="unknown"
        ),
    ],
)
def test_a_value_that_is_not_of_the_type_given_is_refused(
    tiny_gguf: Path, tmp_path: Path, value: Any, kind: str, message: str
) -> None:
    with pytest.raises(PosEncError, match=message):
        write_scaled_gguf(
            tiny_gguf, tmp_path / "out.gguf", {"llama.k": value}, types={"llama.k": kind}
        )
    assert list(tmp_path.iterdir()) == []


def test_a_key_replaced_keeps_its_type_and_none_removes_one(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "edited.gguf"
    done = write_scaled_gguf(tiny_gguf, dst, {"llama.rope.freq_base": 20000, "general.name": None})
    assert done["set"] == {"llama.rope.freq_base": 20000.0, "general.name": None}
    fields = _fields(dst)
    assert fields["llama.rope.freq_base"] == ([6], 20000.0)
    assert "general.name" not in fields
    assert list(fields) == [k for k in _fields(tiny_gguf) if k != "general.name"]  # in order


def test_the_copy_loads_in_transformers_with_the_same_weights(
    tiny_gguf: Path, gguf_model: Loaded, tmp_path: Path
) -> None:
    dst = tmp_path / "long.gguf"
    write_scaled_gguf(tiny_gguf, dst, YARN_KEYS)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=dst.name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=dst.name)
    assert model.config.max_position_embeddings == 1024
    assert tokenizer.get_vocab() == gguf_model.tokenizer.get_vocab()
    ours, theirs = gguf_model.model.state_dict(), model.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.parametrize("how", ["same-path", "relative-path", "symlink", "hard-link"])
def test_the_copy_never_overwrites_its_input(tiny_gguf: Path, tmp_path: Path, how: str) -> None:
    src = tmp_path / "model.gguf"
    shutil.copyfile(tiny_gguf, src)
    before = _file_sha(src)
    dst = {
        "same-path": src,
        "relative-path": tmp_path / "sub" / ".." / "model.gguf",
        "symlink": tmp_path / "link.gguf",
        "hard-link": tmp_path / "hard.gguf",
    }[how]
    (tmp_path / "sub").mkdir()
    if how == "symlink":
        dst.symlink_to(src)
    elif how == "hard-link":
        os.link(src, dst)
    with pytest.raises(PosEncError, match="never overwrites its input"):
        write_scaled_gguf(src, dst, YARN_KEYS, overwrite=True)
    assert _file_sha(src) == before


def test_an_existing_output_is_refused_unless_overwrite(tiny_gguf: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out.gguf"
    dst.write_bytes(b"old")
    with pytest.raises(PosEncError, match="exists; choose a new path or pass overwrite=True"):
        write_scaled_gguf(tiny_gguf, dst, YARN_KEYS)
    assert dst.read_bytes() == b"old"
    write_scaled_gguf(tiny_gguf, dst, YARN_KEYS, overwrite=True)
    assert _tensor_sha(dst) == _tensor_sha(tiny_gguf)


@pytest.mark.parametrize(
    ("make", "metadata", "message"),
    [
        pytest.param("dir", YARN_KEYS, "dst must be a file path, got the directory", id="dst-dir"),
        pytest.param("no-folder", YARN_KEYS, "dst folder does not exist", id="no-folder"),
        pytest.param("not-gguf", YARN_KEYS, "is not a GGUF file gguf can read", id="not-gguf"),
        pytest.param("missing", YARN_KEYS, "src must be an existing GGUF file", id="missing"),
        pytest.param(None, {"general.architecture": "qwen2"}, "general.architecture", id="arch"),
        pytest.param(None, {"llama.x": [1, 2]}, r"metadata\['llama.x'\] must be a bool", id="list"),
        pytest.param(
            None, {"llama.context_length": -1}, r"must lie in \[0, 4294967295\]", id="negative"
        ),
        pytest.param(
            None, {"llama.context_length": 1.5}, "must be a whole number, got 1.5", id="fraction"
        ),
        pytest.param(None, [("a", 1)], "metadata must be a mapping", id="not-mapping"),
        pytest.param(
            None, {"no_such_key": 1}, "metadata key 'no_such_key' is not a key", id="no-namespace"
        ),
        pytest.param(
            None,
            {"lama.context_length": 1024},
            "metadata key 'lama.context_length' is not a key of this GGUF file: .* 'llama'",
            id="other-arch",
        ),
        pytest.param(None, {"llama..x": 1}, "metadata key 'llama..x' is not a key", id="empty"),
        pytest.param("dst-name", YARN_KEYS, "dst must be a file name ending in .gguf", id="dst"),
    ],
)
def test_bad_input_is_refused_naming_it(
    tiny_gguf: Path, tmp_path: Path, make: str | None, metadata: Any, message: str
) -> None:
    src, dst = tiny_gguf, tmp_path / "out.gguf"
    if make == "dir":
        dst.mkdir()
    elif make == "no-folder":
        dst = tmp_path / "absent" / "out.gguf"
    elif make == "not-gguf":
        src = tmp_path / "text.gguf"
        src.write_text("not a GGUF file at all")
    elif make == "missing":
        src = tmp_path / "missing.gguf"
    elif make == "dst-name":
        dst = tmp_path / "copy"
    with pytest.raises(PosEncError, match=message):
        write_scaled_gguf(src, dst, metadata)
    assert not (tmp_path / "out.gguf").is_file()


def test_a_read_only_folder_is_the_environments_refusal(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):  # root: the mode does not stop it; the check must
            monkeypatch.setattr(os, "access", lambda path, mode: False)
        with pytest.raises(OSError, match="cannot be written") as info:
            write_scaled_gguf(tiny_gguf, folder / "out.gguf", YARN_KEYS)
        assert info.value.errno == errno.EACCES and info.value.filename == str(folder)
        assert info.value.strerror == "the GGUF copy's folder cannot be written"
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


def test_too_little_free_space_is_refused_before_writing(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need = tiny_gguf.stat().st_size + FREE_MARGIN
    usage = shutil.disk_usage(tmp_path)._replace(free=need - 1)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage)
    with pytest.raises(OSError) as info:
        write_scaled_gguf(tiny_gguf, tmp_path / "out.gguf", YARN_KEYS)
    assert info.value.errno == errno.ENOSPC
    assert info.value.strerror == (
        f"not enough free space for the GGUF copy: it needs {need} bytes (the input's "
        f"{tiny_gguf.stat().st_size} and {FREE_MARGIN} to spare), {need - 1} are free"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_failed_check_leaves_no_file_and_no_temporary(tiny_gguf: Path, tmp_path: Path) -> None:
    seen: list[Path] = []

    def check(path: Path) -> None:
        seen.append(path)
        assert _tensor_sha(path) == _tensor_sha(tiny_gguf)  # the whole file is there to read
        raise PosEncError("refused by the check")

    with pytest.raises(PosEncError, match="refused by the check"):
        write_scaled_gguf(tiny_gguf, tmp_path / "out.gguf", YARN_KEYS, check=check)
    assert seen and seen[0].parent == tmp_path and seen[0].name != "out.gguf"
    assert list(tmp_path.iterdir()) == []


# --- write_emit: every engine, every scaling ---------------------------------------------------


def _measured(loaded: Loaded, scaling: str, factor: float) -> dict[str | None, Any]:
    model = scaled(loaded, scaling_for(scaling, factor, loaded))
    try:
        return next(dict(m.ropes) for m in model.modules() if isinstance(m, PatchedRotaryEmbedding))
    finally:
        unpatch(model)


def _assert_same_tables(ours: Any, theirs: Any, target: int, float32_keys: bool) -> None:
    positions = torch.arange(target)[None]
    bound = (
        0.0
        if ours.to_config() == theirs.to_config()
        else tolerance(target, float32_keys=float32_keys)
    )
    for a, b in zip(
        ours.cos_sin(positions, dtype=torch.float64), theirs.cos_sin(positions, dtype=torch.float64)
    ):
        torch.testing.assert_close(a, b, rtol=0.0, atol=bound)


def _factor(scaling: str) -> float:
    return 1.0 if scaling in ("none", "config") else TARGET / 512


@pytest.fixture(scope="module")
def emitted(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Any]:
    """``(OUT, results["emit"], the model)`` of one model fixture and scaling, every default
    engine written once per module."""
    cache: dict[tuple[str, str], tuple[Path, dict]] = {}

    def get(model: str, scaling: str) -> tuple[Path, dict, Loaded]:
        loaded = request.getfixturevalue(model)
        if (model, scaling) not in cache:
            out = tmp_path_factory.mktemp(f"emit-{model}-{scaling}")
            names = default_engines(loaded.path.is_file())
            cache[model, scaling] = (
                out,
                write_emit(loaded, scaling, _factor(scaling), TARGET, out, names),
            )
        out, results = cache[model, scaling]
        return out, results, loaded

    yield get


GGUF_MODELS = ("gguf_model", "yarn_gguf")
CASES = [
    *((m, s) for m in ("gguf_model", "folder_model") for s in ("none", *FACTORED)),
    ("yarn_gguf", "config"),
    ("yarn_gguf", "linear"),
    ("linear_folder", "config"),
    ("gemma_model", "yarn"),
    ("gemma_model", "ntk"),
]
ENGINE_CASES = [
    pytest.param(m, s, e, id=f"{m}-{s}-{e}")
    for m, s in CASES
    for e in engines.ENGINES
    if e not in emit.NEEDS_GGUF or m in GGUF_MODELS
]


@pytest.mark.parametrize(("model", "scaling", "engine"), ENGINE_CASES)
def test_every_engine_is_written_or_refused_by_name(
    emitted: Any, model: str, scaling: str, engine: str
) -> None:
    out, results, loaded = emitted(model, scaling)
    record = results[engine]
    if scaling == "dynamic" and engine in NO_DYNAMIC:
        assert set(record) == {"refused"}
        assert "dynamic" in record["refused"]
        assert (engine if engine != "ollama" else "gguf") in record["refused"]
        assert not (out / "emit" / engine).exists()
        return
    assert {"files", "command", "settings", "warnings", "checked"} <= set(record)
    assert all((out / f).is_file() for f in record["files"])
    assert all(isinstance(w, str) and "\n" not in w for w in record["warnings"])
    json.dumps(record, allow_nan=False)  # results.json can hold it
    command = record["command"]
    if command is not None:
        assert str(loaded.path.parent) not in command  # no machine path
        shlex.split(command)
    _CHECKS[engine](out, record, loaded, scaling)


def _check_transformers(out: Path, record: dict, loaded: Loaded, scaling: str) -> None:
    assert record["files"] == ["emit/transformers/config.json"]
    config = transformers.AutoConfig.from_pretrained(out / "emit" / "transformers")
    text = config.get_text_config()
    assert text.rope_parameters == record["settings"]["rope_parameters"]
    assert text.max_position_embeddings == record["settings"]["max_position_embeddings"]
    assert "quantization_config" not in json.loads((out / record["files"][0]).read_text())
    measured = _measured(loaded, scaling, _factor(scaling))
    for layer_type in loaded.layer_types:
        theirs = rotary_from_config(text, layer_type=layer_type)
        ours = measured[layer_type] if len(measured) > 1 else measured[None]
        _assert_same_tables(ours, theirs, TARGET, float32_keys=False)
    assert record["checked"].startswith("transformers' config.json: cos/sin over positions 0..1023")


def _check_overrides(name: str, table: dict, out: Path, record: dict) -> None:
    script = (out / record["files"][0]).read_text()
    assert script.startswith("#!/bin/sh\n") and script.rstrip("\n").endswith(record["command"])
    for warning in record["warnings"]:
        assert f"# warning: {warning}" in script
    data = json.loads((out / record["files"][1]).read_text())
    key = "hf_overrides" if name == "vllm" else "json_model_override_args"
    assert data == record["settings"][key]
    assert record["checked"].startswith(f"every key one {name} reads for rope type")
    ropes = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if "rope_type" in value or "type" in value:
                ropes.append(value)
            else:
                for item in value.values():
                    walk(item)

    walk(data)
    assert ropes
    for rope in ropes:
        assert set(rope) <= table[rope.get("rope_type", rope.get("type"))]


def _check_vllm(out: Path, record: dict, loaded: Loaded, scaling: str) -> None:
    assert record["files"] == ["emit/vllm/command.sh", "emit/vllm/hf_overrides.json"]
    _check_overrides("vllm", engines.VLLM_KEYS, out, record)


def _check_sglang(out: Path, record: dict, loaded: Loaded, scaling: str) -> None:
    assert record["files"] == ["emit/sglang/command.sh", "emit/sglang/override.json"]
    _check_overrides("sglang", engines.SGLANG_KEYS, out, record)


def _check_llama_cpp(out: Path, record: dict, loaded: Loaded, scaling: str) -> None:
    assert record["files"] == ["emit/llama.cpp/command.sh"]
    script = (out / record["files"][0]).read_text()
    assert f"\n{record['command']}\n# or: {record['settings']['llama_cli']}\n" in script
    assert record["command"].split()[0] in ("llama-server", "llama-cli")


def _check_gguf(out: Path, record: dict, loaded: Loaded, scaling: str) -> None:
    name = f"{loaded.path.stem}.{scaling}x{_factor(scaling):g}.gguf"
    assert record["files"] == [f"emit/gguf/{name}", "emit/gguf/command.sh"]
    path = out / record["files"][0]
    assert record["tensor_sha256"] == _tensor_sha(path) == _tensor_sha(loaded.path)
    written, fields = gguf_rope_metadata(path), _fields(path)
    for key, value in record["settings"]["metadata"].items():
        assert written.get(key) == (float(np.float32(value)) if isinstance(value, float) else value)
        kind = gguf.GGUFValueType[record["settings"]["types"][key]]
        assert fields[key][0] == [int(kind)]  # the type llama.cpp's loader checks
    prefix = "llama.rope.scaling."
    if prefix + "type" in record["settings"]["metadata"]:  # says the scaling, nothing else
        assert {k for k in written if k.startswith(prefix)} == {
            k for k in record["settings"]["metadata"] if k.startswith(prefix)
        }
    measured = _measured(loaded, scaling, _factor(scaling))
    _assert_same_tables(
        measured[None], rotary_from_gguf(path, layout_for="transformers"), TARGET, True
    )
    assert name in record["command"]
    assert record["checked"].startswith("the GGUF copy: cos/sin over positions 0..1023")


def _check_ollama(out: Path, record: dict, loaded: Loaded, scaling: str) -> None:
    name = f"{loaded.path.stem}.{scaling}x{_factor(scaling):g}.gguf"
    assert record["files"] == [
        "emit/ollama/Modelfile",
        "emit/ollama/command.sh",
        f"emit/gguf/{name}",
    ]
    assert (out / record["files"][1]).read_text().rstrip("\n").endswith(record["command"])
    modelfile = (out / record["files"][0]).read_text()
    assert modelfile == record["settings"]["modelfile"]
    assert f"../gguf/{name}" in modelfile and f"num_ctx {TARGET}" in modelfile
    assert record["checked"].startswith("FROM the GGUF copy, read back: the GGUF copy:")


_CHECKS = {
    "transformers": _check_transformers,
    "vllm": _check_vllm,
    "sglang": _check_sglang,
    "llama.cpp": _check_llama_cpp,
    "gguf": _check_gguf,
    "ollama": _check_ollama,
}


def test_the_input_files_own_scaling_keys_are_not_left_in_the_copy(emitted: Any) -> None:
    out, results, _ = emitted("yarn_gguf", "linear")
    record = results["gguf"]
    assert record["checked"].endswith(
        "; the input's llama.rope.scaling.original_context_length removed"
    )
    rope = rotary_from_gguf(out / record["files"][0], layout_for="transformers")
    assert (rope.scaling.type, rope.scaling.factor) == ("linear", 2.0)


def test_the_emitted_gguf_loads_in_transformers_and_reads_back_as_measured(
    emitted: Any,
) -> None:
    out, results, loaded = emitted("gguf_model", "yarn")
    path = out / results["gguf"]["files"][0]
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    assert model.config.max_position_embeddings == TARGET
    rope = rotary_from_gguf(path, layout_for="transformers")
    assert (rope.scaling.type, rope.scaling.factor, rope.scaling.original_max_position) == (
        "yarn",
        2.0,
        512,
    )
    measured = _measured(loaded, "yarn", 2.0)[None]
    positions = torch.arange(TARGET)[None]
    for a, b in zip(
        rope.cos_sin(positions, dtype=torch.float64),
        measured.cos_sin(positions, dtype=torch.float64),
    ):
        assert torch.equal(a, b)


# --- refusals and read-back failures ----------------------------------------------------------


def test_default_engines() -> None:
    assert default_engines(True) == engines.ENGINES
    assert default_engines(False) == tuple(
        e for e in engines.ENGINES if e not in ("gguf", "ollama")
    )


@pytest.mark.parametrize(
    ("names", "scaling", "is_gguf", "message"),
    [
        pytest.param(
            ["vllm", "tgi"], "yarn", True, "engines must be one of .*got 'tgi'", id="unknown"
        ),
        pytest.param(["vllm", "vllm"], "yarn", True, "must not repeat an engine", id="repeat"),
        pytest.param("vllm", "yarn", True, "engines must be a list of engine names", id="string"),
        pytest.param(["gguf"], "yarn", False, "emit 'gguf' needs a .gguf model", id="gguf-folder"),
        pytest.param(["ollama"], "none", False, "emit 'ollama' needs a .gguf model", id="ollama"),
        pytest.param(["vllm"], "rerope", True, "scaling must be one of", id="scaling"),
        *(
            pytest.param(
                [e], "dynamic", True, f"(?=.*{e}).*dynamic|dynamic.*{e}", id=f"dynamic-{e}"
            )
            for e in NO_DYNAMIC
        ),
    ],
)
def test_check_emit_refuses_naming_the_engine(
    names: Any, scaling: str, is_gguf: bool, message: str
) -> None:
    with pytest.raises(PosEncError, match=message):
        check_emit(names, scaling, is_gguf)


@pytest.mark.parametrize("scaling", ["none", "linear", "ntk", "yarn", "config"])
def test_check_emit_takes_what_every_engine_can_write(scaling: str) -> None:
    check_emit(list(engines.ENGINES), scaling, True)


def test_strict_raises_where_an_engine_refuses(gguf_model: Loaded, tmp_path: Path) -> None:
    with pytest.raises(PosEncError, match="vllm"):
        write_emit(gguf_model, "dynamic", 2.0, TARGET, tmp_path, ["vllm"], strict=True)
    assert not (tmp_path / "emit" / "vllm").exists()


def test_a_folder_model_cannot_emit_the_gguf_copy(folder_model: Loaded, tmp_path: Path) -> None:
    with pytest.raises(PosEncError, match=r"emit 'gguf' needs a \.gguf model"):
        write_emit(folder_model, "yarn", 2.0, TARGET, tmp_path, ["transformers", "gguf"])
    assert not (tmp_path / "emit").exists()


def _wrong_factor(real: Any) -> Any:
    """The engines' spelling with the factor doubled: a setting that does not reproduce."""

    def spelled(engine: str, rope_parameters: dict, **kwargs: Any) -> Any:
        return real(engine, {**rope_parameters, "factor": 2 * rope_parameters["factor"]}, **kwargs)

    return spelled


@pytest.mark.parametrize("engine", ["transformers", "gguf"])
def test_a_setting_that_does_not_reproduce_the_measured_rope_is_not_left_written(
    gguf_model: Loaded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    monkeypatch.setattr(emit, "engine_setting", _wrong_factor(engines.engine_setting))
    with pytest.raises(PosEncError, match="does not reproduce the measured RoPE"):
        write_emit(gguf_model, "linear", 2.0, TARGET, tmp_path, [engine])
    assert [p for p in (tmp_path / "emit" / engine).iterdir()] == []


def test_bad_arguments_are_refused(gguf_model: Loaded, tmp_path: Path) -> None:
    with pytest.raises(PosEncError, match=r"^target must be >= 1, got 0$"):
        write_emit(gguf_model, "yarn", 2.0, 0, tmp_path, ["vllm"])
    with pytest.raises(PosEncError, match=r"^factor must be finite, got nan$"):
        write_emit(gguf_model, "yarn", float("nan"), TARGET, tmp_path, ["vllm"])
    with pytest.raises(PosEncError, match="scaling must be one of"):
        write_emit(gguf_model, "rerope", 2.0, TARGET, tmp_path, ["vllm"])
