"""The settings of a length-generalization study: presets, defaults and validation.

Everything a study is told is one frozen :class:`StudySettings`, built and checked here
(:meth:`StudySettings.from_options`) before anything trains, so that a bad setting fails in
one line instead of minutes into a run; ``run_study``, the runners and the worker processes
take it whole, and ``results.json`` records it (:meth:`StudySettings.to_record`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

from posenc._errors import PosEncError, check_bool, check_choice, check_float, check_int
from posenc.experiments.extension import EXTENSIONS
from posenc.experiments.models import ModelSettings, check_distinct, encoding_label, encoding_spec
from posenc.experiments.optim import OPTIMIZERS
from posenc.experiments.options import int_sequence, string_sequence
from posenc.experiments.presets import (
    DEFAULT_ENCODINGS,
    MAX_COUNT,
    MAX_EVAL_TOKENS,
    MAX_LENGTH,
    MAX_SEEDS,
    PRESETS,
    STUDY_OPTIONS,
)
from posenc.experiments.settings_fields import check_study_fields
from posenc.experiments.tasks import TASKS, LMTask, Task, make_task
from posenc.experiments.train import TrainSettings
from posenc.models.layers import check_layer

__all__ = [
    "DEFAULT_ENCODINGS",
    "MAX_COUNT",
    "MAX_LENGTH",
    "MAX_SEEDS",
    "PRESETS",
    "STUDY_OPTIONS",
    "StudySettings",
    "make_study_task",
    "resolve",
    "study_bytes",
]

_VOCAB = 256  # the largest vocabulary of the built-in tasks (bytes)


@dataclasses.dataclass(frozen=True)
class StudySettings:
    """Everything a study is told, validated: built once (:meth:`from_options`, from a
    preset and the options), recorded in ``results.json`` (:meth:`to_record`, its
    ``"settings"``) and handed whole to :func:`~posenc.experiments.lengthgen.run_study`,
    the runners and the worker processes (it pickles).

    Build it with :meth:`from_options`, the one place the options are checked; the fields
    hold the checked values (``labels[i]`` is the name ``specs[i]``'s runs are reported
    under).

    Examples:
        >>> s = StudySettings.from_options("copy", "rope,alibi", preset="quick", steps=20)
        >>> s.labels, s.train.steps, s.train_len, s.eval_lens
        (('rope', 'alibi'), 20, 32, (32, 64, 128))
        >>> s.to_record()["train"]["warmup"]  # a tenth of the steps
        2
    """

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

    @classmethod
    def from_options(
        cls,
        task: str = "lm",
        encodings: Any = DEFAULT_ENCODINGS,
        *,
        preset: str = "default",
        **options: Any,
    ) -> StudySettings:
        """A study's settings from ``PRESETS[preset]`` and ``options`` (any of
        :data:`STUDY_OPTIONS`; one left out or None is the preset's), every one checked.

        The preset's RoPE extension (and its fine-tune) is dropped when the study has no
        ``rope`` or nothing past ``train_len`` to extend to; only a conflict the caller wrote
        is an error. Every option in full: ``docs/lengthgen.md``.

        Args:
            task: ``"lm"``, ``"copy"``, ``"reverse"``, ``"recall"``, ``"addition"``,
                ``"counting"`` or ``"flipflop"``.
            encodings: registry names or config dicts (``["none", "rope"]`` or
                ``"none,rope"``), study variants (``"prope-0.75"``, ``"drope"``), each
                optionally with a per-layer schedule (``"rope@nope-every-4"``).
            preset: ``"default"`` or ``"quick"`` (:data:`PRESETS`).
            train_len, eval_lens, steps: the training length ``L``, the evaluation lengths,
                the training steps per encoding.
            seed, seeds: one seed (default 0), or several (``"0,1,2"``), each training every
                encoding.
            batch_size, dim, num_layers, num_heads, lr, warmup, optimizer: the models and
                their training (``optimizer``: ``"adamw"`` or ``"muon"``).
            random_positions: train on positions drawn from ``[0, L_max)``, ``L_max >= L``.
            extend, extend_factor, finetune_steps: RoPE extension methods (``"pi"``,
                ``"ntk"``, ``"yarn"``) evaluated on the trained ``rope`` model, their
                factor, and an optional fine-tune at ``max(eval_lens)``.
            checkpoint_every, eval_tokens, eval_examples: checkpoints, and how much is
                evaluated per length.
            num_vars, eval_split: the ``counting`` and ``flipflop`` tasks' own options.
            qk_norm, temperature, drope_at: every layer's QK-norm and query temperature;
                when the ``drope`` variant drops RoPE.

        Raises:
            PosEncError: a bad or unknown option, naming it, the rule and the value.
        """
        check_choice("task", task, tuple(TASKS))
        unknown = sorted(set(options) - set(STUDY_OPTIONS))
        if unknown:
            raise PosEncError(
                f"study options must be among {', '.join(STUDY_OPTIONS)}, got "
                f"{', '.join(map(repr, unknown))}"
            )
        given = {name: options.get(name) for name in STUDY_OPTIONS}
        seeds = _seeds(given["seed"], given["seeds"])
        task_options = _task_options(task, given)
        layer = _layer_settings(given["qk_norm"], given["temperature"])
        drope_at = given["drope_at"]
        if drope_at is not None:
            drope_at = check_float("drope_at", drope_at, min=0.0, max=1.0)
        o = _with_preset(preset, given)
        names, labels = _encoding_names(encodings)
        train = _train_settings(o, seed=seeds[0])
        eval_lens = _int_list("eval_lens", o["eval_lens"])
        extend, factor, finetune_steps = _extension(o, given, labels, train.seq_len, eval_lens)
        model = _model_settings(o)
        return cls(
            task=task,
            labels=labels,
            train_len=train.seq_len,
            eval_lens=eval_lens,
            specs=_specs(names, labels, train.seq_len, drope_at, model.num_layers),
            model=model,
            train=train,
            extend=extend,
            extend_factor=factor,
            finetune_steps=finetune_steps,
            eval_tokens=check_int("eval_tokens", o["eval_tokens"], min=1, max=MAX_EVAL_TOKENS),
            eval_examples=check_int("eval_examples", o["eval_examples"], min=1, max=MAX_COUNT),
            seeds=seeds,
            task_options=task_options,
            layer=layer,
        )

    def __post_init__(self) -> None:
        # a study built directly (or by dataclasses.replace) is held to from_options' rules
        for name, value in check_study_fields(self).items():
            object.__setattr__(self, name, value)

    def check_task(self, task: Task) -> None:
        """Refuse a length ``task`` (:func:`make_study_task`) cannot make: shorter than a
        synthetic task's shortest, longer than the ``lm`` corpus."""
        if not isinstance(task, Task):
            raise PosEncError(f"task must be a Task (make_study_task), got {task!r:.80}")
        task.check_length("train_len", self.train_len)
        for length in self.eval_lens:  # the fine-tune's length is the longest of them
            task.check_length("eval_lens entry", length)

    def check_processes(self, world_size: int) -> None:
        """Refuse a ``batch_size`` that ``world_size`` processes (torchrun) cannot share."""
        world_size = check_int("world_size", world_size, min=1, max=2**16)
        if self.train.batch_size % world_size:
            raise PosEncError(
                f"batch_size must be divisible by the number of processes ({world_size}), "
                f"got {self.train.batch_size}"
            )

    def to_record(self) -> dict[str, Any]:
        """The ``"settings"`` of ``results.json``: the model's and the training's settings,
        the seeds, the extension, the eval size the task uses (``eval_tokens`` for ``lm``,
        ``eval_examples`` for the others; the other None), the task's and the layers'
        options. The task, lengths and encodings are the record's own keys and runs."""
        lm = issubclass(TASKS[self.task], LMTask)
        return {
            "model": self.model.to_dict(),
            "train": self.train.to_dict(),
            "seeds": list(self.seeds),
            "extend": list(self.extend),
            "extend_factor": self.extend_factor if self.extend else None,
            "finetune_steps": self.finetune_steps,
            "eval_tokens": self.eval_tokens if lm else None,
            "eval_examples": None if lm else self.eval_examples,
            "task_options": dict(self.task_options),
            "layer": dict(self.layer),
        }


