"""transformers from 5.25 with the ``kernels`` package (which it requires): a modeling
module's ``@use_kernel_forward_from_hub`` apply function is a ``kernels`` wrapper module
whose own signature is ``(*args, **kwargs)``. patch reads the wrapped function's
parameters, and a model whose apply function is so wrapped patches as before. The
wrapper is made here by ``kernels``' own decorator (the one transformers 5.25 applies)."""

from __future__ import annotations

import importlib

import pytest
import torch

transformers = pytest.importorskip("transformers")
kernels = pytest.importorskip("kernels")

from posenc.integrations._hf_patch import _hub_unwrapped  # noqa: E402
from posenc.integrations.transformers import patch, unpatch  # noqa: E402

from . import _tiny_models as tiny  # noqa: E402


def _apply(q, k, cos, sin, unsqueeze_dim=1):
    return q, k


def test_the_hub_wrapper_gives_back_its_function():
    wrapped = kernels.use_kernel_forward_from_hub("rotary_pos_emb")(_apply)
    assert isinstance(wrapped, torch.nn.Module)  # as transformers 5.25 has it
    assert _hub_unwrapped(wrapped) is _apply
    assert _hub_unwrapped(_apply) is _apply
    other = torch.nn.Linear(2, 2)
    assert _hub_unwrapped(other) is other  # not a hub wrapper: itself, refused by name later


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_a_model_whose_apply_is_hub_wrapped_patches_as_before(model_type, monkeypatch):
    modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    original = _hub_unwrapped(modeling.apply_rotary_pos_emb)
    wrapped = kernels.use_kernel_forward_from_hub("rotary_pos_emb")(original)
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", wrapped)
    model = tiny.model(model_type)
    ids = tiny.ids()
    before = tiny.logits(model, ids)
    patch(model)
    torch.testing.assert_close(tiny.logits(model, ids), before, rtol=1e-5, atol=1e-5)
    unpatch(model)
    assert torch.equal(tiny.logits(model, ids), before)
