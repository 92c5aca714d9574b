"""The checkpoint the checkpoint tests write, read and damage: a tiny ``Linear`` and its AdamW
after one step, with the fields :func:`posenc.experiments.train.train` saves."""

from __future__ import annotations

import json
from typing import Any

import torch

from posenc.experiments import checkpoint as ckpt

CONFIG = {"task": "copy", "train": {"steps": 10}, "eval_lens": [8, 16], "world_size": 1}


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.AdamW(model.parameters())


def checkpoint_state(step: int = 3) -> dict[str, Any]:
    """A checkpoint's state after ``step`` steps of the run :data:`CONFIG`."""
    model, opt = model_and_optimizer()
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return {
        "config": json.dumps(CONFIG, sort_keys=True),
        "step": step,
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "rng": [ckpt.get_rng_state()],
        "data": {"next_step": step},
        "seconds": 1.5,
        "loss": [2.5, 2.0, 1.5][-step:] + [1.0] * max(0, min(step, 10) - 3),
    }
