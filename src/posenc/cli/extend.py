"""``posenc extend MODEL``: a pretrained model past its trained context under each RoPE
scaling, with no fine-tuning.

posenc extend .cache/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf          # L, 1.5L, 2L
posenc extend MODEL_DIR --to 4 --out runs/extend                            # up to 4L
posenc extend MODEL.gguf --quick                                            # a few minutes
posenc extend MODEL.gguf --emit vllm,llama.cpp                              # two engines
posenc extend MODEL.gguf --save extended/ --scaling yarn                    # a loadable copy
posenc extend MODEL_DIR --scalings none,yarn,self-extend,string             # the position maps
posenc extend MODEL.gguf --search 30 --lengths 1.5 --search-length 1.5    # searched factors
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from posenc._errors import PosEncError, check_float
from posenc.cli._app import app, fail
from posenc.cli._checks import check_out_dir, choice, integer, number, option, text
from posenc.extend.settings import ENGINE_NAMES, TASK_NAMES
from posenc.extend.settings import SCALING_NAMES as _SCALINGS

__all__ = ["extend"]


def _number(option_name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise PosEncError(f"{option_name} entries must be numbers, got {text!r}") from None


def _list(option_name: str, kind: type, known: tuple[str, ...] = _SCALINGS) -> Any:
    def check(value: Any) -> Any:
        if value is None:
            return None
        parts = [p.strip() for p in str(value).split(",")]
        if any(not p for p in parts):
            raise PosEncError(
                f"{option_name} must be a comma-separated list with no empty entry, got {value!r}"
            )
        if kind is float:
            return [check_float(option_name, _number(option_name, p), min=1.0) for p in parts]
        for p in parts:
            if p not in known:
                raise PosEncError(
                    f"{option_name} entries must be among {', '.join(known)}, got {p!r}"
                )
        return parts

    return check


def _int_option(option_name: str, help: str, min: int, max: int) -> Any:
    """An integer option from ``min`` to ``max``."""
    return option(help, integer(option_name, min=min, max=max))


def _float_option(option_name: str, help: str, **bounds: Any) -> Any:
    """A number option within ``bounds`` (:func:`posenc.cli._checks.number`'s)."""
    return option(help, number(option_name, **bounds))


def _names_option(option_name: str, help: str, known: tuple[str, ...], note: str = "") -> Any:
    """A comma-separated list of names among ``known``, which its help lists (then ``note``)."""
    return option(f"{help} [{','.join(known)}{note}].", _list(option_name, str, known))


Model = Annotated[
    str, typer.Argument(help="A transformers model folder or a .gguf file.", callback=text("MODEL"))
]
Out = Annotated[str, option("Output folder.", text("--out"), "--out", "-o")]
To = Annotated[
    float | None,
    _float_option(
        "--to",
        "The longest length, as a multiple of the trained context L [2; --quick 1.5].",
        min=1.0,
        max=64.0,
    ),
]
Lengths = Annotated[
    str | None,
    option(
        "The lengths measured, multiples of L, e.g. 1,1.5,2 [L up to --to].",
        _list("--lengths", float),
    ),
]
Scalings = Annotated[
    str | None,
    _names_option("--scalings", "Scalings and position maps, e.g. none,yarn,string", _SCALINGS),
]
Texts = Annotated[
    list[str] | None,
    option("Documents for perplexity [the longest stdlib sources].", text("--text"), "--text"),
]
Documents = Annotated[
    int | None, _int_option("--documents", "How many stdlib documents [3; --quick 1].", 1, 100)
]
Trials = Annotated[
    int | None,
    _int_option(
        "--trials",
        "Haystacks per scaling and length, each prefilled once with needles of every task [2; --quick 1; 0: no probe].",
        0,
        100,
    ),
]
Tasks = Annotated[
    str | None, _names_option("--tasks", "Probe tasks, e.g. passkey,vartrack", TASK_NAMES)
]
Bar = Annotated[
    float,
    _float_option(
        "--bar",
        "A scaling holds a task where it keeps this fraction of the model's unscaled score at the shortest length.",
        min=0.0,
        max=1.0,
        exclusive=True,
    ),
]
PplTolerance = Annotated[
    float,
    _float_option(
        "--ppl-tolerance",
        "A scaling holds where its perplexity is at most (1 + this) x none's at L.",
        min=0.0,
        max=100.0,
    ),
]
Emit = Annotated[
    str | None,
    _names_option(
        "--emit",
        "Engines to write the chosen setting for",
        ENGINE_NAMES,
        "; gguf and ollama only for a .gguf model",
    ),
]
Seed = Annotated[int, _int_option("--seed", "Seed of the probes' needles.", 0, 2**31 - 1)]
Dtype = Annotated[
    str,
    option(
        "float32, bfloat16, float16 or float64.",
        choice("--dtype", ("float32", "bfloat16", "float16", "float64")),
    ),
]
Device = Annotated[
    str, option("cpu, cuda, cuda:N, or auto (device_map='auto': several GPUs).", text("--device"))
]
Context = Annotated[
    int | None,
    option(
        "The trained context L [the config's max_position_embeddings].",
        integer("--context", min=16),
    ),
]
Quick = Annotated[
    bool,
    typer.Option(
        "--quick",
        help="One document, one haystack asking the passkey; none at L, and none, self-extend, string at 1.25L: five minutes for SmolLM2-135M on 2 cores.",
    ),
]
Resume = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="Keep the units already measured in --out with the same settings and model.",
    ),
]
Save = Annotated[
    str | None,
    option(
        "Write the model with the chosen scaling into this folder (loads with from_pretrained, no posenc).",
        text("--save"),
    ),
]
Scaling = Annotated[
    str | None,
    option(
        "The scaling --emit and --save write, set for the longest length [the answer's choice].",
        choice("--scaling", _SCALINGS),
    ),
]
Search = Annotated[
    float | None,
    _float_option(
        "--search",
        "Search per-band LongRoPE factors for this many minutes, measured as the unit 'search'.",
        min=0.0,
        max=7 * 24 * 60.0,
        exclusive=True,
    ),
]
SearchLength = Annotated[
    float | None,
    _float_option(
        "--search-length",
        "The search's scoring length, one of --lengths above 1 [--to].",
        min=1.0,
        max=64.0,
        exclusive=True,
    ),
]
SearchPopulation = Annotated[
    int | None,
    _int_option("--search-population", "Candidates per generation of the search [8].", 4, 256),
]


