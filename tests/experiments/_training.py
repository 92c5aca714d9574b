"""Helpers of the training tests: a run killed after a step, and resumed from its checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from posenc.experiments.tasks import Task
from posenc.experiments.train import StepInfo, TrainResult, TrainSettings, train


def stop_after(k: int) -> Callable[[StepInfo], None]:
    def hook(info: StepInfo) -> None:
        if info.step == k:
            raise KeyboardInterrupt  # what Ctrl-C (or a kill) does after step k

    return hook


def assert_state_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def kill_and_resume(
    model: nn.Module,
    fresh: Callable[[], nn.Module],
    task: Task,
    settings: TrainSettings,
    path: Path,
    *,
    config: dict[str, Any],
    stop: int,
    saved: int,
    on_step: Callable[[StepInfo], None] | None = None,
) -> tuple[nn.Module, TrainResult]:
    """Train ``model`` until it is killed after step ``stop`` (checked: its last checkpoint
    is the one of step ``saved``), then resume from that checkpoint in a ``fresh()`` model
    built under another generator state; returns that model and its result."""
    with pytest.raises(KeyboardInterrupt):
        train(model, task, settings, checkpoint=path, config=config, on_step=stop_after(stop))
    # The steps after the last checkpoint are lost with the process.
    assert torch.load(path, weights_only=True)["data"] == {"next_step": saved}
    torch.manual_seed(123)  # the generator state is restored from the checkpoint
    resumed_model = fresh()
    resumed = train(
        resumed_model, task, settings, checkpoint=path, config=config, resume=True, on_step=on_step
    )
    return resumed_model, resumed
