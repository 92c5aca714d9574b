"""The rules of every field of a :class:`~posenc.experiments.settings.StudySettings`.

``StudySettings.from_options`` builds a study from a preset and options; a study built
directly (``StudySettings(task=..., ...)``, or ``dataclasses.replace``) is held to the same
rules here, so that ``run_study`` never starts on a field out of its range: each broken
rule is one line of :class:`~posenc.PosEncError` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc._errors import check_float, check_int
from posenc._fields import At, choice, fail, mapping, sequence
from posenc.experiments.extension import EXTENSIONS
from posenc.experiments.models import ModelSettings, check_distinct
from posenc.experiments.options import int_sequence
from posenc.experiments.presets import MAX_COUNT, MAX_EVAL_TOKENS, MAX_LENGTH, MAX_SEEDS
from posenc.experiments.tasks import TASKS, make_task
from posenc.experiments.train import TrainSettings
from posenc.models.layers import check_layer

__all__ = ["check_study_fields"]


def _pairs(name: str, value: Any) -> tuple[tuple[str, Any], ...]:
    """``value`` as ``((key, value), ...)``: a tuple of string-keyed pairs, or a dict."""
    items = list(value.items()) if isinstance(value, Mapping) else value
    sequence(name, items, "a tuple of (name, value) pairs", types=(list, tuple))
    for i, item in enumerate(items):
        if not isinstance(item, (list, tuple)) or len(item) != 2 or not isinstance(item[0], str):
            raise fail(At(path=name)[i], "a (name, value) pair", item)
    return tuple((k, v) for k, v in items)


def _labels(labels: Any, specs: Any) -> tuple[tuple[str, ...], tuple[dict[str, Any], ...]]:
    sequence("labels", labels, "a non-empty tuple of run names", low=1, types=(list, tuple))
    for i, label in enumerate(labels):
        if not isinstance(label, str) or not label.strip():
            raise fail(At(path="labels")[i], "a run name (a string)", label)
    check_distinct(labels)
    n = len(labels)
    rule = f"a tuple of {n} encoding configs (one per label)"
    sequence("specs", specs, rule, low=n, high=n, types=(list, tuple))
    for i, spec in enumerate(specs):
        mapping(At(path="specs")[i], spec, "a config dict")
    return tuple(labels), tuple(dict(spec) for spec in specs)


def _lengths(name: str, values: Any) -> tuple[int, ...]:
    out = int_sequence(name, values, low=1, high=MAX_LENGTH)
    if not out or len(set(out)) != len(out):
        raise fail(name, "distinct lengths, at least one", list(out))
    return out


def check_study_fields(s: Any) -> dict[str, Any]:
    """The checked (and normalized: lists become tuples) fields of the study ``s``."""
    task = choice("task", s.task, tuple(TASKS))
    labels, specs = _labels(s.labels, s.specs)
    train_len = check_int("train_len", s.train_len, min=1, max=MAX_LENGTH)
    if not isinstance(s.model, ModelSettings):
        raise fail("model", "a ModelSettings", s.model)
    if not isinstance(s.train, TrainSettings):
        raise fail("train", "a TrainSettings", s.train)
    if s.train.seq_len != train_len:
        raise fail("train.seq_len", f"train_len ({train_len})", s.train.seq_len)
    extend = sequence("extend", s.extend, "a tuple of extension names", types=(list, tuple))
    extend = tuple(choice("extend", m, tuple(EXTENSIONS)) for m in extend)
    if extend and "rope" not in labels:
        rule = f"empty unless 'rope' is among the labels ({', '.join(labels)})"
        raise fail("extend", rule, extend)
    seeds = int_sequence("seeds", s.seeds, low=-(2**63), high=2**63 - 1)
    if not seeds or len(seeds) > MAX_SEEDS or len(set(seeds)) != len(seeds):
        raise fail("seeds", f"1 to {MAX_SEEDS} distinct seeds", list(seeds))
    if s.train.seed not in seeds:
        raise fail("train.seed", f"one of seeds {list(seeds)}", s.train.seed)
    task_options = _pairs("task_options", s.task_options)
    if task_options:
        make_task(task, **dict(task_options))  # the task checks its own options
    layer = _pairs("layer", s.layer)
    check_layer(0, dict(layer))
    return {
        "task": task,
        "labels": labels,
        "specs": specs,
        "train_len": train_len,
        "eval_lens": _lengths("eval_lens", s.eval_lens),
        "extend": extend,
        "extend_factor": check_float(
            "extend_factor", s.extend_factor, min=1.0, max=float(MAX_LENGTH)
        ),
        "finetune_steps": check_int("finetune_steps", s.finetune_steps, min=0, max=MAX_COUNT),
        "eval_tokens": check_int("eval_tokens", s.eval_tokens, min=1, max=MAX_EVAL_TOKENS),
        "eval_examples": check_int("eval_examples", s.eval_examples, min=1, max=MAX_COUNT),
        "seeds": seeds,
        "task_options": task_options,
        "layer": layer,
    }
