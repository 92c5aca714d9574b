"""RotaryEmbedding and apply_rotary give identical results with and without the fast path.

The module dispatches through posenc.rotary.kernels: with the CPU fast path on, q and k
sharing positions go through one fused launch; everything else through one launch each.
Forward and backward must equal the plain torch path bit for bit.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import posenc
from posenc.rotary import kernels
from posenc.rotary.kernels import backends, cpu

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="the CPU fast path needs a C compiler"
)

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)

CONFIGS = {
    "default": {},
    "partial": {"rotary_dim": 24},
    "yarn": {"scaling": {"type": "yarn", "factor": 4.0, "original_max_position": 64}},
    "xpos": {"name": "xpos", "scale_base": 512.0},
}


def _run(rope, q, k, fast: bool, **call):
    """Forward and gradients with the CPU fast path on or off."""
    previous = backends._cpu_on
    kernels.enable_cpu_fast_path(fast)
    try:
        q = q.detach().clone().requires_grad_()
        k = k.detach().clone().requires_grad_()
        q_out, k_out = rope(q, k, **call)
        gen = torch.Generator().manual_seed(3)
        weights = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (q_out, k_out)]
        loss = (q_out.double() * weights[0]).sum() + (k_out.double() * weights[1]).sum()
        loss.backward()
        return q_out.detach(), k_out.detach(), q.grad, k.grad
    finally:
        backends._cpu_on = previous


def _assert_identical(fast, slow):
    for a, b, what in zip(fast, slow, ("q", "k", "q.grad", "k.grad")):
        assert a.dtype == b.dtype, what
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=lambda m, w=what: f"{w}: {m}")


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rotary_embedding_identical_with_fast_path(dtype, layout, config):
    rope = posenc.build({"name": "rope", "head_dim": 32, "layout": layout, **CONFIGS[config]})
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 9, 32, generator=gen).to(dtype)  # GQA: 4 query heads, 2 kv heads
    k = torch.randn(2, 2, 9, 32, generator=gen).to(dtype)
    positions = torch.randint(0, 200, (2, 9), generator=gen)
    _assert_identical(
        _run(rope, q, k, True, q_positions=positions),
        _run(rope, q, k, False, q_positions=positions),
    )


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_decoding_and_seq_dim_identical_with_fast_path(layout):
    rope = posenc.RotaryEmbedding(16, layout=layout, rotary_dim=8)
    gen = torch.Generator().manual_seed(1)
    # [b, s, h, d] views of [b, h, s, d] buffers; one query against 7 keys
    q = torch.randn(3, 4, 1, 16, generator=gen).transpose(1, 2)
    k = torch.randn(3, 2, 7, 16, generator=gen).transpose(1, 2)
    call = {
        "q_positions": torch.tensor([[6], [9], [2]]),
        "k_positions": torch.arange(7)[None] + 3,
        "seq_dim": -3,
    }
    _assert_identical(_run(rope, q, k, True, **call), _run(rope, q, k, False, **call))


def test_shared_positions_take_one_launch(monkeypatch):
    calls = []
    original = cpu.launch_cpu

    def counting(*args, **kwargs):
        calls.append(len(args[1]))  # how many tensors this launch rotates
        return original(*args, **kwargs)

    monkeypatch.setattr(cpu, "launch_cpu", counting)
    original_entry = cpu.table_entry

    def counting_entry():  # forward's fast path: q and k in one gathering launch
        entry = original_entry()

        def call(address):
            calls.append(2)
            return entry(address)

        return call

    monkeypatch.setattr(cpu, "table_entry", counting_entry)
    previous = backends._cpu_on
    kernels.enable_cpu_fast_path(True)
    try:
        rope = posenc.RotaryEmbedding(8)
        q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
        rope(q, k, torch.arange(5))
        assert calls == [2]  # q and k together
        rope(q, k, torch.arange(5), k_positions=torch.arange(5) + 1)
        assert calls == [2, 1, 1]  # different positions: one launch each
        posenc.apply_rotary(q, *rope.cos_sin(torch.arange(5)))
        assert calls == [2, 1, 1, 1]
    finally:
        backends._cpu_on = previous


def test_mixed_dtypes_rotate_separately():
    previous = backends._cpu_on
    kernels.enable_cpu_fast_path(True)
    try:
        rope = posenc.RotaryEmbedding(8)
        q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8, dtype=torch.bfloat16)
        q_fast, k_fast = rope(q, k)
        kernels.enable_cpu_fast_path(False)
        q_plain, k_plain = rope(q, k)
    finally:
        backends._cpu_on = previous
    assert (q_fast.dtype, k_fast.dtype) == (torch.float32, torch.bfloat16)
    torch.testing.assert_close(q_fast, q_plain, atol=0, rtol=0)
    torch.testing.assert_close(k_fast, k_plain, atol=0, rtol=0)
