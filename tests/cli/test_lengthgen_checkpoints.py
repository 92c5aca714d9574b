"""``posenc lengthgen --resume`` on a re-sealed checkpoint whose field is out of range:
one line, exit code 2, naming the field (1e30 weights ended in an internal error while
writing results.json; a 10**6-entry loss list changed the reported final loss)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.experiments.test_checkpoint_ranges import reseal
from tests.experiments.tiny import CLI_COPY, check_one_line_error, run_cli

BASE = [*CLI_COPY, "--eval-lens", "8,16"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The out folder of a finished tiny study (its final checkpoint, step 3)."""
    out = tmp_path_factory.mktemp("study") / "out"
    with pytest.raises(SystemExit) as info:
        from posenc.cli import main

        main([*BASE, "--out", str(out)])
    assert info.value.code in (0, None)
    return out


def _weights(state: dict[str, Any]) -> None:
    state["model"] = {
        k: torch.full_like(v, 1e30) if v.is_floating_point() else v
        for k, v in state["model"].items()
    }


def _lr(state: dict[str, Any]) -> None:
    state["optimizer"]["param_groups"][0]["lr"] = math.nan


def _losses(state: dict[str, Any]) -> None:
    state["loss"] = [0.0] * 10**6


CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "weights-1e30": (_weights, r"rope\.pt' field model\['.*'\] must be of magnitude <= 1e\+06"),
    "lr-nan": (_lr, r"rope\.pt' field optimizer\['param_groups'\]\[0\]\['lr'\] must be a finite"),
    "loss-1e6": (_losses, r"rope\.pt' field loss must be a list of the last 3 training losses"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_resealed_checkpoint_out_of_range_is_refused(
    finished: Path, tmp_path: Path, capsys, case: str
) -> None:
    change, pattern = CASES[case]
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    path = out / "checkpoints" / "rope.pt"
    path.write_bytes((finished / "checkpoints" / "rope.pt").read_bytes())
    reseal(path, change)
    code, _, err = run_cli([*BASE, "--out", str(out), "--resume"], capsys)
    check_one_line_error(code, err, pattern)
    assert not (out / "results.json").exists()


def test_the_untouched_checkpoint_resumes_to_the_same_numbers(
    finished: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    path = out / "checkpoints" / "rope.pt"
    path.write_bytes((finished / "checkpoints" / "rope.pt").read_bytes())
    reseal(path, lambda state: None)
    code, _, err = run_cli([*BASE, "--out", str(out), "--resume"], capsys)
    assert code in (0, None), err
    before = json.loads((finished / "results.json").read_text())["runs"]
    after = json.loads((out / "results.json").read_text())["runs"]
    assert [r["eval"] for r in after] == [r["eval"] for r in before]
    assert after[0]["train"]["final_loss"] == before[0]["train"]["final_loss"]
