"""Training a model on a task: AdamW, warmup + cosine, checkpoints, resume, DDP.

Determinism: the batch of step ``t`` comes from ``(seed, t)`` alone
(:mod:`.seeding`), the learning rate from ``t`` alone (:mod:`.schedule`), and a
checkpoint holds everything else that changes (weights, AdamW moments, generator
states). A run killed after step ``k`` and resumed from its last checkpoint at
step ``c <= k`` redoes steps ``c .. k`` from the saved state, so its final
weights equal those of an uninterrupted run, bit for bit on CPU.

Under ``torchrun`` the model is wrapped in ``DistributedDataParallel``; each
rank's loss is ``sum over its scored tokens / global scored tokens * world``,
so DDP's gradient average is the gradient of the global mean loss.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from posenc import positions as _positions
from posenc._errors import PosEncError, check_choice, check_float, check_int
from posenc.experiments.checkpoint import (
    checkpoint_max_bytes,
    get_rng_state,
    load_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from posenc.experiments.checkpoint_fields import LOSS_WINDOW, check_fits
from posenc.experiments.distributed import Dist
from posenc.experiments.optim import OPTIMIZERS, MuonAdamW, make_optimizer
from posenc.experiments.schedule import warmup_cosine
from posenc.experiments.seeding import generator
from posenc.experiments.tasks import IGNORE, Batch, Task

__all__ = [
    "StepInfo",
    "TrainDiverged",
    "TrainResult",
    "TrainSettings",
    "load_resumable",
    "run_config",
    "train",
]

Optimizer = torch.optim.Optimizer | MuonAdamW
_LOSS_WINDOW = LOSS_WINDOW  # final_loss averages the last steps' training losses


class TrainDiverged(PosEncError):
    """The training loss became NaN or infinite."""


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """How to train.

    Args:
        steps: optimizer steps, ``>= 1``.
        batch_size: sequences per step over all ranks (divisible by the world size).
        seq_len: tokens per training sequence (the training length).
        lr: peak learning rate of the warmup + cosine schedule.
        warmup: warmup steps.
        min_lr_ratio: final learning rate as a fraction of ``lr``.
        weight_decay: AdamW decoupled weight decay on matrices (not on vectors).
        grad_clip: global gradient-norm clip (0 for none).
        random_positions: ``L_max`` for randomized positions (Ruoss et al., 2023), or None.
        seed: data seed (batches are keyed by ``(seed, step)``).
        checkpoint_every: save every this many steps (and at the end); 0 saves only at the end.
        optimizer: ``"adamw"``, or ``"muon"`` (Muon on the hidden matrices, AdamW on the
            rest; :mod:`posenc.experiments.optim`).
        drope_step: DroPE (Gelberg et al., 2025): from this step on the model trains
            without its rotary encodings (``TinyTransformer.drop_rotary``), recalibrating
            for the remaining steps; None keeps them. A run resumed past it drops them
            before loading.
    """

    steps: int
    batch_size: int
    seq_len: int
    lr: float = 3e-3
    warmup: int = 0
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    random_positions: int | None = None
    seed: int = 0
    checkpoint_every: int = 0
    optimizer: str = "adamw"
    drope_step: int | None = None

    def __post_init__(self) -> None:
        # checked, and stored as plain int / float (a NumPy scalar would reach json.dumps)
        checked: dict[str, float] = {
            "steps": check_int("steps", self.steps, min=1),
            "batch_size": check_int("batch_size", self.batch_size, min=1),
            "seq_len": check_int("seq_len", self.seq_len, min=1),
            "lr": check_float("lr", self.lr, min=0.0, min_exclusive=True),
            "warmup": check_int("warmup", self.warmup, min=0),
            "min_lr_ratio": check_float("min_lr_ratio", self.min_lr_ratio, min=0.0, max=1.0),
            "weight_decay": check_float("weight_decay", self.weight_decay, min=0.0),
            "grad_clip": check_float("grad_clip", self.grad_clip, min=0.0),
            "seed": check_int("seed", self.seed),
            "checkpoint_every": check_int("checkpoint_every", self.checkpoint_every, min=0),
        }
        if self.random_positions is not None:
            checked["random_positions"] = check_int(
                "random_positions", self.random_positions, min=int(checked["seq_len"])
            )
        if self.drope_step is not None:
            checked["drope_step"] = check_int(
                "drope_step", self.drope_step, min=0, max=int(checked["steps"])
            )
        for name, value in checked.items():
            object.__setattr__(self, name, value)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What a progress callback sees after each step."""

    step: int  # steps done so far (1-based count)
    steps: int
    loss: float
    tokens_per_second: float


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """``steps`` run in total, ``final_loss`` (mean training loss of the last steps), the
    wall ``seconds`` spent training (summed over resumes) and the throughput."""

    steps: int
    final_loss: float
    seconds: float
    tokens_per_second: float
    resumed_from: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_config(config: dict[str, Any], settings: TrainSettings, world_size: int) -> dict[str, Any]:
    """What a checkpoint records as its run's configuration (and resuming must match):
    ``config`` plus the training settings and the world size, as plain JSON values."""
    return json.loads(json.dumps({**config, "train": settings.to_dict(), "world_size": world_size}))


