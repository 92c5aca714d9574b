"""The settings of a length-generalization study: presets, defaults and validation.

Everything a study is told is checked here, before anything trains, so that a bad
setting fails in one line instead of minutes into a run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from posenc._errors import PosEncError, check_bool, check_choice, check_float, check_int
from posenc.experiments.extension import EXTENSIONS
from posenc.experiments.models import ModelSettings, check_distinct, encoding_label, encoding_spec
from posenc.experiments.optim import OPTIMIZERS
from posenc.experiments.tasks import TASKS, Task, make_task
from posenc.experiments.train import TrainSettings
from posenc.models.layers import check_layer

__all__ = [
    "DEFAULT_ENCODINGS",
    "MAX_COUNT",
    "MAX_LENGTH",
    "MAX_SEEDS",
    "PRESETS",
    "Study",
    "make_study_task",
    "resolve",
    "study_bytes",
]

#: Bounds on what a study loops over (steps, examples) and on its lengths: far beyond any
#: study a tiny model is for, and a refusal instead of a run that never ends.
MAX_COUNT = 10**7
MAX_LENGTH = 2**20
_MAX_EVAL_TOKENS = 10**9
MAX_SEEDS = 1000  # seeds of one study: each trains every encoding once more
_VOCAB = 256  # the largest vocabulary of the built-in tasks (bytes)

DEFAULT_ENCODINGS = ("none", "sinusoidal", "learned", "rope", "alibi", "t5")

#: Settings of a study unless given explicitly. "default" is the documented lm study (6
#: encodings trained until their perplexity at L is below about 9 per byte, and 6 RoPE
#: extensions: about 5 CPU-minutes a seed); "quick" is a small study for a first look
#: (about 10 CPU-seconds for the 6 default encodings).
PRESETS: dict[str, dict[str, Any]] = {
    "default": {
        "train_len": 64,
        "eval_lens": (64, 128, 256, 512),
        "steps": 1100,
        "batch_size": 32,
        "dim": 64,
        "num_layers": 2,
        "num_heads": 4,
        "lr": 1e-2,
        "optimizer": "adamw",
        "eval_tokens": 32768,
        "eval_examples": 256,
        "extend": ("pi", "ntk", "yarn"),
        "finetune_steps": 40,
        "checkpoint_every": 100,
    },
    "quick": {
        "train_len": 32,
        "eval_lens": (32, 64, 128),
        "steps": 150,
        "batch_size": 16,
        "dim": 32,
        "num_layers": 1,
        "num_heads": 2,
        "lr": 1e-2,
        "optimizer": "adamw",
        "eval_tokens": 4096,
        "eval_examples": 64,
        "extend": (),
        "finetune_steps": 0,
        "checkpoint_every": 0,
    },
}


@dataclasses.dataclass(frozen=True)
class Study:
    """A study's validated settings."""

    task: str
    labels: tuple[str, ...]
    specs: tuple[dict[str, Any], ...]
    train_len: int
    eval_lens: tuple[int, ...]
    model: ModelSettings
    train: TrainSettings
    extend: tuple[str, ...]
    extend_factor: float
    finetune_steps: int
    eval_tokens: int
    eval_examples: int
    #: every seed the study trains each encoding with; ``train.seed`` is the first.
    seeds: tuple[int, ...] = (0,)
    #: the task's own options (``counting``'s ``num_vars``, ``flipflop``'s ``eval_split``).
    task_options: tuple[tuple[str, Any], ...] = ()
    #: settings every layer of every model gets (``qk_norm``, ``temperature``).
    layer: tuple[tuple[str, Any], ...] = ()


def _pick(name: str, given: Any, preset: Mapping[str, Any]) -> Any:
    return preset.get(name) if given is None else given


def _int_list(name: str, values: Any) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise PosEncError(f"{name} must be a list of integers, got {values!r}")
    out = tuple(check_int(f"{name} entry", v, min=1, max=MAX_LENGTH) for v in values)
    if not out:
        raise PosEncError(f"{name} must hold at least one length, got {list(values)!r}")
    return out


_SEED_RANGE = {"min": -(2**63), "max": 2**63 - 1}