@app.command("extend")
def extend(
    model: Model,
    out: Out = "extend",
    to: To = None,
    lengths: Lengths = None,
    scalings: Scalings = None,
    texts: Texts = None,
    documents: Documents = None,
    trials: Trials = None,
    tasks: Tasks = None,
    bar: Bar = 0.9,
    ppl_tolerance: PplTolerance = 0.1,
    emit: Emit = None,
    seed: Seed = 0,
    dtype: Dtype = "float32",
    device: Device = "cpu",
    context: Context = None,
    quick: Quick = False,
    resume: Resume = False,
    save: Save = None,
    scaling: Scaling = None,
    search: Search = None,
    search_length: SearchLength = None,
    search_population: SearchPopulation = None,
) -> None:
    """Measure MODEL past its trained context under each RoPE scaling: perplexity by
    position, RULER-style probes (passkey, multi-key and multi-value needles, variable
    tracking), the effective length of each scaling, and the cost; write the chosen
    setting for each engine (OUT/emit/), OUT/results.json, figures and OUT/index.html,
    which leads with the answer.

    Exit codes: 0 written, 2 a bad option or a model that cannot be measured, 1 the
    environment refused (a folder that cannot be written, out of memory)."""
    from posenc.extend.run import run_extend
    from posenc.extend.settings import ExtendSettings

    try:
        settings = ExtendSettings.from_options(
            model,
            to=to,
            multiples=lengths,
            scalings=scalings,
            texts=texts or None,
            documents=documents,
            trials=trials,
            tasks=tasks,
            bar=bar,
            ppl_tolerance=ppl_tolerance,
            emit=emit,
            scaling=scaling,
            seed=seed,
            dtype=dtype,
            device=device,
            context=context,
            quick=quick,
            search=search,
            search_length=search_length,
            search_population=search_population,
        )
        path = check_out_dir(out)
        if settings.emit:
            from posenc.extend.emit import check_emit

            # before anything runs: the engines always, the scaling where it is named (the
            # answer's choice, like ``config``, is known only after the run)
            scaling_named = settings.scaling or "config"
            check_emit(settings.emit, scaling_named, settings.model.endswith(".gguf"))
        if save and settings.scaling:
            from posenc.extend.save import check_savable

            check_savable(settings.scaling)  # a position map: no config says it
    except PosEncError as e:
        fail(str(e))
        return
    with _progress() as on_event:
        results = run_extend(settings, out_dir=path, resume=resume, on_event=on_event)
    typer.echo(results["answer"]["lead"])
    for engine, item in results.get("emit", {}).items():
        files = ", ".join(str(path / f) for f in item.get("files", ()))
        typer.echo(f"{engine}: {item.get('command') or item.get('refused') or files}")
        for warning in item.get("warnings", ()):
            typer.echo(f"  warning: {warning}")
    if save:
        _save(settings, results, save)
    typer.echo(
        f"wrote {path / 'index.html'}, {path / 'results.json'}, the figures and {path / 'emit'}"
    )


