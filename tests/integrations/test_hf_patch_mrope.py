"""``patch`` on the M-RoPE families (Qwen2-VL, Qwen2.5-VL: contiguous sections; Qwen3-VL:
interleaved): tiny image-text models (a one-block vision tower) compared with themselves
unpatched, text-only, at 3-D position ids built here, and on a tiny image whose positions
the model computes itself (``get_rope_index``); greedy generation with the KV cache;
``unpatch`` restoring the model bit for bit. The vision tower's own rotary is left alone.
"""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.integrations.transformers import PatchedRotaryEmbedding, patch, unpatch  # noqa: E402

from . import _tiny_models as tiny  # noqa: E402

FAMILIES = sorted(tiny.VL_CONFIGS)
RTOL, ATOL = 1e-5, 1e-5  # logits are ~0.6 at most


def _positions_3d(batch: int, seq: int, top: int = 3000, seed: int = 4) -> torch.Tensor:
    """transformers' M-RoPE ``position_ids [3, b, s]``: distinct t, h, w coordinates."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, top, (3, batch, seq), generator=g)


def _image_logits(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("model_type", FAMILIES)
def test_logits_equal_text_3d_and_image_and_unpatch_restores(model_type: str) -> None:
    model = tiny.model(model_type)
    ids = tiny.ids()
    cases = [  # text-only: None, [b, s] offsets, [3, b, s] distinct axes
        None,
        torch.arange(ids.shape[1])[None] + torch.tensor([[0], [1000]]),
        _positions_3d(*ids.shape),
    ]
    before = [tiny.logits(model, ids, p) for p in cases]
    image = tiny.image_inputs()
    before_image = _image_logits(model, image)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    tree = tiny.tree(model)

    patch(model)
    decoder = tiny.text_model(model)
    assert isinstance(decoder.rotary_emb, PatchedRotaryEmbedding)
    assert decoder.rotary_emb.ropes[None].sections == tuple(tiny.VL_CONFIGS[model_type][1])
    layers = model.config.get_text_config().num_hidden_layers
    forwards = tiny.instance_forwards(model)
    assert len(forwards) == layers and all(".language_model." in f for f in forwards)
    for positions, expected in zip(cases, before):
        torch.testing.assert_close(
            tiny.logits(model, ids, positions), expected, rtol=RTOL, atol=ATOL
        )
    torch.testing.assert_close(_image_logits(model, image), before_image, rtol=RTOL, atol=ATOL)

    unpatch(model)
    assert tiny.tree(model) == tree and tiny.instance_forwards(model) == []
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    for positions, expected in zip(cases, before):
        assert torch.equal(tiny.logits(model, ids, positions), expected)
    assert torch.equal(_image_logits(model, image), before_image)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_rotary_module_equals_transformers_at_3d_positions(model_type: str) -> None:
    """The patched rotary module's cos/sin against the family's own (its ``[b, s,
    head_dim]`` recomposed cos/sin hold each frequency twice: the first half is posenc's)."""
    model = tiny.model(model_type)
    original = tiny.text_model(model).rotary_emb
    positions = _positions_3d(2, 40, top=4000)
    x = torch.zeros(1)
    with torch.no_grad():
        expected = [t[..., :8] for t in original(x, positions)]
        patch(model)
        got = tiny.text_model(model).rotary_emb(x, positions)
        flat = tiny.text_model(model).rotary_emb(x, positions[0])  # [b, s]: every axis alike
        flat_expected = [t[..., :8] for t in original(x, positions[0])]
    assert got[0].dtype == torch.float32 and got[0].shape == (2, 40, 8)
    for mine, peer in zip((*got, *flat), (*expected, *flat_expected)):
        torch.testing.assert_close(mine, peer, rtol=0, atol=4000 * 3.1e-7 + 2e-6)


@pytest.mark.parametrize("model_type", FAMILIES)
@pytest.mark.parametrize("inputs", ["text", "image"])
def test_greedy_generate_with_cache_gives_the_same_tokens(model_type: str, inputs: str) -> None:
    model = tiny.model(model_type)
    prompt = {"input_ids": tiny.ids(batch=1, seq=6)} if inputs == "text" else tiny.image_inputs()
    kwargs = dict(max_new_tokens=8, do_sample=False, use_cache=True, pad_token_id=0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = model.generate(**prompt, **kwargs)
        got = patch(model).generate(**prompt, **kwargs)
    assert torch.equal(got, expected)
