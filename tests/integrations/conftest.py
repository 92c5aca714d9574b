"""The transformers tests run small tensors and tiny models: one intra-op thread is as fast,
and two on a busy machine made them five to ten times slower (waiting for each other)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
