"""The tiny study the study tests run (seconds on a CPU) and the ``posenc lengthgen`` helpers
they share."""

from __future__ import annotations

import re
from typing import Any

import pytest

from posenc.cli import main
from posenc.experiments import StudySettings

#: A study small enough for a test: 3 steps of a 1-layer, width-16 model, no RoPE extension.
TINY: dict[str, Any] = {
    "steps": 3,
    "batch_size": 4,
    "dim": 16,
    "num_layers": 1,
    "num_heads": 2,
    "eval_tokens": 256,
    "eval_examples": 8,
    "warmup": 1,
    "extend": (),
    "finetune_steps": 0,
}

#: The same study as ``posenc lengthgen`` arguments, quiet.
CLI_TINY = (
    "--steps 3 --batch-size 4 --dim 16 --layers 1 --heads 2 --eval-examples 8 --eval-tokens 256 "
    "--warmup 1 --extend none --finetune-steps 0 --quiet"
).split()

#: ``posenc lengthgen`` on the tiny study of rope on copy, trained at 8, in one process and
#: with no plot (``--eval-lens`` and ``--out`` to add).
CLI_COPY = [
    *"lengthgen --task copy --encodings rope --train-len 8 --jobs 1 --no-plot".split(),
    *CLI_TINY,
]


def tiny_study(task: str = "lm", encodings: Any = ("rope",), **options: Any) -> StudySettings:
    """The settings of a tiny study of ``encodings`` on ``task``: :data:`TINY` with
    ``options`` over it."""
    return StudySettings.from_options(task, encodings, **{**TINY, **options})


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``posenc ARGV`` in this process: its exit code, stdout and stderr."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def check_one_line_error(code: int, err: str, pattern: str) -> None:
    """A user error: exit code 2 and one line ``posenc: error: ...`` matching ``pattern``."""
    assert code == 2
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("posenc: error: ")
    assert re.search(pattern, err), err
