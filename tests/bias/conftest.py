"""Helpers shared by the bias tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def _grid_score_mod(score_mod, batch: int, heads: int, q_len: int, k_len: int) -> torch.Tensor:
    """Evaluate a FlexAttention score_mod on broadcast index grids (score 0): ``[b, h, q, k]``."""
    b = torch.arange(batch)[:, None, None, None]
    h = torch.arange(heads)[None, :, None, None]
    q_idx = torch.arange(q_len)[None, None, :, None]
    kv_idx = torch.arange(k_len)[None, None, None, :]
    score = torch.zeros(batch, heads, q_len, k_len)
    return score_mod(score, b, h, q_idx, kv_idx)


@pytest.fixture
def grid_score_mod():
    """``grid_score_mod(score_mod, b, h, q, k)``: the score_mod on every index, ``[b, h, q, k]``."""
    return _grid_score_mod


@pytest.fixture
def as_tensor():
    """A float64 reference array as the float32 tensor posenc returns."""
    return lambda array: torch.from_numpy(np.asarray(array, dtype=np.float64)).to(torch.float32)
