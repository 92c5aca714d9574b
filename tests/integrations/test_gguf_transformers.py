"""``rotary_from_gguf`` against transformers' own reading of the same GGUF file.

transformers' GGUF loader builds a config from the file (``AutoConfig.from_pretrained(dir,
gguf_file=...)``); ``rotary_from_config`` of it must equal ``rotary_from_gguf(...,
layout_for="transformers")``. transformers 5 reads ``rope.freq_base`` and the head size only
(no ``rope.scaling.*`` key and no ``rope_freqs`` / ``rope_factors`` tensor, except gpt-oss'
scaling, which its reader fails on): where the file scales, its module is posenc's without the
scaling. On the real files the rotation posenc reads, applied as llama.cpp applies it (the
interleaved pairs on the GGUF's permuted q/k), equals transformers' (half pairs on the weights
it un-permutes) for layer 0's query projection of a few tokens.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from tests import _real_models

import posenc
from posenc.integrations import _gguf_families
from posenc.integrations.gguf import gguf_layer_types, rotary_from_gguf
from posenc.integrations.transformers import rope_layer_types, rotary_from_config

from .test_gguf import CASES, write_gguf

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

_BY_NAME = {c.name: c for c in CASES}
# case -> what transformers reads of it: everything, or everything but the scaling
SAME, NO_SCALING = "same", "scaling dropped"
TRANSFORMERS_READS = {
    "llama_plain": SAME,
    "qwen2_plain_neox": SAME,
    "llama_linear": NO_SCALING,
    "llama3_rope_freqs": NO_SCALING,
    "rope_freqs_factors": NO_SCALING,
    "qwen2_yarn": NO_SCALING,
    "yarn_keys": NO_SCALING,
    "phi3_longrope": NO_SCALING,
    "gemma3_sliding_and_full": NO_SCALING,  # sliding: same; full: its linear factor dropped
}


def _tf_config(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name)


def _unscaled(rope: posenc.RotaryEmbedding) -> posenc.RotaryEmbedding:
    return posenc.RotaryEmbedding(
        rope.head_dim,
        base=rope.base,
        rotary_dim=rope.rotary_dim,
        layout=rope.layout,
        sections=rope.sections,
    )


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_READS))
def test_synthetic_file_as_transformers_reads_it(tmp_path, name):
    case = _BY_NAME[name]
    path = write_gguf(tmp_path / f"{name}.gguf", case.arch, case.keys, case.tensors)
    config = _tf_config(path)
    types = rope_layer_types(config)
    ours_types = gguf_layer_types(path)
    assert set(types) == set(ours_types) or list(ours_types) == [None]
    for layer_type in types:
        theirs = rotary_from_config(config, layer_type=layer_type)
        ours = rotary_from_gguf(path, layer=layer_type, layout_for="transformers")
        if TRANSFORMERS_READS[name] == NO_SCALING and ours.scaling is not None:
            ours = _unscaled(ours)
        assert theirs.to_config() == ours.to_config(), layer_type
        torch.testing.assert_close(theirs.inv_freq, ours.inv_freq, rtol=0, atol=0)
    if TRANSFORMERS_READS[name] == NO_SCALING:  # the file scales; transformers' config does not
        assert any(rotary_from_gguf(path, layer=lt).scaling is not None for lt in ours_types)
        assert all(rotary_from_config(config, layer_type=lt).scaling is None for lt in types)


@pytest.mark.xfail(
    raises=TypeError,
    strict=True,
    reason="transformers 5 reads gpt-oss' rope.scaling.* from a key's length "
    "field (parts[0]) and fails: float() of an array",
)
def test_gpt_oss_yarn_as_transformers_reads_it(tmp_path):
    case = _BY_NAME["gpt_oss_yarn_one_type"]
    path = write_gguf(tmp_path / "gpt-oss.gguf", case.arch, case.keys, case.tensors)
    config = _tf_config(path)
    assert (
        rotary_from_config(config).to_config()
        == rotary_from_gguf(path, layout_for="transformers").to_config()
    )


def test_unpermuted_architectures_are_transformers():
    """The architectures whose q/k transformers' loader permutes back: its own table."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, LlamaTensorProcessor

    unpermuted = {
        arch for arch, cls in TENSOR_PROCESSORS.items() if issubclass(cls, LlamaTensorProcessor)
    }
    assert unpermuted == set(_gguf_families.TRANSFORMERS_UNPERMUTES)


# --- the real files ---------------------------------------------------------------------------

REAL = ["smollm2", "gemma3"]


