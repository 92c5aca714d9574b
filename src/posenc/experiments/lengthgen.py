"""Length-generalization studies: train at one length, evaluate at longer ones.

:func:`run_study` trains one :class:`~posenc.models.TinyTransformer` per encoding
on a task (:mod:`.tasks`) at ``train_len``, evaluates each at every eval length
(:mod:`.evaluate`), optionally extends the RoPE model's context at evaluation
time (position interpolation, NTK, YaRN; :mod:`.extension`) with and without a
short fine-tune at the longest eval length, and returns (and writes) the results:

.. code-block:: text

    {"task", "train_len", "eval_lens", "metric", "settings", "environment",
     "runs": [{"encoding", "config", "train": {"steps", "final_loss", "seconds", ...},
               "eval": {"<len>": {"loss", "ppl" | "accuracy", ...} | {"error"}}}],
     "seconds"}

Every model of a study starts from the same seed and sees the same batches in the
same order; only the encoding differs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from posenc._errors import PosEncError, check_int
from posenc.experiments.checkpoint import atomic_write
from posenc.experiments.distributed import Dist, setup
from posenc.experiments.evaluate import evaluate
from posenc.experiments.extension import extended_config
from posenc.experiments.models import build_model
from posenc.experiments.outdir import lock_out_dir
from posenc.experiments.seeding import derive_seed
from posenc.experiments.settings import DEFAULT_ENCODINGS, PRESETS, Study, resolve, study_bytes
from posenc.experiments.tasks import LMTask, Task, make_task
from posenc.experiments.train import (
    TrainResult,
    TrainSettings,
    load_resumable,
    run_config,
    train,
)

if TYPE_CHECKING:
    from posenc.models import TinyTransformer

__all__ = ["DEFAULT_ENCODINGS", "PRESETS", "Event", "run_study", "write_results"]

#: A progress callback receives ``(kind, fields)``: ``("run", {"label", "steps"})`` before a
#: model trains, ``("step", {"label", "info": StepInfo})`` after each step, ``("eval",
#: {"label"})`` before it is evaluated and ``("done", {"label"})`` after.
Event = Callable[[str, dict[str, Any]], None]

_EVAL_MAX_TOKENS = 8192  # tokens per eval forward pass (fewer for long windows, see evaluate)


def _check_out_dir(out_dir: Path) -> None:
    """``out_dir`` names a folder that can be made and written. A path that cannot be a
    folder is the caller's mistake (PosEncError); a folder the environment refuses
    (permissions, a read-only or full file system) is an OSError, as it is."""
    if not str(out_dir).strip():
        raise PosEncError(f"out_dir must name a folder, got {str(out_dir)!r}")
    if out_dir.exists() and not out_dir.is_dir():
        raise PosEncError(f"out_dir must be a folder, got the file {str(out_dir)!r}")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        raise PosEncError(f"out_dir {str(out_dir)!r} cannot be created ({e.strerror})") from None
    with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".posenc-write-test-"):
        pass


def write_results(results: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> Path:
    """Write ``results`` to ``out_dir/results.json`` atomically; returns the path."""
    path = Path(out_dir) / "results.json"
    text = json.dumps(results, indent=2, allow_nan=False) + "\n"
    atomic_write(path, text.encode("utf-8"))
    return path


def _gb(n: float) -> str:
    """``803 GB``, ``2.76 TB``: decimal units, three digits."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000:
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"


def _train_record(result: TrainResult, **extra: Any) -> dict[str, Any]:
    return {**result.to_dict(), **extra}


class _Runner:
    """Trains, extends and evaluates the runs of one study."""

    def __init__(
        self,
        study: Study,
        task: Task,
        dist: Dist,
        ckpt_dir: Path | None,
        resume: bool,
        on_event: Event | None,
    ) -> None:
        self.s, self.task, self.dist = study, task, dist
        self.ckpt_dir, self.resume, self.on_event = ckpt_dir, resume, on_event
        # The longest position any training step sees (sizes learned tables).
        self.max_len = max(study.train_len, study.train.random_positions or 0)

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.on_event is not None and self.dist.is_main:
            self.on_event(kind, fields)

    def _ckpt(self, label: str) -> Path | None:
        return None if self.ckpt_dir is None else self.ckpt_dir / f"{label}.pt"

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
            seed=derive_seed(self.s.train.seed, "init"),
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
        result = train(
            model,
            self.task,
            settings,
            dist=self.dist,
            checkpoint=self._ckpt(label),
            config=self._config(label, model, **extra),
            resume=self.resume,
            on_step=lambda info: self._emit("step", label=label, info=info),
        )
        return result

    def evaluate(self, label: str, model: TinyTransformer) -> dict[str, Any]:
        self._emit("eval", label=label)
        out = evaluate(
            model,
            self.task,
            self.s.eval_lens,
            train_len=self.s.train_len,
            seed=self.s.train.seed,
            dist=self.dist,
            random_positions=self.s.train.random_positions,
            max_tokens=_EVAL_MAX_TOKENS,
        )
        self._emit("done", label=label)
        return out

    def finetune_settings(self) -> TrainSettings:
        length = max(self.s.eval_lens)
        base = self.s.train
        return dataclasses.replace(
            base,
            steps=self.s.finetune_steps,
            batch_size=max(
                self.dist.world_size,
                base.batch_size
                * base.seq_len
                // length
                // self.dist.world_size
                * self.dist.world_size,
            ),
            seq_len=length,
            lr=base.lr / 3,
            warmup=max(1, self.s.finetune_steps // 10),
            random_positions=None,
            seed=derive_seed(base.seed, "finetune"),
        )


def _dry_run(label: str, model: TinyTransformer, study: Study) -> None:
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
    runner: _Runner, base: TinyTransformer, base_train: dict[str, Any], validate_only: bool = False
) -> list[dict[str, Any]]:
    s = runner.s
    runs = []
    state = base.state_dict()
    for method in s.extend:
        config = extended_config(base.to_config(), method, s.extend_factor, s.train_len)
        from posenc.models import TinyTransformer

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
                    "config": extended.encoding.to_config(),
                    "train": _train_record(
                        result, **{"from": "rope", "seq_len": ft_settings.seq_len}
                    ),
                    "eval": runner.evaluate(ft_label, extended),
                }
            )
    return runs


