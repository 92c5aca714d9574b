"""Length-generalization studies: train at one length, evaluate at longer ones.

:func:`run_study` trains one :class:`~posenc.models.TinyTransformer` per encoding
on a task (:mod:`.tasks`) at ``train_len``, evaluates each at every eval length
(:mod:`.evaluate`), optionally extends the RoPE model's context at evaluation
time (position interpolation, NTK, YaRN; :mod:`.extension`) with and without a
short fine-tune at the longest eval length, and returns (and writes) the results:

.. code-block:: text

    {"task", "train_len", "eval_lens", "metric", "seeds", "settings", "environment",
     "runs": [{"encoding", "seed", "config",
               "train": {"steps", "final_loss", "seconds", ...},
               "eval": {"<len>": {"loss", "ppl" | "accuracy", ...} | {"error"}}}],
     "summary": {"<encoding>": {"<len>": {"seeds", "<metric>": {"mean", "min", "max"}, ...}}},
     "seconds"}

With each seed, every model of a study starts from the same initialisation seed and sees
the same batches in the same order; only the encoding differs. Several seeds repeat the
whole comparison; ``summary`` (:func:`.results.summarize`) holds the spread. The
``(seed, encoding)`` units run in this process or in ``jobs`` worker processes
(:mod:`.parallel`) with the same numbers either way.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from posenc._errors import PosEncError, check_int
from posenc.experiments.distributed import setup
from posenc.experiments.outdir import lock_out_dir
from posenc.experiments.parallel import Unit, UnitContext, default_jobs, run_units
from posenc.experiments.results import results_record, write_results
from posenc.experiments.runner import EVAL_MAX_TOKENS
from posenc.experiments.settings import (
    DEFAULT_ENCODINGS,
    PRESETS,
    make_study_task,
    resolve,
    study_bytes,
)

__all__ = [
    "DEFAULT_ENCODINGS",
    "MAX_JOBS",
    "PRESETS",
    "Event",
    "default_jobs",
    "run_study",
    "write_results",
]

#: A progress callback receives ``(kind, fields)``; every ``fields`` has the run's
#: ``label`` and ``seed``: ``("run", {"steps"})`` before a model trains, ``("step",
#: {"info": StepInfo})`` after each step (fewer from worker processes, a few a second),
#: ``("eval", {})`` before it is evaluated and ``("done", {})`` after.
Event = Callable[[str, dict[str, Any]], None]

MAX_JOBS = 1024  # worker processes of one study


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


def _gb(n: float) -> str:
    """``803 GB``, ``2.76 TB``: decimal units, three digits."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000:
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"