def _seeds(seed: Any, seeds: Any) -> tuple[int, ...]:
    """The study's seeds from ``seed`` (one) or ``seeds`` (a list or ``"0,1,2"``)."""
    if seeds is None:
        return (check_int("seed", 0 if seed is None else seed, **_SEED_RANGE),)
    if seed is not None:
        raise PosEncError(f"give seed or seeds, not both: got seed={seed!r} and seeds={seeds!r}")
    if isinstance(seeds, str):
        items: list[Any] = [t.strip() for t in seeds.split(",") if t.strip()]
        for i, t in enumerate(items):
            try:
                items[i] = int(t)
            except ValueError:
                raise PosEncError(f"seeds entries must be integers, got {t!r}") from None
    elif isinstance(seeds, bytes) or not hasattr(seeds, "__iter__"):
        raise PosEncError(f"seeds must be a list of integers, got {seeds!r}")
    else:
        items = list(seeds)
    out = tuple(check_int("seeds entry", v, **_SEED_RANGE) for v in items)
    if not out:
        raise PosEncError(f"seeds must hold at least one seed, got {seeds!r}")
    if len(out) > MAX_SEEDS:
        raise PosEncError(f"seeds must hold at most {MAX_SEEDS} seeds, got {len(out)}")
    repeated = sorted({v for v in out if out.count(v) > 1})
    if repeated:
        raise PosEncError(f"seeds must be distinct, got {list(out)} (repeated: {repeated})")
    return out


def make_study_task(study: Study) -> Task:
    """The study's task, with its eval sizes and its own options."""
    return make_task(
        study.task,
        eval_tokens=study.eval_tokens,
        eval_examples=study.eval_examples,
        **dict(study.task_options),
    )


def _layer_settings(qk_norm: Any, temperature: Any) -> tuple[tuple[str, Any], ...]:
    """``--qk-norm`` / ``--temperature`` as the settings every layer gets (checked)."""
    layer: dict[str, Any] = {}
    if qk_norm is not None and check_bool("qk_norm", qk_norm):
        layer["qk_norm"] = True
    if temperature is not None:
        if isinstance(temperature, str):
            temperature = {"type": temperature}
        layer["temperature"] = temperature
    checked = check_layer(0, layer)  # the one rule for a layer's settings
    return tuple((k, checked[k]) for k in layer)


