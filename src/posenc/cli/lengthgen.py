"""``posenc lengthgen``: train at one length, evaluate at longer ones, per encoding.

Runs the same under ``torchrun --nproc_per_node=N -m posenc lengthgen ...``
(DistributedDataParallel, gloo on CPU, nccl on CUDA); rank 0 writes the files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import typer

from posenc._errors import PosEncError, check_choice, check_int
from posenc.cli._app import app, fail
from posenc.cli._checks import (
    byte_limit,
    check_out_dir,
    choice,
    integer,
    number,
    option,
    text,
)
from posenc.cli._study_tables import print_comparisons, print_summary

if TYPE_CHECKING:
    from posenc.experiments.settings import StudySettings

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
    from posenc.experiments.options import split_entries

    text("--extend")(value)
    for method in split_entries("--extend", value):
        choice("--extend", tuple(EXTENSIONS))(method)
    return value


def _names(option: str) -> Any:
    """A comma-separated list option: text, with no empty entry (``rope,,alibi``)."""

    def check(value: str | None) -> str | None:
        if value is None:
            return None
        from posenc.experiments.options import split_entries

        text(option)(value)
        split_entries(option, value)
        return value

    return check


def _lengths(text: str, train_len: int | None) -> list[int]:
    """``"64,128"`` or ``"L,2L,4L"`` (multiples of the training length, ``--train-len`` or
    the preset's)."""
    import re

    from posenc.experiments.options import split_entries

    out = []
    for item in split_entries("--eval-lens", text):  # an empty entry is refused
        found = re.fullmatch(r"([0-9]+)|([0-9]*)[lL]", item)
        if found is None:
            raise PosEncError(f"--eval-lens entries must be integers or kL, got {item!r}")
        if found.group(1) is not None:
            out.append(int(found.group(1)))
            continue
        if train_len is None:
            raise PosEncError(f"--eval-lens entry {item!r} needs --train-len (L)")
        out.append(int(found.group(2) or "1") * train_len)
    return [check_int("--eval-lens entry", n, min=1, max=_LEN) for n in out]


def _seeds(value: str | None) -> str | None:
    """``0,1,2``: distinct integers (the study checks them again, with the rest)."""
    if value is None:
        return None
    from posenc.experiments.options import parse_int, split_entries

    text("--seeds")(value)
    items = split_entries("--seeds", value)  # an empty entry is refused, not skipped
    for item in items:
        integer("--seeds entry", min=-(2**63), max=2**63 - 1)(parse_int("--seeds", item))
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


# --- the options, one alias each (the command's signature reads as their list) ---------


def _count(option: str, help: str, low: int = 1, high: int = _COUNT) -> Any:
    """An integer option, checked in ``[low, high]`` when it is parsed (plain digits only:
    ``1_000`` and ``+8``, which ``int()`` takes, are refused)."""
    return _option(help, _int(option, low, high))


def _option(help: str, callback: Any) -> Any:
    """An option checked by ``callback``, with its plain-digits parser where it has one."""
    return option(help, callback)


_Out = Annotated[str, typer.Option("--out", help="Output directory.", callback=text("--out"))]
_Task = Annotated[
    str | None, _option("lm, copy, reverse, recall, addition, counting or flipflop [lm].", _task)
]
_Encodings = Annotated[
    str | None,
    _option(
        "Comma-separated registry names or variants (prope-0.25, prope-0.75, drope), "
        "each optionally NAME@SCHEDULE (nope-every-4, nope-every-2, llama4, local-global).",
        _names("--encodings"),
    ),
]
_Study = Annotated[
    str | None,
    _option(
        "A named study of the literature (counting, flipflop, prope, nope-layers, "
        "drope): its task, encodings and settings, which other options override.",
        _study,
    ),
]
_Scale = Annotated[
    str,
    _option(
        "--study at cpu scale (2 cores, <= 10 min) or paper scale (a GPU run, e.g. "
        "under torchrun).",
        _scale,
    ),
]
_TrainLen = Annotated[int | None, _count("--train-len", "Training length L [preset].", 1, _LEN)]
_EvalLens = Annotated[
    str | None, _option("e.g. 64,128 or L,2L,4L,8L [preset].", text("--eval-lens"))
]
_Steps = Annotated[int | None, _count("--steps", "Training steps per encoding [preset].")]
_Device = Annotated[str, _option("cpu or cuda.", _device)]
_Seed = Annotated[
    int | None,
    _count("--seed", "Seed of initialisation, data and eval sets [0].", -(2**63), 2**63 - 1),
]
_Seeds = Annotated[
    str | None,
    _option("Several seeds, e.g. 0,1,2: every encoding trains once per seed.", _seeds),
]
_Jobs = Annotated[
    int | None,
    _count(
        "--jobs",
        "Worker processes for the (seed, encoding) runs [the CPU cores; 1 under torchrun].",
        1,
        1024,
    ),
]
_Resume = Annotated[bool, typer.Option(help="Continue from the checkpoints in --out.")]
_Preset = Annotated[str, _option("default or quick.", text("--preset"))]
_BatchSize = Annotated[int | None, _count("--batch-size", "Sequences per step [preset].")]
_Dim = Annotated[int | None, _count("--dim", "Model width [preset].", 1, 2**16)]
_Layers = Annotated[int | None, _count("--layers", "Transformer layers [preset].", 1, 1024)]
_Heads = Annotated[int | None, _count("--heads", "Attention heads [preset].", 1, 1024)]
_Lr = Annotated[
    float | None,
    _option("Peak learning rate [preset].", number("--lr", min=0.0, exclusive=True)),
]
_Warmup = Annotated[int | None, _count("--warmup", "Warmup steps [preset].", 0)]
_Optimizer = Annotated[
    str | None,
    _option(
        "adamw, or muon (Muon on the hidden matrices, AdamW on the rest) [preset].", _optimizer
    ),
]
_RandomPositions = Annotated[
    int | None,
    _count("--random-positions", "Train on randomized positions from [0, L_max).", 1, _LEN),
]
_Extend = Annotated[
    str | None, _option("RoPE context extension: pi,ntk,yarn or none [preset].", _extend)
]
_ExtendFactor = Annotated[
    float | None,
    _option(
        "Extension factor [max eval len / train len].",
        number("--extend-factor", min=1.0, max=float(_LEN)),
    ),
]
_FinetuneSteps = Annotated[
    int | None, _count("--finetune-steps", "Fine-tune steps per extension, 0: none [preset].", 0)
]
_CheckpointEvery = Annotated[
    int | None,
    _count("--checkpoint-every", "Checkpoint every N steps, 0: at the end [preset].", 0),
]
_EvalTokens = Annotated[
    int | None, _count("--eval-tokens", "Bytes scored per length (lm).", 1, 10**9)
]
_EvalExamples = Annotated[int | None, _count("--eval-examples", "Examples per length (synthetic).")]
_NumVars = Annotated[
    int | None, _count("--num-vars", "counting: variables in a program, 1-5 [3].", 1, 5)
]
_EvalSplit = Annotated[
    str | None,
    _option(
        "flipflop: the main eval split, sparse, dense or train [sparse]; the others "
        "are reported too.",
        _split,
    ),
]
_QkNorm = Annotated[
    bool, typer.Option("--qk-norm", help="Every layer RMS-normalises queries and keys.")
]
_Temperature = Annotated[
    str | None,
    _option("Every layer's query temperature: llama4 or ssmax [none].", _temperature),
]
_DropeAt = Annotated[
    float | None,
    _option(
        "drope: drop RoPE after this fraction of the steps [0.85].",
        number("--drope-at", min=0.0, max=1.0),
    ),
]
_Threads = Annotated[
    int,
    _count(
        "--threads", "torch intra-op threads per process (1 is fastest for tiny models).", 1, 1024
    ),
]
_Plot = Annotated[
    bool | None,
    typer.Option(
        "--plot/--no-plot",
        help="Write lengthgen.png (default: when matplotlib, the 'plot' extra, is installed).",
    ),
]
_Quiet = Annotated[bool, typer.Option(help="No progress bar or summary table.")]


@app.command()
def lengthgen(
    ctx: typer.Context,
    out: _Out,
    task: _Task = None,
    encodings: _Encodings = None,
    study: _Study = None,
    scale: _Scale = "cpu",
    train_len: _TrainLen = None,
    eval_lens: _EvalLens = None,
    steps: _Steps = None,
    device: _Device = "cpu",
    seed: _Seed = None,
    seeds: _Seeds = None,
    jobs: _Jobs = None,
    resume: _Resume = False,
    preset: _Preset = "default",
    batch_size: _BatchSize = None,
    dim: _Dim = None,
    layers: _Layers = None,
    heads: _Heads = None,
    lr: _Lr = None,
    warmup: _Warmup = None,
    optimizer: _Optimizer = None,
    random_positions: _RandomPositions = None,
    extend: _Extend = None,
    extend_factor: _ExtendFactor = None,
    finetune_steps: _FinetuneSteps = None,
    checkpoint_every: _CheckpointEvery = None,
    eval_tokens: _EvalTokens = None,
    eval_examples: _EvalExamples = None,
    num_vars: _NumVars = None,
    eval_split: _EvalSplit = None,
    qk_norm: _QkNorm = False,
    temperature: _Temperature = None,
    drope_at: _DropeAt = None,
    threads: _Threads = 1,
    plot: _Plot = None,
    quiet: _Quiet = False,
) -> None:
    """Train a small model per encoding at --train-len and evaluate it at --eval-lens.

    Writes OUT/results.json and OUT/lengthgen.png; checkpoints go to OUT/checkpoints.
    """
    # Every option reaches the study by name through ctx.params: its settings are built
    # from them in one place (_study_settings) and run whole.
    show = not quiet and int(os.environ.get("RANK", "0")) == 0  # rank 0 prints
    try:
        settings = _study_settings(ctx.params)
        plot = _plot_choice(plot)
        # the path before anything is made: a folder that cannot be written is exit code 1
        # (an OSError, in main)
        path = check_out_dir(out, create=False)
        results = _run(
            settings,
            progress=show,
            out_dir=path,
            device=device,
            jobs=_jobs(jobs),
            resume=resume,
            threads=threads,
            plot=plot,
            max_bytes=_memory_limit(device),
            study=ctx.params["study"],
        )
    except PosEncError as e:
        fail(str(e))
        return
    if show:
        print_summary(results)
        print_comparisons(results)
        typer.echo(
            f"wrote {path / 'results.json'}" + (f" and {path / 'lengthgen.png'}" if plot else "")
        )


#: The options that are a study's settings under another name.
_SETTING_NAMES = {"layers": "num_layers", "heads": "num_heads"}


def _study_settings(params: Mapping[str, Any]) -> StudySettings:
    """The study the command line asks for, checked once: its options, a ``--study``
    filling what they leave out, the preset the rest (``--eval-lens`` in multiples of
    ``--train-len``, the study's or the preset's)."""
    from posenc.experiments.settings import (
        DEFAULT_ENCODINGS,
        PRESETS,
        STUDY_OPTIONS,
        StudySettings,
    )

    preset = check_choice("--preset", params["preset"], tuple(PRESETS))
    seed, seeds = params["seed"], params["seeds"]
    if seed is not None and seeds is not None:
        raise PosEncError(f"give --seed or --seeds, not both: got {seed} and {seeds!r}")
    given = {_SETTING_NAMES.get(k, k): v for k, v in params.items()}
    options = {k: given.get(k) for k in ("task", "encodings", *STUDY_OPTIONS)}
    extend = options["extend"]
    if extend is not None and extend.strip().lower() == "none":
        options["extend"] = []
    options["qk_norm"] = options["qk_norm"] or None  # a flag: unset is not False
    if params["study"] is not None:
        from posenc.experiments.studies import with_study

        options = with_study(params["study"], params["scale"], options)
    elif params["scale"] != "cpu":
        raise PosEncError("--scale sets the size of a --study; give --study with it")
    if params["eval_lens"] is not None:
        train_len = options["train_len"]
        base = PRESETS[preset]["train_len"] if train_len is None else train_len
        options["eval_lens"] = _lengths(params["eval_lens"], base)
    task, encodings = options.pop("task"), options.pop("encodings")
    task = "lm" if task is None else task
    encodings = DEFAULT_ENCODINGS if encodings is None else encodings
    return StudySettings.from_options(task, encodings, preset=preset, **options)


def _run(settings: StudySettings, *, progress: bool, **run: Any) -> dict[str, Any]:
    """``run_study(settings, **run)``, with progress bars when ``progress``."""
    from posenc.experiments.lengthgen import run_study

    if not progress:
        return run_study(settings, **run)
    from posenc.experiments.progress import StudyProgress

    with StudyProgress() as bars:
        return run_study(settings, **run, on_event=bars)


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