@pytest.mark.real_model
@pytest.mark.parametrize("name", REAL)
def test_real_file_as_transformers_reads_it(name):
    """The loaded model's config gives the module posenc reads from its file, and the
    model's own rotary module the same cos/sin (to float32 rounding of its angles)."""
    path = _real_models.require(name)
    model, _ = _real_models.load(name)
    config, rotary = model.config, model.model.rotary_emb
    assert set(rope_layer_types(config)) == set(gguf_layer_types(path)) or name == "smollm2"
    positions = torch.tensor([0, 1, 7, 100, 1023, 8191])
    for layer_type in rope_layer_types(config):
        ours = rotary_from_gguf(path, layer=layer_type, layout_for="transformers")
        assert rotary_from_config(config, layer_type=layer_type).to_config() == ours.to_config()
        kwargs = {} if layer_type is None else {"layer_type": layer_type}
        x = torch.zeros(1, len(positions), ours.head_dim)
        cos, sin = rotary(x, positions[None], **kwargs)
        half = ours.rotary_dim // 2
        want_cos, want_sin = ours.cos_sin(positions, dtype=torch.float64)
        worst = 8191 * 3.1e-7 + 1e-6  # transformers forms position * inv_freq in float32
        torch.testing.assert_close(cos[0, :, :half].double(), want_cos, rtol=0, atol=worst)
        torch.testing.assert_close(sin[0, :, :half].double(), want_sin, rtol=0, atol=worst)
    gguf_view = rotary_from_gguf(path, layer=next(iter(gguf_layer_types(path))))
    assert gguf_view.layout == ("interleaved" if name == "smollm2" else "half")


@pytest.mark.real_model
def test_real_smollm2_rotation_llama_cpp_equals_transformers():
    """Layer 0's query projection of 8 tokens at positions 1000..1007: posenc's GGUF-view
    module (interleaved) on the GGUF's permuted ``attn_q`` equals transformers' half rotation
    on the q_proj its loader un-permuted, channel for channel once un-permuted."""
    from gguf.quants import dequantize
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    path = _real_models.require("smollm2")
    model, _ = _real_models.load("smollm2")
    heads, head_dim = model.config.num_attention_heads, model.config.head_dim
    reader = gguf.GGUFReader(str(path))
    tensor = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    w_gguf = torch.from_numpy(np.asarray(dequantize(tensor.data, tensor.tensor_type)).copy())
    processor = LlamaTensorProcessor(
        config={"num_attention_heads": heads, "num_key_value_heads": heads}
    )
    order = processor.process(np.arange(heads * head_dim)[:, None], "blk.0.attn_q.weight")
    order = torch.from_numpy(np.asarray(order.weights).ravel())  # HF row r = GGUF row order[r]
    # transformers' un-permutation is posenc's interleaved -> half channel order, per head
    per_head = posenc.rotary.layout_permutation(head_dim, source="interleaved", target="half")
    assert torch.equal(order.view(heads, head_dim) % head_dim, per_head.expand(heads, head_dim))
    w_hf = model.model.layers[0].self_attn.q_proj.weight.detach()
    torch.testing.assert_close(w_hf, w_gguf[order], rtol=0, atol=0)

    ids = torch.tensor([[1, 504, 3287, 1782, 314, 253, 4418, 30]])
    with torch.no_grad():
        h = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))  # [1, 8, 576]
    positions = torch.arange(1000, 1008)
    q_gguf = (h.double() @ w_gguf.double().T).view(1, 8, heads, head_dim).transpose(1, 2)
    ours, _ = rotary_from_gguf(path)(q_gguf, q_gguf, positions)  # llama.cpp's NORM rotation
    q_hf = (h @ w_hf.T).view(1, 8, heads, head_dim).transpose(1, 2)
    cos, sin = model.model.rotary_emb(h, positions[None])
    theirs, _ = apply_rotary_pos_emb(q_hf, q_hf, cos, sin)
    scale = float(q_hf.abs().max())
    ours_hf = ours[..., order[:head_dim]]  # one head's channel order (the same for each head)
    torch.testing.assert_close(ours_hf.float(), theirs, rtol=0, atol=scale * 1008 * 3.1e-7 * 2)
    # and the transformers-view module on the un-permuted weights gives the same rotation
    same, _ = rotary_from_gguf(path, layout_for="transformers")(
        q_hf.double(), q_hf.double(), positions
    )
    torch.testing.assert_close(same, ours_hf, rtol=0, atol=scale * 1e-5)