def resolve(task: str, encodings: Any, options: dict[str, Any], world_size: int) -> Study:
    """Validate a study's settings; ``options`` left as None come from the preset named
    by ``options["preset"]``. ``options["seed"]`` (one seed) and ``options["seeds"]``
    (several) exclude each other; neither means seed 0. ``num_vars`` / ``eval_split``
    (the task's options), ``qk_norm`` / ``temperature`` (every layer's) and ``drope_at``
    (the ``drope`` variant's fraction of the steps) have no preset value."""
    check_choice("task", task, tuple(TASKS))
    seeds = _seeds(options.pop("seed", None), options.pop("seeds", None))
    task_options = {
        k: v for k in ("num_vars", "eval_split") if (v := options.pop(k, None)) is not None
    }
    make_task(task, **task_options)  # refuses an option of another task, or a bad value
    layer = _layer_settings(options.pop("qk_norm", None), options.pop("temperature", None))
    drope_at = options.pop("drope_at", None)
    if drope_at is not None:
        drope_at = check_float("drope_at", drope_at, min=0.0, max=1.0)
    preset = PRESETS[check_choice("preset", options.pop("preset"), tuple(PRESETS))]
    o = {k: _pick(k, v, preset) for k, v in options.items()}
    if isinstance(encodings, str):
        encodings = [e for e in encodings.split(",") if e.strip()]
    encodings = list(encodings)
    if not encodings:
        raise PosEncError("encodings must name at least one encoding, got none")
    labels = tuple(encoding_label(e) for e in encodings)
    check_distinct(labels)
    steps = check_int("steps", o["steps"], min=1, max=MAX_COUNT)
    train_len = check_int("train_len", o["train_len"], min=1, max=MAX_LENGTH)
    eval_lens = _int_list("eval_lens", o["eval_lens"])
    random_positions = o["random_positions"]
    if random_positions is not None:
        random_positions = check_int(
            "random_positions", random_positions, min=train_len, max=MAX_LENGTH
        )
    batch_size = check_int("batch_size", o["batch_size"], min=1, max=MAX_COUNT)
    if batch_size % world_size:
        raise PosEncError(
            f"batch_size must be divisible by the number of processes ({world_size}), "
            f"got {batch_size}"
        )
    # Explicit choices win over the preset's: the preset's RoPE extension is dropped when
    # the study has no RoPE model or nothing past train_len to extend to, and its fine-tune
    # with it; only a conflict the caller wrote (extend or finetune_steps given) is an error.
    extend_given, finetune_given = (
        options.get("extend") is not None,
        options.get("finetune_steps") is not None,
    )
    extend = tuple(o["extend"].split(",") if isinstance(o["extend"], str) else o["extend"])
    extend = tuple(check_choice("extend", m, tuple(EXTENSIONS)) for m in extend if m)
    factor = o["extend_factor"]
    if factor is None:
        factor = max(eval_lens) / train_len
    factor = check_float("extend_factor", factor, min=1.0, max=float(MAX_LENGTH))
    if extend and not extend_given and ("rope" not in labels or factor <= 1.0):
        extend = ()
    if extend and "rope" not in labels:
        raise PosEncError(f"extend needs 'rope' among the encodings, got {', '.join(labels)}")
    if extend and factor <= 1.0:
        raise PosEncError(
            f"extend needs an eval length beyond train_len ({train_len}) or an extend_factor "
            f"> 1, got eval_lens {list(eval_lens)}"
        )
    warmup = steps // 10
    if o["warmup"] is not None:
        warmup = min(check_int("warmup", o["warmup"], min=0, max=MAX_COUNT), steps)
    finetune_steps = check_int("finetune_steps", o["finetune_steps"], min=0, max=MAX_COUNT)
    if finetune_steps and not extend:
        if finetune_given:
            raise PosEncError(
                "finetune_steps needs extend (pi, ntk or yarn), got no extend methods"
            )
        finetune_steps = 0  # the preset's fine-tune belongs to the extension just dropped
    specs = tuple(encoding_spec(e, train_len=train_len) for e in encodings)
    if drope_at is not None:
        if not any("drope_at" in spec for spec in specs):
            raise PosEncError(
                f"drope_at sets the 'drope' variant's drop, got no 'drope' among the "
                f"encodings ({', '.join(labels)})"
            )
        specs = tuple({**sp, "drope_at": drope_at} if "drope_at" in sp else sp for sp in specs)
    num_layers = check_int("num_layers", o["num_layers"], min=1, max=2**10)
    for label, spec in zip(labels, specs, strict=True):
        if spec.get("schedule") in ("nope-every-4", "llama4") and num_layers < 4:
            raise PosEncError(
                f"{label} needs at least 4 layers (NoPE on every 4th), got num_layers={num_layers}"
            )
    return Study(
        task=task,
        labels=labels,
        specs=specs,
        train_len=train_len,
        eval_lens=eval_lens,
        model=ModelSettings(
            check_int("dim", o["dim"], min=1, max=2**16),
            num_layers,
            check_int("num_heads", o["num_heads"], min=1, max=2**10),
        ),
        train=TrainSettings(
            steps=steps,
            batch_size=batch_size,
            seq_len=train_len,
            lr=check_float("lr", o["lr"], min=0.0, min_exclusive=True),
            warmup=warmup,
            optimizer=check_choice("optimizer", o["optimizer"], OPTIMIZERS),
            random_positions=random_positions,
            seed=seeds[0],
            checkpoint_every=check_int(
                "checkpoint_every", o["checkpoint_every"], min=0, max=MAX_COUNT
            ),
        ),
        extend=extend,
        extend_factor=factor,
        finetune_steps=finetune_steps,
        eval_tokens=check_int("eval_tokens", o["eval_tokens"], min=1, max=_MAX_EVAL_TOKENS),
        eval_examples=check_int("eval_examples", o["eval_examples"], min=1, max=MAX_COUNT),
        seeds=seeds,
        task_options=tuple(sorted(task_options.items())),
        layer=layer,
    )


def study_bytes(study: Study, *, eval_max_tokens: int = 8192, world_size: int = 1) -> int:
    """A generous estimate of the memory one process of ``study`` needs at its peak, in
    bytes: the weights with their gradients and AdamW moments, plus the larger of one
    training step's saved activations (every layer, attention probabilities included), one
    fine-tune step's, and one evaluation pass's (no grad: one layer at a time), float32."""
    m, t = study.model, study.train
    d, h, layers, v = m.dim, m.num_heads, m.num_layers, _VOCAB
    rows = max(study.train_len, t.random_positions or 0)  # a learned table's rows
    params = 2 * v * d + layers * (4 + 2 * m.mlp_ratio) * d * d + rows * d
    hidden = (8 + 2 * m.mlp_ratio) * d  # floats a token keeps per layer, besides scores

    def step(batch: int, length: int) -> int:  # with grad: every layer's activations
        return batch * length * (layers * (hidden + 3 * h * length) + 3 * v)

    longest = max(study.eval_lens)
    per_rank = max(1, t.batch_size // world_size)
    peak = step(per_rank, study.train_len)
    if study.finetune_steps:  # batch_size * train_len tokens at the longest eval length
        peak = max(peak, step(max(1, per_rank * study.train_len // longest), longest))
    eval_rows = max(1, eval_max_tokens // longest)
    peak = max(peak, eval_rows * longest * (2 * hidden + 3 * h * longest + 3 * v))
    return 4 * (4 * params + peak)
