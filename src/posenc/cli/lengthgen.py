"""``posenc lengthgen``: train at one length, evaluate at longer ones, per encoding.

Runs the same under ``torchrun --nproc_per_node=N -m posenc lengthgen ...``
(DistributedDataParallel, gloo on CPU, nccl on CUDA); rank 0 writes the files.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from posenc._errors import PosEncError, check_choice, check_int
from posenc.cli import app, fail
from posenc.cli._checks import byte_limit, check_out_dir, choice, integer, number, text

_DEFAULT_ENCODINGS = "none,sinusoidal,learned,rope,alibi,t5"
_COUNT = 10**7  # steps, examples: as experiments.settings.MAX_COUNT (not imported: slow)
_LEN = 2**20  # lengths: as experiments.settings.MAX_LENGTH


def _int(option: str, low: int, high: int) -> Any:
    """An integer option's parse-time check: in ``[low, high]``."""
    return integer(option, min=low, max=high)


def _memory_limit(device: str) -> int:
    """What one process of the study may use: a CUDA device's memory, or half the host's
    free memory (a study is the one command meant to use a lot)."""
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(0).total_memory)
    return byte_limit(cap=None)


def _task(value: str | None) -> str | None:
    from posenc.experiments.tasks import TASKS  # here: `posenc table` need not import it

    return None if value is None else str(choice("--task", tuple(TASKS))(value))


def _study(value: str | None) -> str | None:
    from posenc.experiments.studies import STUDIES

    return None if value is None else str(choice("--study", tuple(STUDIES))(value))


def _scale(value: str) -> str:
    from posenc.experiments.studies import SCALES

    return str(choice("--scale", SCALES)(value))


def _optimizer(value: str | None) -> str | None:
    from posenc.experiments.optim import OPTIMIZERS

    return None if value is None else str(choice("--optimizer", OPTIMIZERS)(value))


def _split(value: str | None) -> str | None:
    from posenc.experiments.tasks import FLIPFLOP_SPLITS

    return None if value is None else str(choice("--eval-split", tuple(FLIPFLOP_SPLITS))(value))


def _temperature(value: str | None) -> str | None:
    from posenc.models.layers import TEMPERATURES

    return None if value is None else str(choice("--temperature", tuple(TEMPERATURES))(value))


def _device(value: str) -> str:
    from posenc.experiments.distributed import DEVICES

    return str(choice("--device", tuple(DEVICES))(value))


def _extend(value: str | None) -> str | None:
    """``pi,ntk,yarn`` (any of them) or ``none``."""
    if value is None or value.strip().lower() == "none":
        return value
    from posenc.experiments.extension import EXTENSIONS

    text("--extend")(value)
    for method in value.split(","):
        choice("--extend", (*EXTENSIONS, "none"))(method.strip())
    return value