def load_resumable(
    path: str | Path,
    model: nn.Module,
    optimizer: Optimizer | None,
    config: dict[str, Any],
) -> dict[str, Any]:
    """Load the checkpoint at ``path`` for the run ``config`` (see :func:`run_config`) and
    check that its weights and optimizer state fit ``model`` and ``optimizer`` (None:
    a fresh one for ``config["train"]``), before anything is loaded into them. The file
    may hold at most what a checkpoint of ``model`` can (:func:`.checkpoint_max_bytes`),
    checked before it is read."""
    world = config.get("world_size", 1)
    world = world if type(world) is int and 1 <= world <= 2**16 else 1
    state = load_checkpoint(path, config=config, max_bytes=checkpoint_max_bytes(model, world))
    if optimizer is None:
        optimizer = _optimizer(model, TrainSettings(**config["train"]))
    check_fits(f"checkpoint {str(path)!r}", state, model, optimizer)
    return state


def _optimizer(model: nn.Module, settings: TrainSettings) -> Optimizer:
    return make_optimizer(
        settings.optimizer, model, lr=settings.lr, weight_decay=settings.weight_decay
    )


def _batch_positions(settings: TrainSettings, step: int, rows: torch.Tensor) -> torch.Tensor | None:
    if settings.random_positions is None:
        return None
    g = generator(settings.seed, "train-positions", step)
    drawn = _positions.randomized(
        settings.seq_len, settings.random_positions, batch_size=settings.batch_size, generator=g
    )  # [B, s] over the global batch, so every world size draws the same
    return drawn[rows]


def train(
    model: nn.Module,
    task: Task,
    settings: TrainSettings,
    *,
    dist: Dist | None = None,
    checkpoint: str | Path | None = None,
    config: dict[str, Any] | None = None,
    resume: bool = False,
    on_step: Callable[[StepInfo], None] | None = None,
) -> TrainResult:
    """Train ``model`` (in place) on ``task``.

    Args:
        model: maps ``tokens [b, s]`` (and ``positions``) to logits ``[b, s, vocab]``;
            moved to ``dist.device``.
        task: where batches come from.
        settings: see :class:`TrainSettings`.
        dist: the process's place in a distributed run (default: one CPU process).
        checkpoint: file to save to (rank 0) and resume from; None disables checkpoints.
        config: the run's configuration, stored in the checkpoint; resuming under a
            different one is refused. The training settings and world size are added.
        resume: continue from ``checkpoint`` when it exists.
        on_step: called after every step (progress bars). An exception it raises
            (a ``KeyboardInterrupt``) stops training after that step.

    Raises:
        TrainDiverged: the loss became NaN or infinite (a :class:`PosEncError`).
    """
    dist = Dist() if dist is None else dist
    _check_world(settings, dist)
    full_config = run_config(config or {}, settings, dist.world_size)
    model.to(dist.device)
    optimizer = _optimizer(model, settings)
    run = _Progress()
    if checkpoint is not None and resume and Path(checkpoint).exists():
        run = _resume(checkpoint, model, optimizer, full_config, settings, dist)
    rows = dist.shard(settings.batch_size)
    stepper = _Stepper(model, _wrap(model, dist), optimizer, settings, dist, rows)
    tokens_per_step = settings.batch_size * settings.seq_len
    model.train()
    for step in range(run.start, settings.steps):
        if step == settings.drope_step:
            _drop_rotary(model)
        began = time.perf_counter()
        batch = task.train_batch(step, settings.batch_size, settings.seq_len, seed=settings.seed)
        loss = stepper.step(batch, step)
        elapsed = run.record(loss, began)
        done = step + 1
        if checkpoint is not None and _checkpoint_due(settings, done):
            _save(checkpoint, model, optimizer, full_config, done, run.seconds, run.losses, dist)
        if on_step is not None:
            on_step(StepInfo(done, settings.steps, loss, tokens_per_step / max(elapsed, 1e-9)))
    if settings.drope_step == settings.steps:  # dropped at the end: no recalibration
        _drop_rotary(model)
    return run.result(settings)


@dataclasses.dataclass
class _Progress:
    """Where a run stands: the first step this process runs, the training time (summed over
    resumes; ``local_seconds`` this process's alone, for the throughput) and the last losses."""

    start: int = 0
    seconds: float = 0.0
    losses: list[float] = dataclasses.field(default_factory=list)
    resumed_from: int | None = None
    local_seconds: float = 0.0

    def record(self, loss: float, began: float) -> float:
        """Keep a step's loss and add the time since ``began``; returns that time."""
        self.losses = [*self.losses, loss][-_LOSS_WINDOW:]
        elapsed = time.perf_counter() - began
        self.seconds += elapsed
        self.local_seconds += elapsed
        return elapsed

    def result(self, settings: TrainSettings) -> TrainResult:
        ran, spent = (
            (settings.steps - self.start, self.local_seconds)
            if self.start < settings.steps
            else (settings.steps, self.seconds)
        )
        return TrainResult(
            steps=settings.steps,
            final_loss=sum(self.losses) / len(self.losses),
            seconds=self.seconds,
            tokens_per_second=settings.batch_size * settings.seq_len * ran / max(spent, 1e-9),
            resumed_from=self.resumed_from,
        )


