"""Shared test settings: deterministic seeds, tolerances per dtype, hypothesis profile."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# Under pytest-xdist every worker gets one thread: workers already fill the cores, and
# oversubscribed intra-op threads make small ops many times slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
else:
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

settings.register_profile(
    "posenc",
    deadline=None,
    max_examples=50,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("posenc")

# Absolute tolerance against the float64 reference, per output dtype.
ATOL = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