def _lengths(text: str, train_len: int | None) -> list[int]:
    """``"64,128"`` or ``"L,2L,4L"`` (multiples of the training length, ``--train-len`` or
    the preset's)."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if item.upper().endswith("L"):
            if train_len is None:
                raise PosEncError(f"--eval-lens entry {item!r} needs --train-len (L)")
            factor = item[:-1] or "1"
            if not factor.isdigit():
                raise PosEncError(f"--eval-lens entries must be integers or kL, got {item!r}")
            out.append(int(factor) * train_len)
        else:
            try:
                out.append(int(item))
            except ValueError:
                raise PosEncError(
                    f"--eval-lens entries must be integers or kL, got {item!r}"
                ) from None
    if not out:
        raise PosEncError(f"--eval-lens must list at least one length, got {text!r}")
    return [check_int("--eval-lens entry", n, min=1) for n in out]


def _seeds(value: str | None) -> str | None:
    """``0,1,2``: distinct integers (the study checks them again, with the rest)."""
    if value is None:
        return None
    text("--seeds")(value)
    items = [t.strip() for t in value.split(",") if t.strip()]
    for item in items:
        try:
            integer("--seeds entry", min=-(2**63), max=2**63 - 1)(int(item))
        except ValueError as e:
            if isinstance(e, PosEncError):
                raise
            raise PosEncError(f"--seeds entries must be integers, got {item!r}") from None
    if not items:
        raise PosEncError(f"--seeds must list at least one seed, got {value!r}")
    if len({int(i) for i in items}) != len(items):
        raise PosEncError(f"--seeds must be distinct, got {value!r}")
    return value


def _jobs(jobs: int | None) -> int:
    """``--jobs`` as given; unset: the cores this process may use (1 under torchrun)."""
    if jobs is not None:
        return jobs
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return 1
    from posenc.experiments.lengthgen import default_jobs

    return default_jobs()


def _value(value: float, metric: str) -> str:
    return f"{value:.3g}" if metric == "ppl" else f"{value:.2f}"


def _summary(results: dict) -> None:
    """One row per encoding: the mean over the seeds, with min-max when there are several."""
    from rich.console import Console
    from rich.table import Table

    metric, seeds = results["metric"], results.get("seeds", [0])
    over = f", mean (min-max) over seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else ""
    table = Table(
        title=f"{results['task']}: {metric} at each eval length "
        f"(trained at {results['train_len']}{over})"
    )
    table.add_column("encoding")
    for length in results["eval_lens"]:
        table.add_column(str(length), justify="right")
    table.add_column("train s", justify="right")
    seconds: dict[str, float] = {}
    for run in results["runs"]:
        seconds[run["encoding"]] = seconds.get(run["encoding"], 0.0) + run["train"]["seconds"]
    for label, cells in results["summary"].items():
        row = []
        for length in results["eval_lens"]:
            cell = cells[str(length)]
            stats = cell.get(metric)
            if "error" in cell:
                row.append("error")
            elif stats is None:
                row.append("-")
            elif len(seeds) > 1:
                row.append(
                    f"{_value(stats['mean'], metric)} "
                    f"({_value(stats['min'], metric)}-{_value(stats['max'], metric)})"
                )
            else:
                row.append(_value(stats["mean"], metric))
        table.add_row(label, *row, f"{seconds.get(label, 0.0):.1f}")
    Console().print(table)


@app.command()
def lengthgen(
    out: Annotated[str, typer.Option("--out", help="Output directory.", callback=text("--out"))],
    task: Annotated[
        str | None,
        typer.Option(
            help="lm, copy, reverse, recall, addition, counting or flipflop [lm].",
            callback=_task,
        ),
    ] = None,
    encodings: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated registry names or variants (prope-0.25, prope-0.75, drope), "
            "each optionally NAME@SCHEDULE (nope-every-4, nope-every-2, llama4, local-global).",
            callback=text("--encodings"),
        ),
    ] = None,
    study: Annotated[
        str | None,
        typer.Option(
            help="A named study of the literature (counting, flipflop, prope, nope-layers, "
            "drope): its task, encodings and settings, which other options override.",
            callback=_study,
        ),
    ] = None,
    scale: Annotated[
        str,
        typer.Option(
            help="--study at cpu scale (2 cores, <= 10 min) or paper scale (a GPU run, e.g. "
            "under torchrun).",
            callback=_scale,
        ),
    ] = "cpu",
    train_len: Annotated[
        int | None,
        typer.Option(help="Training length L [preset].", callback=_int("--train-len", 1, _LEN)),
    ] = None,
    eval_lens: Annotated[
        str | None,
        typer.Option(help="e.g. 64,128 or L,2L,4L,8L [preset].", callback=text("--eval-lens")),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option(
            help="Training steps per encoding [preset].", callback=_int("--steps", 1, _COUNT)
        ),
    ] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda.", callback=_device)] = "cpu",
    seed: Annotated[
        int | None,
        typer.Option(
            help="Seed of initialisation, data and eval sets [0].",
            callback=_int("--seed", -(2**63), 2**63 - 1),
        ),
    ] = None,
    seeds: Annotated[
        str | None,
        typer.Option(
            help="Several seeds, e.g. 0,1,2: every encoding trains once per seed.",
            callback=_seeds,
        ),
    ] = None,
    jobs: Annotated[
        int | None,
        typer.Option(
            help="Worker processes for the (seed, encoding) runs [the CPU cores; 1 under torchrun].",
            callback=_int("--jobs", 1, 1024),
        ),
    ] = None,
    resume: Annotated[bool, typer.Option(help="Continue from the checkpoints in --out.")] = False,
    preset: Annotated[str, typer.Option(help="default or quick.", callback=text("--preset"))] = (
        "default"
    ),
    batch_size: Annotated[
        int | None,
        typer.Option(help="Sequences per step [preset].", callback=_int("--batch-size", 1, _COUNT)),
    ] = None,
    dim: Annotated[
        int | None, typer.Option(help="Model width [preset].", callback=_int("--dim", 1, 2**16))
    ] = None,
    layers: Annotated[
        int | None,
        typer.Option(help="Transformer layers [preset].", callback=_int("--layers", 1, 1024)),
    ] = None,
    heads: Annotated[
        int | None,
        typer.Option(help="Attention heads [preset].", callback=_int("--heads", 1, 1024)),
    ] = None,
    lr: Annotated[
        float | None,
        typer.Option(
            help="Peak learning rate [preset].", callback=number("--lr", min=0.0, exclusive=True)
        ),
    ] = None,
    warmup: Annotated[
        int | None,
        typer.Option(help="Warmup steps [preset].", callback=_int("--warmup", 0, _COUNT)),
    ] = None,
    optimizer: Annotated[
        str | None,
        typer.Option(
            help="adamw, or muon (Muon on the hidden matrices, AdamW on the rest) [preset].",
            callback=_optimizer,
        ),
    ] = None,
    random_positions: Annotated[
        int | None,
        typer.Option(
            help="Train on randomized positions from [0, L_max).",
            callback=_int("--random-positions", 1, _LEN),
        ),
    ] = None,
    extend: Annotated[
        str | None,
        typer.Option(
            help="RoPE context extension: pi,ntk,yarn or none [preset].", callback=_extend
        ),
    ] = None,
    extend_factor: Annotated[
        float | None,
        typer.Option(
            help="Extension factor [max eval len / train len].",
            callback=number("--extend-factor", min=1.0, max=float(_LEN)),
        ),
    ] = None,
    finetune_steps: Annotated[
        int | None,
        typer.Option(
            help="Fine-tune steps per extension, 0: none [preset].",
            callback=_int("--finetune-steps", 0, _COUNT),
        ),
    ] = None,
    checkpoint_every: Annotated[
        int | None,
        typer.Option(
            help="Checkpoint every N steps, 0: at the end [preset].",
            callback=_int("--checkpoint-every", 0, _COUNT),
        ),
    ] = None,
    eval_tokens: Annotated[
        int | None,
        typer.Option(
            help="Bytes scored per length (lm).", callback=_int("--eval-tokens", 1, 10**9)
        ),
    ] = None,
    eval_examples: Annotated[
        int | None,
        typer.Option(
            help="Examples per length (synthetic).", callback=_int("--eval-examples", 1, _COUNT)
        ),
    ] = None,
    num_vars: Annotated[
        int | None,
        typer.Option(
            help="counting: variables in a program, 1-5 [3].", callback=_int("--num-vars", 1, 5)
        ),
    ] = None,
    eval_split: Annotated[
        str | None,
        typer.Option(
            help="flipflop: the main eval split, sparse, dense or train [sparse]; the others "
            "are reported too.",
            callback=_split,
        ),
    ] = None,
    qk_norm: Annotated[
        bool, typer.Option("--qk-norm", help="Every layer RMS-normalises queries and keys.")
    ] = False,
    temperature: Annotated[
        str | None,
        typer.Option(
            help="Every layer's query temperature: llama4 or ssmax [none].",
            callback=_temperature,
        ),
    ] = None,
    drope_at: Annotated[
        float | None,
        typer.Option(
            help="drope: drop RoPE after this fraction of the steps [0.85].",
            callback=number("--drope-at", min=0.0, max=1.0),
        ),
    ] = None,
    threads: Annotated[
        int,
        typer.Option(
            help="torch intra-op threads per process (1 is fastest for tiny models).",
            callback=_int("--threads", 1, 1024),
        ),
    ] = 1,
    plot: Annotated[
        bool | None,
        typer.Option(
            "--plot/--no-plot",
            help="Write lengthgen.png (default: when matplotlib, the 'plot' extra, is installed).",
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bar or summary table.")] = False,
) -> None:
    """Train a small model per encoding at --train-len and evaluate it at --eval-lens.

    Writes OUT/results.json and OUT/lengthgen.png; checkpoints go to OUT/checkpoints.
    """
    from posenc.experiments.lengthgen import run_study

    main_rank = int(os.environ.get("RANK", "0")) == 0
    try:
        from posenc.experiments.settings import PRESETS

        check_choice("--preset", preset, tuple(PRESETS))
        if seed is not None and seeds is not None:
            raise PosEncError(f"give --seed or --seeds, not both: got {seed} and {seeds!r}")
        base_len = train_len if train_len is not None else PRESETS[preset]["train_len"]
        lens = None if eval_lens is None else _lengths(eval_lens, base_len)
        methods = None if extend is None else [] if extend.strip().lower() == "none" else extend
        plot = _plot_choice(plot)
        # the path first: a folder that cannot be written is exit code 1 (OSError, in main)
        path = check_out_dir(out, create=False)
        options: dict[str, Any] = dict(
            train_len=train_len,
            eval_lens=lens,
            steps=steps,
            out_dir=path,
            device=device,
            seed=seed,
            seeds=seeds,
            jobs=_jobs(jobs),
            preset=preset,
            batch_size=batch_size,
            dim=dim,
            num_layers=layers,
            num_heads=heads,
            lr=lr,
            warmup=warmup,
            optimizer=optimizer,
            random_positions=random_positions,
            extend=methods,
            extend_factor=extend_factor,
            finetune_steps=finetune_steps,
            checkpoint_every=checkpoint_every,
            eval_tokens=eval_tokens,
            eval_examples=eval_examples,
            resume=resume,
            plot=plot,
            threads=threads,
            max_bytes=_memory_limit(device),
            num_vars=num_vars,
            eval_split=eval_split,
            qk_norm=qk_norm or None,
            temperature=temperature,
            drope_at=drope_at,
        )
        if study is not None:
            from posenc.experiments.studies import study_arguments

            named = study_arguments(study, scale)
            task = task if task is not None else named.pop("task")
            encodings = encodings if encodings is not None else ",".join(named.pop("encodings"))
            if seed is not None:  # one seed asked for: the study's seeds give way
                named.pop("seeds", None)
            for key, value in named.items():
                if key in options and options[key] is None:
                    options[key] = value
        elif scale != "cpu":
            raise PosEncError("--scale sets the size of a --study; give --study with it")
        task = "lm" if task is None else task
        encodings = _DEFAULT_ENCODINGS if encodings is None else encodings
        if quiet or not main_rank:
            results = run_study(task, encodings, **options)
        else:
            from posenc.experiments.progress import StudyProgress

            with StudyProgress() as progress:
                results = run_study(task, encodings, **options, on_event=progress)
    except PosEncError as e:
        fail(str(e))
        return
    if main_rank and not quiet:
        _summary(results)
        typer.echo(
            f"wrote {path / 'results.json'}" + (f" and {path / 'lengthgen.png'}" if plot else "")
        )


def _plot_choice(plot: bool | None) -> bool:
    """``--plot`` / ``--no-plot`` as given; unset: plot when matplotlib is installed (a plain
    ``pip install posenc`` trains and writes results.json without it). ``--plot`` without
    matplotlib is refused before anything trains (an ImportError: one line, exit code 2)."""
    import importlib.util

    have = importlib.util.find_spec("matplotlib") is not None
    if plot is None:
        return have
    if plot and not have:
        raise ImportError("--plot needs matplotlib: pip install 'posenc[plot]', or pass --no-plot")
    return plot