def run_study(
    task: str = "lm",
    encodings: Sequence[str | Mapping[str, Any]] | str = DEFAULT_ENCODINGS,
    *,
    train_len: int | None = None,
    eval_lens: Sequence[int] | None = None,
    steps: int | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    device: str = "cpu",
    seed: int = 0,
    preset: str = "default",
    batch_size: int | None = None,
    dim: int | None = None,
    num_layers: int | None = None,
    num_heads: int | None = None,
    lr: float | None = None,
    warmup: int | None = None,
    random_positions: int | None = None,
    extend: Sequence[str] | str | None = None,
    extend_factor: float | None = None,
    finetune_steps: int | None = None,
    checkpoint_every: int | None = None,
    eval_tokens: int | None = None,
    eval_examples: int | None = None,
    resume: bool = False,
    threads: int | None = None,
    plot: bool = True,
    on_event: Event | None = None,
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """Train a model per encoding at ``train_len``, evaluate it at ``eval_lens``.

    Settings left as None come from ``PRESETS[preset]``.

    Args:
        task: ``"lm"``, ``"copy"``, ``"reverse"``, ``"recall"`` or ``"addition"``.
        encodings: registry names (or config dicts), e.g. ``["none", "rope", "alibi"]``.
        train_len: training sequence length ``L``.
        eval_lens: evaluation lengths (``L, 2L, 4L, 8L`` in the presets).
        steps: training steps per encoding.
        out_dir: where ``results.json``, ``lengthgen.png`` and ``checkpoints/`` go;
            None keeps everything in memory (no checkpoints).
        device: ``"cpu"`` or ``"cuda"``.
        seed: seeds initialisation, data, eval sets and randomized positions.
        preset: ``"default"`` or ``"quick"``.
        batch_size, dim, num_layers, num_heads, lr: model and optimizer sizes.
        warmup: warmup steps of the learning rate (default: a tenth of ``steps``).
        random_positions: train on randomized positions drawn from ``[0, L_max)``
            (Ruoss et al., 2023); ``L_max >= train_len``.
        extend: RoPE context extension methods evaluated on the trained ``rope`` model:
            ``"pi"``, ``"ntk"``, ``"yarn"``.
        extend_factor: their scaling factor (default ``max(eval_lens) / train_len``).
        finetune_steps: with ``extend``, also fine-tune each extended model for this many
            steps at ``max(eval_lens)`` (0: no fine-tune).
        checkpoint_every: checkpoint every this many steps (needs ``out_dir``).
        eval_tokens: validation bytes scored per eval length (``lm``).
        eval_examples: examples per eval length (synthetic tasks).
        resume: continue from the checkpoints in ``out_dir`` (same configuration only).
        threads: torch intra-op threads while the study runs (restored after); None keeps
            the current setting. Models this small gain little from a second thread, and one
            thread per process stays fast on a busy CPU (``posenc lengthgen`` uses 1).
        plot: write ``lengthgen.png`` (needs matplotlib, ``pip install 'posenc[plot]'``).
        on_event: progress callback, see :data:`Event`.
        max_bytes: refuse a study whose estimated peak memory per process
            (:func:`~posenc.experiments.settings.study_bytes`) is above this many bytes,
            before anything is allocated (``posenc lengthgen`` passes its limit); None: no limit.

    Returns:
        The results dict (see the module docstring); also written to
        ``out_dir/results.json`` by rank 0.

    Raises:
        PosEncError: bad settings, a study over ``max_bytes``, an ``out_dir`` that is empty,
            a file or under a file, an ``out_dir`` another live run holds
            (``OUT/.posenc.lock``), or a checkpoint that is damaged, crafted or from another
            configuration (all checked before anything trains).
        OSError: ``out_dir`` cannot be written (permissions, a read-only or full file
            system); files written before (``results.json``, checkpoints, the figure) are
            left whole, every one is written atomically.
    """
    started = time.perf_counter()
    if threads is not None:
        threads = check_int("threads", threads, min=1)
    dist = setup(device)
    threads_before = torch.get_num_threads()
    held = contextlib.ExitStack()  # the lock of out_dir, held by rank 0 until the end
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        study = resolve(
            task,
            encodings,
            {
                "preset": preset,
                "train_len": train_len,
                "eval_lens": eval_lens,
                "steps": steps,
                "batch_size": batch_size,
                "dim": dim,
                "num_layers": num_layers,
                "num_heads": num_heads,
                "lr": lr,
                "warmup": warmup,
                "random_positions": random_positions,
                "extend": extend,
                "extend_factor": extend_factor,
                "finetune_steps": finetune_steps,
                "checkpoint_every": checkpoint_every,
                "eval_tokens": eval_tokens,
                "eval_examples": eval_examples,
                "seed": seed,
            },
            dist.world_size,
        )
        if max_bytes is not None:
            need = study_bytes(study, eval_max_tokens=_EVAL_MAX_TOKENS, world_size=dist.world_size)
            if need > max_bytes:
                raise PosEncError(
                    f"this study needs about {_gb(need)} of memory per process (dim {study.model.dim}, "
                    f"{study.model.num_layers} layers, batch_size {study.train.batch_size}, "
                    f"lengths up to {max(study.train_len, *study.eval_lens)}), over the limit of "
                    f"{_gb(max_bytes)}"
                )
        if resume and out_dir is None:
            raise PosEncError("resume needs out_dir (where the checkpoints are), got None")
        if out_dir is not None and not str(out_dir).strip():  # Path("") would be "."
            raise PosEncError(f"out_dir must name a folder, got {str(out_dir)!r}")
        out = None if out_dir is None else Path(out_dir)
        if out is not None:
            if dist.is_main:
                _check_out_dir(out)
                held.enter_context(lock_out_dir(out))  # refuses a second run into out_dir
            dist.barrier()
        task_obj = make_task(task, eval_tokens=study.eval_tokens, eval_examples=study.eval_examples)
        task_obj.check_length("train_len", study.train_len)
        for length in study.eval_lens:
            task_obj.check_length("eval_lens entry", length)
        if study.finetune_steps:
            task_obj.check_length("eval_lens entry", max(study.eval_lens))
        runner = _Runner(
            study, task_obj, dist, None if out is None else out / "checkpoints", resume, on_event
        )
        with torch.random.fork_rng(devices=[]):
            # Build and try every model (and check every checkpoint) before anything trains.
            for label, spec in zip(study.labels, study.specs):
                model = runner.build(spec)
                _dry_run(label, model, study)
                runner.check_resumable(label, model, study.train)
                if label == "rope" and study.extend:
                    _extension_runs(runner, model, {}, validate_only=True)
            runs = []
            for label, spec in zip(study.labels, study.specs):
                model = runner.build(spec)
                result = runner.fit(label, model, study.train)
                record = _train_record(result)
                runs.append(
                    {
                        "encoding": label,
                        "config": model.encoding.to_config(),
                        "train": record,
                        "eval": runner.evaluate(label, model),
                    }
                )
                if label == "rope" and study.extend:
                    runs.extend(_extension_runs(runner, model, record))
        results = _results(study, task_obj, runs, dist, device, time.perf_counter() - started)
        if out is not None and dist.is_main:
            write_results(results, out)
            if plot:
                from posenc.experiments.figure import plot_study

                plot_study(results, out / "lengthgen.png")
        dist.barrier()
        return results
    finally:
        held.close()
        torch.set_num_threads(threads_before)
        dist.close()


def _results(
    study: Study, task: Task, runs: list[dict[str, Any]], dist: Dist, device: str, seconds: float
) -> dict[str, Any]:
    settings = {
        "model": study.model.to_dict(),
        "train": study.train.to_dict(),
        "extend": list(study.extend),
        "extend_factor": study.extend_factor if study.extend else None,
        "finetune_steps": study.finetune_steps,
        "eval_tokens": study.eval_tokens if isinstance(task, LMTask) else None,
        "eval_examples": None if isinstance(task, LMTask) else study.eval_examples,
    }
    environment = {
        "device": device,
        "world_size": dist.world_size,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if isinstance(task, LMTask):
        environment["corpus"] = {
            "root": task.corpus.root,
            "train_bytes": int(task.corpus.train.numel()),
            "validation_bytes": int(task.corpus.validation.numel()),
            "files": list(task.corpus.num_files),
        }
    return {
        "task": study.task,
        "train_len": study.train_len,
        "eval_lens": list(study.eval_lens),
        "metric": task.metric,
        "settings": settings,
        "environment": environment,
        "runs": runs,
        "seconds": seconds,
    }
