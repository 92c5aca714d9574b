"""Bad arguments to the public callables of posenc.experiments: one PosEncError naming the
parameter as a word, never a TypeError, never silently accepted (a 2-D eval_lens, an
empty seeds entry, a study built directly with a field out of range)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from posenc import PosEncError
from posenc.experiments import StudySettings, make_task, run_study

from .tiny import tiny_study

TINY = {"train_len": 8, "eval_lens": [8, 16]}


def _from(**options: Any) -> Callable[[], Any]:
    return lambda: tiny_study("copy", ["rope"], **{**TINY, **options})


def _direct(**fields: Any) -> Callable[[], Any]:
    """A study built directly, from a good one with ``fields`` changed."""
    good = tiny_study("copy", ["rope"], **TINY)
    return lambda: dataclasses.replace(good, **fields)


CASES: dict[str, tuple[Callable[[], Any], str, str]] = {
    "eval_lens-2d-list": (_from(eval_lens=[[8], [16]]), "eval_lens", r"entries must be integers"),
    "eval_lens-2d-numpy": (_from(eval_lens=np.array([[8], [16]])), "eval_lens", r"1-D list"),
    "eval_lens-2d-tensor": (_from(eval_lens=torch.tensor([[8], [16]])), "eval_lens", r"1-D"),
    "eval_lens-1-element-arrays": (
        _from(eval_lens=[np.array([8]), np.array([16])]),
        "eval_lens",
        r"entries must be integers",
    ),
    "eval_lens-float-tensor": (
        _from(eval_lens=[torch.tensor(8.5)]),
        "eval_lens",
        r"entries must be integers",
    ),
    "eval_lens-dict": (_from(eval_lens={8: 1, 16: 2}), "eval_lens", r"must be a list"),
    "eval_lens-repeated": (_from(eval_lens=[8, 8]), "eval_lens", r"must be distinct"),
    "seeds-empty-entry": (_from(seeds="0,,1"), "seeds", r"must not hold an empty entry"),
    "seeds-underscore": (_from(seeds="1_000"), "seeds", r"entries must be integers"),
    "seeds-plus": (_from(seeds="+1"), "seeds", r"entries must be integers"),
    "seeds-2d-numpy": (_from(seeds=np.array([[0], [1]])), "seeds", r"1-D list"),
    "seeds-int": (_from(seeds=3), "seeds", r"must be a list of integers"),
    "encodings-empty-entry": (
        lambda: tiny_study("copy", "rope,,alibi", **TINY),
        "encodings",
        r"must not hold an empty entry",
    ),
    "encodings-int": (lambda: tiny_study("copy", 5, **TINY), "encodings", r"must be a list"),
    "encodings-dict": (
        lambda: tiny_study("copy", {"type": "rope"}, **TINY),
        "encodings",
        r"must be a list",
    ),
    "extend-empty-entry": (_from(extend="pi,,ntk"), "extend", r"must not hold an empty entry"),
    "extend-int": (_from(extend=5), "extend", r"must be a list"),
    "extend-empty-name": (_from(extend=[""]), "extend", r"must be one of"),
    "direct-eval_lens-2d": (_direct(eval_lens=((8, 16),)), "eval_lens", r"entries must be"),
    "direct-eval_lens-zero": (_direct(eval_lens=(0,)), "eval_lens", r"must be >= 1"),
    "direct-train_len": (_direct(train_len=16), "train", r"train_len \(16\)"),
    "direct-task": (_direct(task="nope"), "task", r"must be one of"),
    "direct-labels": (_direct(labels=("rope", "rope")), "encodings", r"must be distinct"),
    "direct-specs": (_direct(specs=()), "specs", r"one per label"),
    "direct-model": (_direct(model=None), "model", r"must be a ModelSettings"),
    "direct-train": (_direct(train={}), "train", r"must be a TrainSettings"),
    "direct-extend": (_direct(extend=("warp",)), "extend", r"must be one of"),
    "direct-extend_factor": (_direct(extend_factor=float("nan")), "extend_factor", r"finite"),
    "direct-finetune_steps": (_direct(finetune_steps=-1), "finetune_steps", r">= 0"),
    "direct-eval_tokens": (_direct(eval_tokens=0), "eval_tokens", r">= 1"),
    "direct-eval_examples": (_direct(eval_examples=10**12), "eval_examples", r"<= 10000000"),
    "direct-seeds": (_direct(seeds=(1, 2)), "train.seed", r"must be one of seeds"),
    "direct-seeds-repeated": (_direct(seeds=(0, 0)), "seeds", r"distinct"),
    "direct-task_options": (_direct(task_options=(("num_vars", 3),)), "num_vars", r"counting"),
    "direct-layer": (_direct(layer=(("qk_norm", "yes"),)), "qk_norm", r"True or False"),
    "check_task": (lambda: tiny_study("copy", **TINY).check_task(5), "task", r"a Task"),
    "check_processes-zero": (
        lambda: tiny_study("copy", **TINY).check_processes(0),
        "world_size",
        r">= 1",
    ),
    "check_processes-string": (
        lambda: tiny_study("copy", **TINY).check_processes("2"),
        "world_size",
        r"must be an integer",
    ),
    "make_task-eval_examples": (
        lambda: make_task("copy", eval_examples=10**12),
        "eval_examples",
        r"<= 10000000",
    ),
    "make_task-eval_tokens": (lambda: make_task("lm", eval_tokens=0), "eval_tokens", r">= 1"),
    "run_study-settings-int": (lambda: run_study(5), "settings", r"must be a StudySettings"),
    "run_study-settings-and-options": (
        lambda: run_study(tiny_study("copy", **TINY), steps=3),
        "settings",
        r"takes no study options",
    ),
    "run_study-plot": (lambda: run_study(tiny_study("copy", **TINY), plot="x"), "plot", r"True"),
    "run_study-resume": (lambda: run_study(tiny_study("copy", **TINY), resume=1), "resume", "True"),
    "run_study-on_event": (
        lambda: run_study(tiny_study("copy", **TINY), on_event=5, plot=False),
        "on_event",
        r"must be a callable",
    ),
    "run_study-max_bytes": (
        lambda: run_study(tiny_study("copy", **TINY), max_bytes="x", plot=False),
        "max_bytes",
        r"must be an integer",
    ),
    "run_study-out_dir": (
        lambda: run_study(tiny_study("copy", **TINY), out_dir=5, plot=False),
        "out_dir",
        r"must be a path",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_argument_is_one_posenc_error_naming_it(case: str) -> None:
    call, name, pattern = CASES[case]
    with pytest.raises(PosEncError, match=pattern) as info:
        call()
    message = str(info.value)
    assert re.search(rf"(^|[^\w.]){re.escape(name)}($|[^\w])", message), message
    assert "\n" not in message


def test_a_study_built_directly_equals_the_one_from_options() -> None:
    study = tiny_study("copy", ["rope", "alibi"], **TINY)
    fields = {f.name: getattr(study, f.name) for f in dataclasses.fields(study)}
    listed = {**fields, "eval_lens": list(study.eval_lens), "seeds": list(study.seeds)}
    again = StudySettings(**listed)
    assert again == study and again.eval_lens == (8, 16) and again.seeds == (0,)