def _int_list(name: str, values: Any) -> tuple[int, ...]:
    """Lengths: a 1-D list (or ``"8,16"``) of distinct integers in ``[1, MAX_LENGTH]``."""
    out = int_sequence(name, values, low=1, high=MAX_LENGTH)
    if not out:
        raise PosEncError(f"{name} must hold at least one length, got {values!r:.80}")
    repeated = sorted({v for v in out if out.count(v) > 1})
    if repeated:
        raise PosEncError(f"{name} must be distinct, got {list(out)} (repeated: {repeated})")
    return out


_SEED_RANGE = {"low": -(2**63), "high": 2**63 - 1}


def check_seeds(seeds: Any) -> tuple[int, ...]:
    """``seeds`` (a 1-D list or ``"0,1,2"``): 1 to ``MAX_SEEDS`` distinct 64-bit integers."""
    out = int_sequence("seeds", seeds, **_SEED_RANGE)
    if not out:
        raise PosEncError(f"seeds must hold at least one seed, got {seeds!r:.80}")
    if len(out) > MAX_SEEDS:
        raise PosEncError(f"seeds must hold at most {MAX_SEEDS} seeds, got {len(out)}")
    repeated = sorted({v for v in out if out.count(v) > 1})
    if repeated:
        raise PosEncError(f"seeds must be distinct, got {list(out)} (repeated: {repeated})")
    return out


