"""``patch`` on the two families whose RoPE is not Llama's ``(cos, sin)``: GPT-J (a table of
sinusoids ``embed_positions`` giving ``(sin, cos)``, the first ``rotary_dim`` channels
rotated one tensor at a time, interleaved) and Llama 4 (complex ``freqs_cis``, interleaved
pairs, llama3 scaling, NoPE layers). The logits, generation and unpatch tests of every text
family are in test_hf_patch.py; here: the patched rotary module against the family's own,
GPT-J past its table, Llama 4's NoPE layers, compile and training.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.integrations.transformers import patch, unpatch  # noqa: E402

from . import _tiny_models as tiny  # noqa: E402

RTOL, ATOL = 1e-5, 1e-5


@pytest.mark.parametrize("model_type", ["gptj", "llama4_text"])
def test_rotary_module_equals_transformers(model_type: str) -> None:
    """The patched rotary module's output, in the family's own form ((sin, cos) for GPT-J,
    cos + i sin for Llama 4), against its original module's, at positions below 4096 (the
    angles are float32 in transformers: off by up to 3.1e-7 rad per unit position); in a
    bfloat16 model posenc's stay those of the float32 one (transformers' GPT-J table and
    Llama 4 inv_freq are buffers that ``.to(torch.bfloat16)`` rounds)."""
    model = tiny.model(model_type)
    original = tiny.text_model(model).rotary_emb
    positions = torch.stack([torch.arange(64), torch.arange(64) + 4000])  # [b, s]
    x = torch.zeros(1)
    with torch.no_grad():
        expected = original(x, positions)
        got = tiny.text_model(patch(model)).rotary_emb(x, positions)
        in_bf16 = tiny.text_model(model.to(torch.bfloat16)).rotary_emb(x.bfloat16(), positions)
    atol = 4064 * 3.1e-7 + 2e-6
    if model_type == "llama4_text":
        assert got.dtype == torch.complex64 and got.shape == expected.shape == (2, 64, 8)
        assert torch.equal(in_bf16, got)
        torch.testing.assert_close(
            torch.view_as_real(got), torch.view_as_real(expected), rtol=0, atol=atol
        )
    else:
        assert [t.dtype for t in got] == [torch.float32] * 2 and got[0].shape == (2, 64, 4)
        assert all(torch.equal(a, b) for a, b in zip(in_bf16, got))
        for mine, peer in zip(got, expected):
            torch.testing.assert_close(mine, peer, rtol=0, atol=atol)


def test_gptj_past_its_table_equals_a_model_with_a_longer_one() -> None:
    """transformers' GPT-J indexes a table of n_positions rows (an IndexError past it);
    patched, it rotates any position, as a model of the same weights with a longer table."""
    model, longer = tiny.model("gptj"), tiny.model("gptj", max_position_embeddings=8192)
    longer.load_state_dict(model.state_dict())
    ids, positions = tiny.ids(), torch.arange(24)[None] + 6000
    with pytest.raises(IndexError):
        tiny.logits(model, ids, positions)
    expected = tiny.logits(longer, ids, positions)
    got = tiny.logits(patch(model), ids, positions)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)  # the table's float32 angles
    unpatch(model)
    with pytest.raises(IndexError):  # transformers' own table again
        tiny.logits(model, ids, positions)


def test_llama4_model_has_nope_and_rope_layers() -> None:
    """The tiny Llama 4 covers both kinds of layer (test_hf_patch.py compares its logits):
    RoPE layers with qk-norm and a NoPE layer with its temperature tuning, and a llama3
    scaling whose low frequencies are interpolated at the test positions (past 1024)."""
    model = patch(tiny.model("llama4_text"))
    layers = [block.self_attn for block in model.model.layers]
    assert [bool(layer.use_rope) for layer in layers] == [True, True, True, False]
    assert all("forward" in layer.__dict__ for layer in layers)
    rope = model.model.rotary_emb.ropes[None]
    assert rope.layout == "interleaved" and rope.scaling.type == "llama3"


@pytest.mark.parametrize("model_type", ["gptj", "llama4_text", "qwen2_vl_text"])
def test_patched_model_under_torch_compile(model_type: str) -> None:
    model = patch(tiny.model(model_type))
    ids, positions = tiny.ids(), torch.arange(24)[None] + 500
    expected = tiny.logits(model, ids, positions)
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(
        tiny.logits(compiled, ids, positions), expected, rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("model_type", ["gptj", "llama4_text"])
def test_training_gradients_equal_unpatched(model_type: str) -> None:
    model, reference = tiny.model(model_type).train(), tiny.model(model_type).train()
    ids = tiny.ids()
    patch(model)
    losses = []
    for m in (model, reference):
        loss = m(ids, labels=ids).loss
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1], rtol=RTOL, atol=ATOL)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