def _save(settings: Any, results: dict[str, Any], save: str) -> None:
    from posenc.extend.model import load_model
    from posenc.extend.run import chosen
    from posenc.extend.save import check_savable, save_extended

    choice = chosen(settings, results)
    if choice is None:
        fail("--save: no measured setting holds the bar; pass --scaling to save one anyway")
        return
    name, factor, target = choice
    if name == "search":  # written by the run itself, read back and checked
        fail(
            "--save: the answer chose the searched factors, written as search/config.json "
            "(and a GGUF copy for a .gguf model) in the output folder; pass --scaling to save "
            "a named scaling"
        )
        return
    try:
        check_savable(name)  # the answer chose a position map
    except PosEncError as e:
        fail(str(e))
        return
    loaded = load_model(
        settings.model, dtype=settings.dtype, device=settings.device, context=settings.context
    )
    where = save_extended(loaded, name, factor, target, Path(save))
    typer.echo(f"saved {name} (factor {factor:g}) for {target} tokens in {where}")


def _ppl(nll: float | None) -> str:
    if nll is None:
        return "not finite"
    return f"{math.exp(nll):.4g}" if nll < 700 else f"e^{nll:.0f}"


def _search_line(info: dict[str, Any]) -> str:
    """A ``search`` event in words: ``search: candidate 5 of ~40 (mutation), ppl 12.34,
    best 11.9 (yarn), 3.2 of 10 min``; the count to come is the budget over the mean
    seconds of a candidate so far (at most the cap on evaluations)."""
    done, seconds, budget = info["done"], info["seconds"], info["budget"]
    about = ""
    if seconds > 0:
        count = max(done, math.floor(budget * done / seconds))
        if info.get("evaluations") is not None:
            count = min(count, info["evaluations"])
        about = f" of ~{count}"
    best = info["best"]
    found = _ppl(best["nll"]) + ("" if best["nll"] is None else f" ({best['origin']})")
    return (
        f"search: candidate {done}{about} ({info['origin']}), ppl {_ppl(info['nll'])}, "
        f"best {found}, {seconds / 60:.1f} of {budget / 60:g} min"
    )


@contextlib.contextmanager
def _progress(console: Any = None) -> Iterator[Any]:
    """One rich bar per unit on stderr (none where stderr is not a terminal), and a line
    per candidate the factor search scores (:func:`_search_line`, always)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console(stderr=True)
    with Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
    ) as bar:
        tasks: dict[str, Any] = {}
        current: list[Any] = [None]

        def on_event(kind: str, info: dict[str, Any]) -> None:
            if kind == "loaded" and info.get("note"):
                typer.echo(f"note: {info['note']}")  # a hybrid model: what is scaled
            elif kind == "unit":
                label = f"{info['index'] + 1}/{info['total']} {info['scaling']} x{info['factor']:g} @{info['length']}"
                current[0] = tasks[label] = bar.add_task(label, total=None)
            elif kind == "step" and current[0] is not None:
                bar.update(current[0], completed=info["done"], total=info["total"])
            elif kind == "search":  # above the bars on a terminal, a plain line elsewhere
                console.print(_search_line(info), markup=False, highlight=False, soft_wrap=True)
            elif kind == "done" and current[0] is not None:
                # full whether it ran, took another unit's numbers or was resumed (no steps)
                bar.update(current[0], completed=1, total=1)

        yield on_event
