"""The shared checks of ``posenc._errors``: sizes, devices, allocations, flags."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc._errors import (
    MAX_ALLOC_BYTES,
    PosEncError,
    check_alloc,
    check_bool,
    check_device,
    check_factory,
    check_float,
    check_int,
    check_positions,
    check_same_device,
)


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**64])
def test_check_int_refuses_what_int64_cannot_hold(value):
    with pytest.raises(PosEncError, match=f"n must fit in a 64-bit integer, got {value}"):
        check_int("n", value)


def test_check_int_keeps_the_int64_range():
    assert check_int("n", 2**63 - 1) == 2**63 - 1
    assert check_int("n", -(2**63)) == -(2**63)


def test_check_alloc_names_the_argument_and_the_bytes():
    with pytest.raises(
        PosEncError, match=r"num_heads=1000000000000 would allocate .* about 4e\+12"
    ):
        check_alloc("num_heads", 10**12, (10**12,), torch.float32)
    check_alloc("num_heads", 8, (8, 1024, 1024), torch.float32)  # 32 MiB: fine


def test_check_alloc_cap_from_the_environment(monkeypatch):
    monkeypatch.setenv("POSENC_MAX_ALLOC_BYTES", "1000")
    with pytest.raises(PosEncError, match="more than the 1e\\+03 bytes allowed"):
        check_alloc("seq_len", 251, (251,), torch.float32)
    check_alloc("seq_len", 250, (250,), torch.float32)
    monkeypatch.setenv("POSENC_MAX_ALLOC_BYTES", "lots")
    with pytest.raises(PosEncError, match="POSENC_MAX_ALLOC_BYTES must be an integer"):
        check_alloc("seq_len", 1, (1,))


def test_check_alloc_on_meta_uses_the_cap_alone():
    check_alloc("n", 1, (MAX_ALLOC_BYTES // 4,), torch.float32, "meta")
    with pytest.raises(PosEncError, match="allowed on meta"):
        check_alloc("n", 1, (MAX_ALLOC_BYTES // 4 + 1,), torch.float32, "meta")


@pytest.mark.parametrize(
    ("device", "match"),
    [
        ("bogus", "device must be a device name such as 'cpu', got 'bogus'"),
        (1.5, "device must be a torch.device or a device name, got 1.5"),
        (0, "device must be a torch.device or a device name, got 0"),
    ],
)
def test_check_device_refuses(device, match):
    with pytest.raises(PosEncError, match=match):
        check_device("device", device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_a_posenc_error():
    with pytest.raises(PosEncError, match="device is 'cuda', but CUDA is not available"):
        check_device("device", "cuda")


def test_check_device_accepts():
    assert check_device("device", None) is None
    assert check_device("device", "cpu") == torch.device("cpu")
    assert check_device("device", torch.device("meta")) == torch.device("meta")


def test_check_factory_dtype_must_be_floating():
    for dtype in (torch.int64, torch.bool, torch.complex64):
        with pytest.raises(PosEncError, match="dtype must be a floating-point dtype"):
            check_factory(None, dtype)
    with pytest.raises(PosEncError, match=r"dtype must be a torch\.dtype, got 'float32'"):
        check_factory(None, "float32")


def test_check_same_device_and_meta():
    cpu, meta = torch.zeros(2), torch.zeros(2, device="meta")
    with pytest.raises(PosEncError, match="k must hold values, got a tensor on the meta device"):
        check_same_device(("q", "k"), cpu, meta)
    check_same_device(("q", "k"), cpu, None)


def test_check_bool():
    assert check_bool("flag", True) is True
    for bad in (1, "yes", None):
        with pytest.raises(PosEncError, match="flag must be True or False"):
            check_bool("flag", bad)


def test_check_positions_refuses_meta_and_bad_batch():
    with pytest.raises(PosEncError, match="positions must hold values, got a tensor on the meta"):
        check_positions("positions", torch.arange(3, device="meta"))
    with pytest.raises(PosEncError, match="batch must be an integer, got 'x'"):
        check_positions("positions", torch.arange(3), batch="x")


@pytest.mark.parametrize(
    "value, expected",
    [(np.float32(1.5), 1.5), (np.float64(2.0), 2.0), (np.int64(3), 3.0), (7, 7.0)],
    ids=["np.float32", "np.float64", "np.int64", "int"],
)
def test_check_float_takes_numpy_numbers(value, expected):
    result = check_float("x", value)
    assert type(result) is float and result == expected


@pytest.mark.parametrize(
    "value, match",
    [(np.bool_(True), "must be a number"), (10**400, "must be finite, got an integer of 401")],
    ids=["np.bool_", "huge-int"],
)
def test_check_float_refuses(value, match):
    with pytest.raises(PosEncError, match=match):
        check_float("x", value)


@pytest.mark.parametrize(
    "value",
    [torch.tensor([8]), torch.tensor([8.5]), torch.tensor(3.0), torch.tensor(True)],
    ids=["tensor_1d", "tensor_1d_float", "tensor_float", "tensor_bool"],
)
def test_check_int_refuses_tensors_that_int_would_take(value):
    """``int(tensor([8.5]))`` is 8: a one-element or non-integer tensor is no integer."""
    with pytest.raises(PosEncError, match="n must be an integer"):
        check_int("n", value)


def test_check_int_refuses_arrays_and_takes_integer_scalars():
    for value in (np.array([3]), np.array(3.0), np.bool_(True)):
        with pytest.raises(PosEncError, match="n must be an integer"):
            check_int("n", value)
    assert [check_int("n", v) for v in (np.int64(3), np.uint8(3), torch.tensor(3))] == [3, 3, 3]
