"""Issue 13's reproducers for the bias family: each once raised another type, hung, asked
for terabytes or returned garbage; each is now a PosEncError (or a correct result)."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.bias.alibi import MAX_HEADS
from posenc.bias.t5 import MAX_DISTANCE


def test_shaw_on_meta_refuses_instead_of_returning_garbage():
    shaw = posenc.ShawRelativeBias(4, 8, device="meta")
    with pytest.raises(posenc.PosEncError, match="on the meta device"):
        shaw.bias(3, q=torch.randn(1, 4, 3, 8))
    with pytest.raises(posenc.PosEncError, match="on the meta device"):
        posenc.attention(*torch.randn(3, 1, 4, 3, 8), encoding=shaw)


def test_shaw_after_to_empty_computes_the_same_as_a_cpu_module():
    torch.manual_seed(0)
    cpu = posenc.ShawRelativeBias(4, 8)
    meta = posenc.ShawRelativeBias(4, 8, device="meta").to_empty(device="cpu")
    meta.load_state_dict(cpu.state_dict())
    q = torch.randn(1, 4, 3, 8)
    torch.testing.assert_close(meta.bias(3, q=q), cpu.bias(3, q=q), rtol=0, atol=0)


def test_shaw_q_on_another_device_than_the_table():
    shaw = posenc.ShawRelativeBias(2, 8)
    with pytest.raises(posenc.PosEncError, match="q must hold values"):
        shaw.bias(3, q=torch.randn(1, 2, 3, 8, device="meta"))


def test_alibi_bias_of_a_million_positions_is_refused_before_allocating():
    with pytest.raises(
        posenc.PosEncError, match=r"q_len, k_len=\(1000000, 1000000\) would allocate"
    ):
        posenc.ALiBiBias(8).bias(10**6)


def test_alibi_slopes_of_too_many_heads_is_refused_at_once():
    with pytest.raises(posenc.PosEncError, match=f"num_heads must be <= {MAX_HEADS}"):
        posenc.alibi_slopes(10**12)
    with pytest.raises(posenc.PosEncError, match=f"num_heads must be <= {MAX_HEADS}"):
        posenc.ALiBiBias(10**12)


def test_alibi_slopes_checked_in_float32():
    with pytest.raises(
        posenc.PosEncError, match=r"slopes\[0\] must be finite and >= 0, got 1e\+300"
    ):
        posenc.ALiBiBias(2, slopes=[1e300, 0.5])
    big = float(torch.finfo(torch.float32).max)
    bias = posenc.ALiBiBias(1, slopes=[big]).bias(1)
    assert bool(torch.isfinite(bias).all())


@pytest.mark.parametrize("device", ["bogus", 1.5])
def test_bias_modules_validate_device(device):
    for cls in (posenc.ALiBiBias, posenc.T5RelativeBias, posenc.KerpleBias, posenc.FIREBias):
        with pytest.raises(posenc.PosEncError, match="device must be"):
            cls(4, device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda():
    with pytest.raises(posenc.PosEncError, match="CUDA is not available"):
        posenc.ALiBiBias(4, device="cuda")


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_bias_modules_validate_dtype(dtype):
    with pytest.raises(posenc.PosEncError, match="dtype must be a floating-point dtype"):
        posenc.T5RelativeBias(4, dtype=dtype)
    with pytest.raises(posenc.PosEncError, match="dtype must be a floating-point dtype"):
        posenc.ShawRelativeBias(4, 8, dtype=dtype)


def test_t5_max_distance_is_bounded():
    with pytest.raises(posenc.PosEncError, match=f"max_distance must be <= {MAX_DISTANCE}"):
        posenc.T5RelativeBias(4, max_distance=10**8)
    table = torch.randn(32, 2)
    with pytest.raises(posenc.PosEncError, match=f"max_distance must be <= {MAX_DISTANCE}"):
        posenc.t5_relative_bias(torch.arange(3), torch.arange(3), table, max_distance=10**8)
    with pytest.raises(posenc.PosEncError, match="max_distance must be an integer"):
        posenc.t5_relative_bias(torch.arange(3), torch.arange(3), table, max_distance="x")


def test_t5_relative_bias_max_distance_is_used():
    table = torch.arange(16.0).reshape(8, 2)
    got = posenc.t5_relative_bias(torch.arange(4), torch.arange(4), table, max_distance=8)
    bucket = posenc.t5_relative_bucket(
        torch.arange(4)[None, :] - torch.arange(4)[:, None], num_buckets=8, max_distance=8
    )
    torch.testing.assert_close(got, table.t()[:, bucket], rtol=0, atol=0)


def test_kerple_parameters_on_two_devices():
    r = torch.rand(2) + 0.1
    with pytest.raises(posenc.PosEncError, match="r2 must hold values"):
        posenc.kerple_bias(torch.arange(3), torch.arange(3), r, r.to("meta"))


def test_fire_numbers_bounded_so_the_float32_formula_stays_finite():
    with pytest.raises(posenc.PosEncError, match=r"c must be <= 10000\.0, got 1e\+300"):
        posenc.bias.fire_normalized_distance(torch.arange(3), torch.arange(3), c=1e300)
    with pytest.raises(posenc.PosEncError, match=r"threshold must be <= 1000000000000\.0"):
        posenc.bias.fire_normalized_distance(torch.arange(3), torch.arange(3), threshold=1e300)
