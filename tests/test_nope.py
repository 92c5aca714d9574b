"""posenc.nope: the identity, wherever an encoding is expected."""

from __future__ import annotations

import pytest
import torch

import posenc


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
@pytest.mark.parametrize("shape", [(2, 5, 8), (3, 4), (1, 2, 3, 4)])
def test_identity_of_any_shape_and_dtype(shape, dtype):
    x = torch.randn(shape).to(dtype)
    assert posenc.build("none")(x) is x


def test_ignores_positions_and_offset():
    x = torch.randn(2, 5, 8)
    assert posenc.NoPositionalEncoding()(x, torch.arange(5), offset=7) is x


def test_kind_config_and_state():
    pe = posenc.build("nope")
    assert isinstance(pe, posenc.NoPositionalEncoding)
    assert pe.kind == "none" and pe.name == "none"
    assert pe.to_config() == {"name": "none"}
    assert pe.state_dict() == {}
    assert isinstance(posenc.build(pe.to_config()), posenc.NoPositionalEncoding)


def test_takes_no_arguments():
    with pytest.raises(posenc.PosEncError, match=r"takes no arguments .*, got dim=8$"):
        posenc.build("none", dim=8)