def _check_world(settings: TrainSettings, dist: Dist) -> None:
    if settings.batch_size % dist.world_size:
        raise PosEncError(
            f"batch_size must be divisible by the world size ({dist.world_size}), "
            f"got {settings.batch_size}"
        )


def _resume(
    checkpoint: str | Path,
    model: nn.Module,
    optimizer: Optimizer,
    config: dict[str, Any],
    settings: TrainSettings,
    dist: Dist,
) -> _Progress:
    """Load the checkpoint into ``model``, ``optimizer`` and this rank's generators (the
    rotary encodings dropped first when it was saved past ``drope_step``)."""
    state = load_resumable(checkpoint, model, optimizer, config)
    start = int(state["data"]["next_step"])
    if settings.drope_step is not None and start >= settings.drope_step:
        _drop_rotary(model)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"][dist.rank])
    losses = [float(x) for x in state["loss"]]
    return _Progress(start, float(state["seconds"]), losses, resumed_from=start)


def _wrap(model: nn.Module, dist: Dist) -> nn.Module:
    """``model`` in ``DistributedDataParallel`` under torchrun, else itself."""
    if not dist.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [dist.device.index] if dist.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


@dataclasses.dataclass(frozen=True)
class _Stepper:
    """What every step uses: the model and what computes its logits (the model, or its DDP
    wrapper), the optimizer, the settings, this rank's place and its rows."""

    model: nn.Module
    wrapped: nn.Module
    optimizer: Optimizer
    settings: TrainSettings
    dist: Dist
    rows: torch.Tensor  # this rank's rows of every global batch

    def step(self, batch: Batch, step: int) -> float:
        """One optimizer step on this rank's rows of the global ``batch``; returns the
        global mean loss (the same on every rank)."""
        settings, dist, rows = self.settings, self.dist, self.rows
        count = int((batch.targets != IGNORE).sum())  # scored tokens of the global batch
        tokens = batch.tokens[rows].to(dist.device)
        targets = batch.targets[rows].to(dist.device)
        positions = _batch_positions(settings, step, rows)
        if positions is not None:
            positions = positions.to(dist.device)
        _set_lr(self.optimizer, settings, step)

        logits = self.wrapped(tokens, positions)  # [b, s, vocab]
        loss_sum = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            targets.reshape(-1),
            ignore_index=IGNORE,
            reduction="sum",
        )
        self.optimizer.zero_grad(set_to_none=True)
        (loss_sum * (dist.world_size / count)).backward()
        if settings.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), settings.grad_clip)
        self.optimizer.step()

        loss = float(dist.all_reduce_sum(loss_sum.detach().double().reshape(1).cpu())[0]) / count
        if not math.isfinite(loss):
            raise TrainDiverged(f"training loss became {loss} at step {step + 1}; lower the lr")
        return loss


def _set_lr(optimizer: Optimizer, settings: TrainSettings, step: int) -> None:
    """The warmup + cosine learning rate of ``step``, in every parameter group."""
    lr = warmup_cosine(
        step,
        steps=settings.steps,
        peak=settings.lr,
        warmup=settings.warmup,
        min_ratio=settings.min_lr_ratio,
    )
    for group in optimizer.param_groups:
        group["lr"] = lr


def _checkpoint_due(settings: TrainSettings, done: int) -> bool:
    """Whether a checkpoint is saved after ``done`` steps: every ``checkpoint_every``, and
    at the end."""
    every = settings.checkpoint_every
    return done == settings.steps or bool(every and done % every == 0)


def _drop_rotary(model: nn.Module) -> None:
    drop = getattr(model, "drop_rotary", None)
    if drop is None:
        raise PosEncError(
            f"drope_step needs a model with drop_rotary() (a TinyTransformer), got "
            f"{type(model).__name__}"
        )
    drop()


def _save(
    path: str | Path,
    model: nn.Module,
    optimizer: Optimizer,
    config: dict[str, Any],
    done: int,
    seconds: float,
    losses: list[float],
    dist: Dist,
) -> None:
    rng = dist.gather_objects(get_rng_state())  # every rank's generators, in rank order
    if dist.is_main:
        save_checkpoint(
            path,
            {
                "config": json.dumps(config, sort_keys=True),
                "step": done,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "rng": rng,
                "data": {"next_step": done},
                "seconds": seconds,
                "loss": list(losses),
            },
        )
    dist.barrier()
