"""Damaged and crafted checkpoints: every case one line of PosEncError, none undetected.

The damage matrix cuts a real checkpoint at many offsets and flips every single byte of
it; the crafted cases rewrite one field (with a valid seal, so only the field rules can
catch them). Also: the file still loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import io
import json
import math
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.experiments._checkpoint_state import CONFIG, checkpoint_state, model_and_optimizer

from posenc import PosEncError
from posenc.experiments import checkpoint as ckpt
from posenc.experiments.checkpoint_fields import check_fits


def _one_line(error: pytest.ExceptionInfo[PosEncError]) -> str:
    message = str(error.value)
    assert "\n" not in message and len(message) < 400, message
    assert "Traceback" not in message and "weights_only" not in message
    return message


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("sealed") / "run.pt"
    ckpt.save_checkpoint(path, checkpoint_state())
    return path.read_bytes()


def test_a_sealed_checkpoint_loads_with_weights_only(sealed: bytes, tmp_path: Path) -> None:
    path = tmp_path / "run.pt"
    path.write_bytes(sealed)
    plain = torch.load(path, weights_only=True)  # the trailer is invisible to torch
    assert plain["format"] == ckpt.FORMAT and torch.equal(
        plain["model"]["weight"], checkpoint_state()["model"]["weight"]
    )
    assert ckpt.load_checkpoint(path, config=CONFIG)["step"] == 3
    assert sealed[-(len(ckpt.TRAILER) + 65) :].startswith(ckpt.TRAILER)


def _cuts(n: int) -> list[int]:
    trailer = len(ckpt.TRAILER) + 65
    return sorted({0, 1, 2, 10, 100, n // 4, n // 2, n - trailer - 1, n - trailer, n - 40, n - 1})


def test_every_truncation_is_refused(sealed: bytes, tmp_path: Path) -> None:
    path = tmp_path / "run.pt"
    for keep in _cuts(len(sealed)):
        path.write_bytes(sealed[:keep])
        with pytest.raises(PosEncError, match=r"is truncated or corrupt|has no sha256") as info:
            ckpt.load_checkpoint(path, config=CONFIG)
        _one_line(info)


def test_every_flipped_byte_is_refused(sealed: bytes, tmp_path: Path) -> None:
    """All of them, one at a time: the seal covers every byte, the trailer included."""
    path = tmp_path / "run.pt"
    undetected = []
    for offset in range(len(sealed)):
        damaged = bytearray(sealed)
        damaged[offset] ^= 0x01 if offset % 2 else 0x80
        path.write_bytes(bytes(damaged))
        try:
            ckpt.load_checkpoint(path, config=CONFIG)
        except PosEncError as e:
            assert "\n" not in str(e) and "truncated or corrupt" in str(e), (offset, str(e))
        else:
            undetected.append(offset)
    assert not undetected, f"flips at {undetected[:10]} were not detected"


def test_appended_bytes_are_refused(sealed: bytes, tmp_path: Path) -> None:
    path = tmp_path / "run.pt"
    path.write_bytes(sealed + b"x")
    with pytest.raises(PosEncError, match="is truncated or corrupt"):
        ckpt.load_checkpoint(path, config=CONFIG)


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(state: dict[str, Any]) -> None:
        target = state
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def _drop(*path: Any) -> Callable[[dict[str, Any]], None]:
    def change(state: dict[str, Any]) -> None:
        target = state
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return change


def _nan_weight(state: dict[str, Any]) -> None:
    state["model"]["weight"] = state["model"]["weight"].clone()
    state["model"]["weight"][0, 0] = math.nan


CRAFTED: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "loss-empty": (_set(("loss",), []), r"field loss must be a list of the last 3 training"),
    "loss-nan": (_set(("loss",), [1.0, 1.0, math.nan]), r"field loss\[2\] must be a finite"),
    "loss-string": (_set(("loss",), ["x", 1.0, 1.0]), r"field loss\[0\] must be a number"),
    "loss-not-list": (_set(("loss",), 3.0), r"field loss must be a list of the last 3"),
    "next-step-string": (_set(("data", "next_step"), "x"), r"next_step'\] must be an integer"),
    "next-step-missing": (_drop("data", "next_step"), r"field data must be a dict holding"),
    "next-step-huge": (_set(("data", "next_step"), 10**9), r"next_step'\] must be an integer in"),
    "next-step-zero": (_set(("data", "next_step"), 0), r"next_step'\] must be an integer in"),
    "next-step-other": (_set(("data", "next_step"), 4), r"must be equal to step \(3\)"),
    "next-step-bool": (_set(("data", "next_step"), True), r"must be an integer"),
    "data-junk": (_set(("data",), [1]), r"field data must be a dict"),
    "step-huge": (_set(("step",), 10**9), r"field step must be an integer in \[1, 10\]"),
    "step-float": (_set(("step",), 3.0), r"field step must be an integer"),
    "seconds-negative": (_set(("seconds",), -1.0), r"field seconds must be a finite"),
    "seconds-inf": (_set(("seconds",), math.inf), r"field seconds must be a finite"),
    "seconds-string": (_set(("seconds",), "1"), r"field seconds must be a number"),
    "weights-nan": (_nan_weight, r"field model\['weight'\] must be finite"),
    "weights-junk": (_set(("model", "weight"), "x"), r"field model must be a non-empty dict"),
    "model-empty": (_set(("model",), {}), r"field model must be a non-empty dict"),
    "optimizer-junk": (_set(("optimizer",), "x"), r"field optimizer must be an optimizer"),
    "optimizer-state-junk": (_set(("optimizer", "state"), [1]), r"field optimizer must be"),
    "optimizer-nan": (
        _set(("optimizer", "state", 0, "exp_avg"), torch.full((2, 3), math.nan)),
        r"field optimizer\['state'\]\[0\]\['exp_avg'\] must be finite",
    ),
    "rng-empty": (_set(("rng",), []), r"field rng must be a list of 1 generator states"),
    "rng-junk": (_set(("rng",), ["x"]), r"field rng\[0\] must be a dict"),
    "rng-torch-short": (
        _set(("rng", 0, "torch"), torch.zeros(3, dtype=torch.uint8)),
        r"field rng\[0\]\['torch'\] must be a uint8 tensor",
    ),
    "rng-torch-float": (
        _set(("rng", 0, "torch"), torch.zeros(5056)),
        r"field rng\[0\]\['torch'\] must be a uint8 tensor",
    ),
    "rng-python-short": (
        _set(("rng", 0, "python", "state"), [1, 2]),
        r"field rng\[0\]\['python'\]\['state'\] must be 625",
    ),
    "rng-python-version": (
        _set(("rng", 0, "python", "version"), "3"),
        r"\['python'\]\['version'\] must be an integer",
    ),
    "rng-python-gauss": (
        _set(("rng", 0, "python", "gauss"), math.nan),
        r"\['gauss'\] must be a finite",
    ),
    "rng-cuda-junk": (_set(("rng", 0, "cuda"), "x"), r"\['cuda'\] must be a list"),
    "config-junk": (_set(("config",), "{"), r"field config must be a JSON object"),
    "config-other": (_set(("config",), json.dumps({"a": 1})), r"different configuration"),
    "format-other": (_set(("format",), 1), r"has format 1, this posenc reads 2"),
    "key-missing": (_drop("loss"), r"is not a posenc checkpoint"),
}


def _write_crafted(path: Path, state: dict[str, Any]) -> None:
    """``state`` saved and sealed as is (``format`` included), bypassing save_checkpoint."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    body = buffer.getvalue()
    import hashlib

    path.write_bytes(body + ckpt.TRAILER + hashlib.sha256(body).hexdigest().encode() + b"\n")


