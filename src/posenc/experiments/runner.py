"""The runs of one study seed: train a model per encoding, evaluate it, extend RoPE.

A *unit* is one ``(seed, encoding)`` pair: :func:`run_unit` trains the encoding's model
with that seed, evaluates it at every eval length and, for ``rope`` in a study that
extends it, adds the extension runs (each with its optional fine-tune). Units share
nothing but the study's settings, so they run in any order or in separate processes
(:mod:`.parallel`) and give the same numbers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from posenc._errors import PosEncError
from posenc.experiments.distributed import Dist
from posenc.experiments.evaluate import evaluate
from posenc.experiments.extension import extended_config
from posenc.experiments.models import build_model
from posenc.experiments.seeding import derive_seed
from posenc.experiments.settings import StudySettings
from posenc.experiments.tasks import Task
from posenc.experiments.train import TrainResult, TrainSettings, load_resumable, run_config, train

if TYPE_CHECKING:
    from posenc.models import TinyTransformer

__all__ = ["EVAL_MAX_TOKENS", "Runner", "dry_run", "run_unit", "seed_study"]

EVAL_MAX_TOKENS = 8192  # tokens per eval forward pass (fewer for long windows, see evaluate)

#: ``(kind, fields)``: see :data:`posenc.experiments.lengthgen.Event`.
Emit = Callable[[str, dict[str, Any]], None]


def seed_study(study: StudySettings, seed: int) -> StudySettings:
    """``study`` with ``seed`` as its one seed (initialisation, data, eval sets)."""
    return dataclasses.replace(study, train=dataclasses.replace(study.train, seed=seed))


def _train_record(result: TrainResult, **extra: Any) -> dict[str, Any]:
    return {**result.to_dict(), **extra}


class Runner:
    """Trains, extends and evaluates the runs of one study seed.

    ``study`` carries the seed (:func:`seed_study`); checkpoints go to
    ``ckpt_dir/<label><suffix>.pt``, where ``suffix`` tells seeds apart in a study of
    several (``.seed<N>``; empty for a study of one seed, the layout of earlier releases).
    """

    def __init__(
        self,
        study: StudySettings,
        task: Task,
        dist: Dist,
        ckpt_dir: Path | None,
        resume: bool,
        on_event: Emit | None,
        suffix: str = "",
    ) -> None:
        self.s, self.task, self.dist = study, task, dist
        self.ckpt_dir, self.resume, self.on_event = ckpt_dir, resume, on_event
        self.suffix = suffix
        # The longest position any training step sees (sizes learned tables).
        self.max_len = max(study.train_len, study.train.random_positions or 0)

    @property
    def seed(self) -> int:
        return self.s.train.seed

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.on_event is not None and self.dist.is_main:
            self.on_event(kind, {**fields, "seed": self.seed})

    def _ckpt(self, label: str) -> Path | None:
        return None if self.ckpt_dir is None else self.ckpt_dir / f"{label}{self.suffix}.pt"

    def _config(self, label: str, model: TinyTransformer, **extra: Any) -> dict[str, Any]:
        return {
            "task": self.s.task,
            "label": label,
            "model": model.to_config(),
            "eval_tokens": self.s.eval_tokens,
            **extra,
        }

    def build(self, spec: Mapping[str, Any]) -> TinyTransformer:
        return build_model(
            self.task.vocab_size,
            spec,
            self.s.model,
            max_len=self.max_len,
            seed=derive_seed(self.seed, "init"),
            train_len=self.s.train_len,
            layer=dict(self.s.layer),
        )

    def train_settings(self, spec: Mapping[str, Any]) -> TrainSettings:
        """The study's training settings for ``spec`` (the ``drope`` variant's drop step)."""
        if "drope_at" not in spec:
            return self.s.train
        steps = self.s.train.steps
        return dataclasses.replace(
            self.s.train, drope_step=min(steps, round(float(spec["drope_at"]) * steps))
        )

    def check_resumable(
        self, label: str, model: TinyTransformer, settings: TrainSettings, **extra: Any
    ) -> None:
        path = self._ckpt(label)
        if self.resume and path is not None and path.exists():
            config = run_config(self._config(label, model, **extra), settings, self.dist.world_size)
            load_resumable(path, model, None, config)

    def fit(
        self, label: str, model: TinyTransformer, settings: TrainSettings, **extra: Any
    ) -> TrainResult:
        self._emit("run", label=label, steps=settings.steps)
        return train(
            model,
            self.task,
            settings,
            dist=self.dist,
            checkpoint=self._ckpt(label),
            config=self._config(label, model, **extra),
            resume=self.resume,
            on_step=lambda info: self._emit("step", label=label, info=info),
        )

    def evaluate(self, label: str, model: TinyTransformer) -> dict[str, Any]:
        self._emit("eval", label=label)
        out = evaluate(
            model,
            self.task,
            self.s.eval_lens,
            train_len=self.s.train_len,
            seed=self.seed,
            dist=self.dist,
            random_positions=self.s.train.random_positions,
            max_tokens=EVAL_MAX_TOKENS,
        )
        self._emit("done", label=label)
        return out

    def finetune_settings(self) -> TrainSettings:
        length = max(self.s.eval_lens)
        base, world = self.s.train, self.dist.world_size
        return dataclasses.replace(
            base,
            steps=self.s.finetune_steps,
            batch_size=max(world, base.batch_size * base.seq_len // length // world * world),
            seq_len=length,
            lr=base.lr / 3,
            warmup=max(1, self.s.finetune_steps // 10),
            random_positions=None,
            seed=derive_seed(base.seed, "finetune"),
        )

    def validate(self, label: str, spec: Mapping[str, Any]) -> None:
        """Build the unit's model, try it on 2 tokens and check its checkpoints (and its
        extensions'), so that a bad encoding or checkpoint fails before anything trains."""
        model = self.build(spec)
        dry_run(label, model, self.s)
        self.check_resumable(label, model, self.train_settings(spec))
        if label == "rope" and self.s.extend:
            _extension_runs(self, model, {}, validate_only=True)