def run_study(
    task: str = "lm",
    encodings: Sequence[str | Mapping[str, Any]] | str = DEFAULT_ENCODINGS,
    *,
    train_len: int | None = None,
    eval_lens: Sequence[int] | None = None,
    steps: int | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    device: str = "cpu",
    seed: int | None = None,
    seeds: Sequence[int] | str | None = None,
    jobs: int = 1,
    preset: str = "default",
    batch_size: int | None = None,
    dim: int | None = None,
    num_layers: int | None = None,
    num_heads: int | None = None,
    lr: float | None = None,
    warmup: int | None = None,
    optimizer: str | None = None,
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
    num_vars: int | None = None,
    eval_split: str | None = None,
    qk_norm: bool | None = None,
    temperature: str | Mapping[str, Any] | None = None,
    drope_at: float | None = None,
) -> dict[str, Any]:
    """Train a model per encoding at ``train_len``, evaluate it at ``eval_lens``.

    Settings left as None come from ``PRESETS[preset]``.

    Args:
        task: ``"lm"``, ``"copy"``, ``"reverse"``, ``"recall"``, ``"addition"``,
            ``"counting"`` or ``"flipflop"``.
        encodings: registry names (or config dicts), e.g. ``["none", "rope", "alibi"]``,
            study variants (``"prope-0.75"``, ``"drope"``:
            :data:`~posenc.experiments.models.VARIANTS`), each optionally with a per-layer
            schedule, ``"rope@nope-every-4"`` (:data:`posenc.models.schedules.SCHEDULES`).
        train_len: training sequence length ``L``.
        eval_lens: evaluation lengths (``L, 2L, 4L, 8L`` in the presets).
        steps: training steps per encoding.
        out_dir: where ``results.json``, ``lengthgen.png`` and ``checkpoints/`` go;
            None keeps everything in memory (no checkpoints).
        device: ``"cpu"`` or ``"cuda"``.
        seed: seeds initialisation, data, eval sets and randomized positions (default 0).
        seeds: several seeds (``[0, 1, 2]`` or ``"0,1,2"``), each training every encoding;
            excludes ``seed``. Each run records its ``seed``; ``summary`` the spread.
        jobs: worker processes the ``(seed, encoding)`` units are spread over (1: all in
            this process; ``posenc lengthgen`` uses :func:`default_jobs`). The numbers do not
            depend on it. Not with ``torchrun`` (its ranks already share every step).
        preset: ``"default"`` or ``"quick"``.
        batch_size, dim, num_layers, num_heads, lr: model and optimizer sizes.
        warmup: warmup steps of the learning rate (default: a tenth of ``steps``).
        optimizer: ``"adamw"`` or ``"muon"`` (Muon on the hidden matrices, AdamW on the
            rest: :mod:`posenc.experiments.optim`).
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
        threads: torch intra-op threads per process while the study runs (restored after);
            None keeps the current setting (in workers: the cores shared out among them).
            Models this small gain little from a second thread, and one thread per process
            stays fast on a busy CPU (``posenc lengthgen`` uses 1).
        plot: write ``lengthgen.png`` (needs matplotlib, ``pip install 'posenc[plot]'``).
        on_event: progress callback, see :data:`Event`.
        num_vars: the ``counting`` task's variables (1-5; default 3).
        eval_split: the ``flipflop`` task's main eval split (``"sparse"``, the default;
            the other splits are reported under ``"splits"``).
        qk_norm: every layer of every model normalises its queries and keys.
        temperature: every layer's query temperature, ``"llama4"`` or ``"ssmax"`` (or a
            dict, :mod:`posenc.models.layers`).
        drope_at: the ``drope`` variant drops RoPE after this fraction of the steps (0.85).
        max_bytes: refuse a study whose estimated peak memory
            (:func:`~posenc.experiments.settings.study_bytes`, times the worker processes) is
            above this many bytes, before anything is allocated (``posenc lengthgen`` passes
            its limit); None: no limit.

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
        threads = check_int("threads", threads, min=1, max=MAX_JOBS)
    jobs = check_int("jobs", jobs, min=1, max=MAX_JOBS)
    dist = setup(device)
    threads_before = torch.get_num_threads()
    held = contextlib.ExitStack()  # the lock of out_dir, held by rank 0 until the end
    try:
        if jobs > 1 and dist.world_size > 1:
            raise PosEncError(
                f"jobs must be 1 under torchrun (its {dist.world_size} processes already share "
                f"every step), got {jobs}"
            )
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
                "optimizer": optimizer,
                "random_positions": random_positions,
                "extend": extend,
                "extend_factor": extend_factor,
                "finetune_steps": finetune_steps,
                "checkpoint_every": checkpoint_every,
                "eval_tokens": eval_tokens,
                "eval_examples": eval_examples,
                "seed": seed,
                "seeds": seeds,
                "num_vars": num_vars,
                "eval_split": eval_split,
                "qk_norm": qk_norm,
                "temperature": temperature,
                "drope_at": drope_at,
            },
            dist.world_size,
        )
        units = [
            Unit(s, label, spec)
            for label, spec in zip(study.labels, study.specs)
            for s in study.seeds
        ]
        workers = min(jobs, len(units))
        if max_bytes is not None:
            need = study_bytes(study, eval_max_tokens=EVAL_MAX_TOKENS, world_size=dist.world_size)
            if need * workers > max_bytes:
                total = f", {_gb(need * workers)} for its {workers} workers" if workers > 1 else ""
                raise PosEncError(
                    f"this study needs about {_gb(need)} of memory per process{total} (dim "
                    f"{study.model.dim}, {study.model.num_layers} layers, batch_size "
                    f"{study.train.batch_size}, lengths up to "
                    f"{max(study.train_len, *study.eval_lens)}), over the limit of "
                    f"{_gb(max_bytes)}" + ("; use fewer jobs" if workers > 1 else "")
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
        task_obj = make_study_task(study)
        task_obj.check_length("train_len", study.train_len)
        for length in study.eval_lens:
            task_obj.check_length("eval_lens entry", length)
        if study.finetune_steps:
            task_obj.check_length("eval_lens entry", max(study.eval_lens))
        worker_threads = threads
        if worker_threads is None and workers > 1:  # the cores shared out, not each taking all
            worker_threads = max(1, default_jobs() // workers)
        context = UnitContext(
            study,
            dist.device,
            None if out is None else out / "checkpoints",
            resume,
            worker_threads,
        )
        # Build and try every model (and check every checkpoint) before anything trains.
        with torch.random.fork_rng(devices=[]):
            for unit in units:
                context.runner(task_obj, dist, unit.seed, None).validate(unit.label, unit.spec)
        runs = run_units(units, context, task=task_obj, dist=dist, jobs=workers, on_event=on_event)
        results = results_record(
            study,
            task_obj,
            runs,
            dist,
            device,
            time.perf_counter() - started,
            jobs=workers,
            threads=worker_threads if workers > 1 else None,
        )
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