def _seeds(seed: Any, seeds: Any) -> tuple[int, ...]:
    """The study's seeds from ``seed`` (one) or ``seeds`` (a list or ``"0,1,2"``)."""
    if seeds is None:
        low, high = _SEED_RANGE["low"], _SEED_RANGE["high"]
        return (check_int("seed", 0 if seed is None else seed, min=low, max=high),)
    if seed is not None:
        raise PosEncError(f"give seed or seeds, not both: got seed={seed!r} and seeds={seeds!r}")
    return check_seeds(seeds)


def _task_options(task: str, given: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The task's own options that were given (checked by the task)."""
    options = {k: given[k] for k in ("num_vars", "eval_split") if given[k] is not None}
    make_task(task, **options)  # refuses an option of another task, or a bad value
    return tuple(sorted(options.items()))


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


def _with_preset(preset: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The options with the preset's value for each one not given."""
    values = PRESETS[check_choice("preset", preset, tuple(PRESETS))]
    return {k: values.get(k) if v is None else v for k, v in given.items()}


def _encoding_names(encodings: Any) -> tuple[list[Any], tuple[str, ...]]:
    """The encodings as a list (``"rope,alibi"`` split) and the distinct labels of their
    runs."""
    names = string_sequence("encodings", encodings)
    if not names:
        raise PosEncError("encodings must name at least one encoding, got none")
    labels = tuple(encoding_label(e) for e in names)
    check_distinct(labels)
    return names, labels


def _train_settings(o: Mapping[str, Any], *, seed: int) -> TrainSettings:
    """How every model trains (``seq_len`` is the study's ``train_len``)."""
    steps = check_int("steps", o["steps"], min=1, max=MAX_COUNT)
    train_len = check_int("train_len", o["train_len"], min=1, max=MAX_LENGTH)
    random_positions = o["random_positions"]
    if random_positions is not None:
        random_positions = check_int(
            "random_positions", random_positions, min=train_len, max=MAX_LENGTH
        )
    batch_size = check_int("batch_size", o["batch_size"], min=1, max=MAX_COUNT)
    warmup = steps // 10
    if o["warmup"] is not None:
        warmup = min(check_int("warmup", o["warmup"], min=0, max=MAX_COUNT), steps)
    return TrainSettings(
        steps=steps,
        batch_size=batch_size,
        seq_len=train_len,
        lr=check_float("lr", o["lr"], min=0.0, min_exclusive=True),
        warmup=warmup,
        optimizer=check_choice("optimizer", o["optimizer"], OPTIMIZERS),
        random_positions=random_positions,
        seed=seed,
        checkpoint_every=check_int("checkpoint_every", o["checkpoint_every"], min=0, max=MAX_COUNT),
    )


def _extension(
    o: Mapping[str, Any],
    given: Mapping[str, Any],
    labels: tuple[str, ...],
    train_len: int,
    eval_lens: tuple[int, ...],
) -> tuple[tuple[str, ...], float, int]:
    """``(extend, extend_factor, finetune_steps)``. Explicit choices win over the preset's:
    the preset's RoPE extension is dropped when the study has no RoPE model or nothing past
    train_len to extend to, and its fine-tune with it; only a conflict the caller wrote
    (``extend`` or ``finetune_steps`` given) is an error."""
    extend = tuple(
        check_choice("extend", m, tuple(EXTENSIONS)) for m in string_sequence("extend", o["extend"])
    )
    factor = o["extend_factor"]
    if factor is None:
        factor = max(eval_lens) / train_len
    factor = check_float("extend_factor", factor, min=1.0, max=float(MAX_LENGTH))
    if extend and given["extend"] is None and ("rope" not in labels or factor <= 1.0):
        extend = ()
    if extend and "rope" not in labels:
        raise PosEncError(f"extend needs 'rope' among the encodings, got {', '.join(labels)}")
    if extend and factor <= 1.0:
        raise PosEncError(
            f"extend needs an eval length beyond train_len ({train_len}) or an extend_factor "
            f"> 1, got eval_lens {list(eval_lens)}"
        )
    finetune_steps = check_int("finetune_steps", o["finetune_steps"], min=0, max=MAX_COUNT)
    if finetune_steps and not extend:
        if given["finetune_steps"] is not None:
            raise PosEncError(
                "finetune_steps needs extend (pi, ntk or yarn), got no extend methods"
            )
        finetune_steps = 0  # the preset's fine-tune belongs to the extension just dropped
    return extend, factor, finetune_steps


def _model_settings(o: Mapping[str, Any]) -> ModelSettings:
    return ModelSettings(
        check_int("dim", o["dim"], min=1, max=2**16),
        check_int("num_layers", o["num_layers"], min=1, max=2**10),
        check_int("num_heads", o["num_heads"], min=1, max=2**10),
    )


def _specs(
    names: list[Any],
    labels: tuple[str, ...],
    train_len: int,
    drope_at: float | None,
    num_layers: int,
) -> tuple[dict[str, Any], ...]:
    """Each encoding's config, completed with what the study knows (``encoding_spec``),
    ``drope_at`` set on the ``drope`` variant, a schedule checked against the depth."""
    specs = tuple(encoding_spec(e, train_len=train_len) for e in names)
    if drope_at is not None:
        if not any("drope_at" in spec for spec in specs):
            raise PosEncError(
                f"drope_at sets the 'drope' variant's drop, got no 'drope' among the "
                f"encodings ({', '.join(labels)})"
            )
        specs = tuple({**sp, "drope_at": drope_at} if "drope_at" in sp else sp for sp in specs)
    for label, spec in zip(labels, specs, strict=True):
        if spec.get("schedule") in ("nope-every-4", "llama4") and num_layers < 4:
            raise PosEncError(
                f"{label} needs at least 4 layers (NoPE on every 4th), got num_layers={num_layers}"
            )
    return specs


def make_study_task(study: StudySettings) -> Task:
    """The study's task, with its eval sizes and its own options."""
    return make_task(
        study.task,
        eval_tokens=study.eval_tokens,
        eval_examples=study.eval_examples,
        **dict(study.task_options),
    )


def resolve(
    task: str, encodings: Any, options: Mapping[str, Any], world_size: int
) -> StudySettings:
    """:meth:`StudySettings.from_options` with ``options["preset"]`` as the preset, checked
    for ``world_size`` processes too (:meth:`StudySettings.check_processes`)."""
    options = dict(options)
    settings = StudySettings.from_options(
        task, encodings, preset=options.pop("preset", "default"), **options
    )
    settings.check_processes(world_size)
    return settings


def __getattr__(name: str) -> Any:
    if name == "Study":  # StudySettings' name in 0.1.0: PEP 562, for one release
        warnings.warn(
            "posenc.experiments.settings.Study is now StudySettings; the old name will be "
            "removed in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return StudySettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def study_bytes(study: StudySettings, *, eval_max_tokens: int = 8192, world_size: int = 1) -> int:
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