def dry_run(label: str, model: TinyTransformer, study: StudySettings) -> None:
    """One forward pass on 2 tokens, positioned as in training: an encoding that cannot
    take 1-D sequences (N-D RoPE) fails here, before any model trains."""
    length = min(2, study.train_len)
    tokens = torch.zeros(1, length, dtype=torch.long)
    positions = None
    if study.train.random_positions is not None:
        positions = torch.arange(length)[None, :]  # [1, s], the shape training passes
    try:
        with torch.no_grad():
            model(tokens, positions)
    except PosEncError as e:
        raise PosEncError(f"encoding {label!r} cannot run on token sequences here: {e}") from e


def _extension_runs(
    runner: Runner, base: TinyTransformer, base_train: dict[str, Any], validate_only: bool = False
) -> list[dict[str, Any]]:
    from posenc.models import TinyTransformer

    s = runner.s
    runs = []
    state = base.state_dict()
    for method in s.extend:
        config = extended_config(base.to_config(), method, s.extend_factor, s.train_len)
        extended = TinyTransformer.from_config(config)
        extended.load_state_dict(state)
        label = f"rope+{method}"
        ft_label = f"{label}+ft"
        ft_settings = runner.finetune_settings() if s.finetune_steps else None
        if validate_only:
            if ft_settings is not None:
                runner.check_resumable(ft_label, extended, ft_settings, base="rope")
            continue
        extended.to(runner.dist.device)
        runs.append(
            {
                "encoding": label,
                "seed": runner.seed,
                "config": extended.encoding.to_config(),
                "train": {
                    "steps": 0,
                    "final_loss": None,
                    "seconds": 0.0,
                    "from": "rope",
                    "base_final_loss": base_train.get("final_loss"),
                },
                "eval": runner.evaluate(label, extended),
            }
        )
        if ft_settings is not None:
            result = runner.fit(ft_label, extended, ft_settings, base="rope")
            runs.append(
                {
                    "encoding": ft_label,
                    "seed": runner.seed,
                    "config": extended.encoding.to_config(),
                    "train": _train_record(
                        result, **{"from": "rope", "seq_len": ft_settings.seq_len}
                    ),
                    "eval": runner.evaluate(ft_label, extended),
                }
            )
    return runs


def run_unit(runner: Runner, label: str, spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Train, evaluate and (``rope`` in a study that extends it) extend one encoding with
    the runner's seed; returns its run records (the trained model's first)."""
    with torch.random.fork_rng(devices=[]):  # the caller's global generator is left as it was
        model = runner.build(spec)
        result = runner.fit(label, model, runner.train_settings(spec))
        record = _train_record(result)
        runs = [
            {
                "encoding": label,
                "seed": runner.seed,
                "config": model.encoding.to_config(),
                "train": record,
                "eval": runner.evaluate(label, model),
            }
        ]
        if label == "rope" and runner.s.extend:
            runs.extend(_extension_runs(runner, model, record))
    return runs
