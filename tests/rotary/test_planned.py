"""rotate_planned (a checked call shape in one foreign call) against fused_rotary."""

from __future__ import annotations

import pytest
import torch

from posenc.rotary.apply import rotary_cos_sin
from posenc.rotary.kernels import cpu as cpu_kernel
from posenc.rotary.kernels import cpu_fast_path_enabled, fused_rotary
from posenc.rotary.kernels import planned as PL
from posenc.rotary.kernels.planned import rotate_planned

pytestmark = pytest.mark.skipif(not cpu_fast_path_enabled(), reason="no fused CPU path")

# (name, q shape as [b, h, s, d], k heads, seq_dim, rotary dim, cos batch, layout)
CASES = {
    "decode-bhsd": ((1, 9, 1, 64), 3, -2, 64, 1, "half"),
    "decode-bshd": ((1, 9, 1, 64), 3, -3, 64, 1, "half"),
    "prefill": ((2, 4, 7, 16), 2, -2, 16, 2, "half"),
    "interleaved": ((2, 4, 7, 16), 4, -2, 16, 2, "interleaved"),
    "partial": ((1, 4, 5, 32), 1, -2, 16, 1, "half"),
    "shared-cos": ((2, 2, 5, 8), 2, -2, 8, 0, "half"),  # cos [s, r/2]
}


def make(case: str, dtype: torch.dtype, seed: int = 0):
    (b, h, s, d), hk, seq_dim, r, cos_batch, layout = CASES[case]
    g = torch.Generator().manual_seed(seed)
    # as a projection's output viewed [b, s, h, d] (and transposed for [b, h, s, d])
    q = torch.randn(b, s, h * d, generator=g).to(dtype).view(b, s, h, d)
    k = torch.randn(b, s, hk * d, generator=g).to(dtype).view(b, s, hk, d)
    if seq_dim == -2:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    positions = torch.arange(s) + 300
    if cos_batch:
        positions = positions.expand(cos_batch, s)
    cos, sin = rotary_cos_sin(positions, torch.rand(r // 2, generator=g))
    return q, k, cos, sin, layout, seq_dim


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", list(CASES))
def test_same_bits_as_fused_rotary(case, dtype, monkeypatch):
    q, k, cos, sin, layout, seq_dim = make(case, dtype)
    want = fused_rotary(q, k, cos, sin, layout=layout, seq_dim=seq_dim)
    launches = []
    real = cpu_kernel.packed_entry()
    monkeypatch.setattr(cpu_kernel, "packed_entry", lambda: lambda a: launches.append(1) or real(a))
    plans: dict = {}
    for _ in range(2):  # the first call plans, the second is served from the plan
        got = rotate_planned(q, k, cos, sin, layout=layout, seq_dim=seq_dim, plans=plans)
        assert got is not None
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert got[0].stride() == want[0].stride() and got[1].dtype == dtype
    assert launches == [1, 1] and len(plans) == 1
    plan = next(iter(plans.values()))
    assert isinstance(plan, PL.Plan) and plan is not PL.NOT_SERVED


def _why(name: str):
    q, k, cos, sin, layout, seq_dim = make("prefill", torch.float32)
    if name == "autograd":
        q = q.clone().requires_grad_(True)
    elif name == "dtypes-differ":
        k = k.to(torch.bfloat16)
    elif name == "float64-cos":
        cos, sin = cos.double(), sin.double()
    elif name == "bad-k":
        k = k[..., :8]
    elif name == "cos-strides-differ":
        sin = sin.clone().transpose(-1, -2).contiguous().transpose(-1, -2)
    return q, k, cos, sin, layout, seq_dim


@pytest.mark.parametrize(
    "name", ["autograd", "dtypes-differ", "float64-cos", "bad-k", "cos-strides-differ"]
)
def test_other_calls_are_left_to_fused_rotary(name):
    q, k, cos, sin, layout, seq_dim = _why(name)
    plans: dict = {}
    assert rotate_planned(q, k, cos, sin, layout=layout, seq_dim=seq_dim, plans=plans) is None
    assert all(v is PL.NOT_SERVED for v in plans.values())  # not served, or not keyed


def test_autograd_is_asked_every_call():
    q, k, cos, sin, layout, seq_dim = make("prefill", torch.float32)
    plans: dict = {}
    assert rotate_planned(q, k, cos, sin, layout=layout, seq_dim=seq_dim, plans=plans)
    q.requires_grad_(True)
    assert rotate_planned(q, k, cos, sin, layout=layout, seq_dim=seq_dim, plans=plans) is None
    with torch.no_grad():
        assert rotate_planned(q, k, cos, sin, layout=layout, seq_dim=seq_dim, plans=plans)


def test_plans_are_forgotten_at_the_cap(monkeypatch):
    monkeypatch.setattr(PL, "PLANS_MAX", 2)
    plans: dict = {}
    for case in ("prefill", "interleaved", "partial"):
        q, k, cos, sin, layout, seq_dim = make(case, torch.float32)
        assert rotate_planned(q, k, cos, sin, layout=layout, seq_dim=seq_dim, plans=plans)
    assert len(plans) == 1


def test_traced_calls_are_left_to_fused_rotary(monkeypatch):
    q, k, cos, sin, layout, seq_dim = make("prefill", torch.float32)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert rotate_planned(q, k, cos, sin, layout=layout, seq_dim=seq_dim, plans={}) is None