@pytest.mark.parametrize("case", list(CRAFTED))
def test_crafted_fields_are_refused_in_one_line(tmp_path: Path, case: str) -> None:
    change, pattern = CRAFTED[case]
    state = {"format": ckpt.FORMAT, **checkpoint_state()}
    change(state)
    path = tmp_path / "run.pt"
    _write_crafted(path, state)
    with pytest.raises(PosEncError, match=pattern) as info:
        ckpt.load_checkpoint(path, config=CONFIG)
    _one_line(info)


def test_a_sealed_pickle_is_refused_as_pickled_objects(tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self):
            return (print, ("a checkpoint must never run code",))

    path = tmp_path / "run.pt"
    _write_crafted(path, {**checkpoint_state(), "format": ckpt.FORMAT, "model": Payload()})
    with pytest.raises(PosEncError, match="is refused: it holds pickled Python objects") as info:
        ckpt.load_checkpoint(path, config=CONFIG)
    assert "truncated" not in _one_line(info)
    path.write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(PosEncError, match="is truncated or corrupt"):
        ckpt.load_checkpoint(path, config=CONFIG)


FITS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "weight-shape": (_set(("model", "weight"), torch.zeros(3, 3)), r"model\['weight'\] must be"),
    "weight-dtype": (
        _set(("model", "weight"), torch.zeros(2, 3, dtype=torch.float64)),
        r"must be a torch.float32 tensor of shape \[2, 3\]",
    ),
    "weight-missing": (_drop("model", "bias"), r"missing \['bias'\]"),
    "weight-extra": (_set(("model", "extra"), torch.zeros(1)), r"unexpected \['extra'\]"),
    "moment-shape": (
        _set(("optimizer", "state", 0, "exp_avg"), torch.zeros(7)),
        r"\['exp_avg'\] must be a floating tensor of shape \[2, 3\]",
    ),
    "moment-missing": (_drop("optimizer", "state", 0, "exp_avg_sq"), r"\['exp_avg_sq'\] must be"),
    "step-junk": (_set(("optimizer", "state", 0, "step"), "x"), r"\['step'\] must be a one-elem"),
    "state-unknown-param": (
        _set(("optimizer", "state", 9), {}),
        r"field optimizer\['state'\]\[9\] must be the state of a parameter",
    ),
    "groups-other": (_set(("optimizer", "param_groups"), []), r"must be 1 groups"),
    "group-lr-junk": (_set(("optimizer", "param_groups", 0, "lr"), "x"), r"\['lr'\] must be a num"),
}


@pytest.mark.parametrize("case", list(FITS))
def test_weights_and_optimizer_must_fit_the_model(case: str) -> None:
    change, pattern = FITS[case]
    state = checkpoint_state()
    change(state)
    model, opt = model_and_optimizer()
    with pytest.raises(PosEncError, match=pattern) as info:
        check_fits("checkpoint 'run.pt'", state, model, opt)
    _one_line(info)


def test_a_fitting_state_passes() -> None:
    model, opt = model_and_optimizer()
    check_fits("checkpoint 'run.pt'", checkpoint_state(), model, opt)
