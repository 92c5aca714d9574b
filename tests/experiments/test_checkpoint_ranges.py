"""A re-sealed checkpoint (its SHA-256 recomputed, as anyone who can write the file can)
is held to the range of every field, not only its type: one test per field, each one line
of PosEncError naming it, on a real checkpoint of a tiny training run."""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.experiments._training import stop_after

from posenc import PosEncError
from posenc.experiments import checkpoint as ckpt
from posenc.experiments.tasks import make_task
from posenc.experiments.train import TrainSettings, load_resumable, run_config, train
from posenc.models import TinyTransformer

SETTINGS = {"steps": 6, "batch_size": 4, "seq_len": 8, "warmup": 2, "checkpoint_every": 2}
CONFIG = {"task": "copy", "label": "rope"}


def reseal(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite the checkpoint at ``path`` with ``change`` applied to its state, sealed
    exactly as :func:`posenc.experiments.checkpoint.save_checkpoint` seals it: the
    ``torch.save`` bytes, then ``TRAILER + sha256(bytes) + "\\n"``."""
    data = path.read_bytes()
    body = data[: -(len(ckpt.TRAILER) + 65)]
    assert data[len(body) :] == ckpt.TRAILER + hashlib.sha256(body).hexdigest().encode() + b"\n"
    state = torch.load(io.BytesIO(body), weights_only=True)
    change(state)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    body = buffer.getvalue()
    path.write_bytes(body + ckpt.TRAILER + hashlib.sha256(body).hexdigest().encode() + b"\n")


def _model() -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer(
        vocab_size=make_task("copy").vocab_size, dim=16, num_layers=1, num_heads=2, encoding="rope"
    )


def _run(optimizer: str) -> tuple[TrainSettings, dict[str, Any]]:
    settings = TrainSettings(**SETTINGS, optimizer=optimizer)
    return settings, run_config(CONFIG, settings, 1)


@pytest.fixture(scope="module", params=["adamw", "muon"])
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint of step 4 of a 6-step run (killed after step 5)."""
    return killed_run(tmp_path_factory.mktemp(request.param), request.param, 5)


def killed_run(folder: Path, optimizer: str, stop: int) -> Path:
    """The checkpoint ``folder/rope.pt`` of a 6-step run with ``optimizer``, killed after
    step ``stop`` (checkpoints every 2 steps)."""
    settings, _ = _run(optimizer)
    path = folder / "rope.pt"
    with pytest.raises(KeyboardInterrupt):
        train(
            _model(),
            make_task("copy", eval_examples=4),
            settings,
            checkpoint=path,
            config=CONFIG,
            on_step=stop_after(stop),
        )
    return path


def _load(path: Path, original: Path) -> dict[str, Any]:
    """``path`` loaded for the run that wrote ``original`` (the untouched checkpoint)."""
    config = json.loads(torch.load(original, weights_only=True)["config"])
    return load_resumable(path, _model(), None, config)


def _adamw(state: dict[str, Any]) -> dict[str, Any]:
    opt = state["optimizer"]
    return opt["adamw"] if "adamw" in opt else opt


def _first(mapping: dict[str, Any], key: str) -> str:
    return next(k for k in mapping if key in k)


def _weights(value: float) -> Callable[[dict[str, Any]], None]:
    def change(state: dict[str, Any]) -> None:
        name = _first(state["model"], "embed")
        state["model"][name] = torch.full_like(state["model"][name], value)

    return change


def _group(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(state: dict[str, Any]) -> None:
        _adamw(state)["param_groups"][0][key] = value

    return change


def _moment(key: str, value: float) -> Callable[[dict[str, Any]], None]:
    def change(state: dict[str, Any]) -> None:
        entry = _adamw(state)["state"][0]
        entry[key] = torch.full_like(entry[key], value)

    return change


def _adam_step(value: float) -> Callable[[dict[str, Any]], None]:
    def change(state: dict[str, Any]) -> None:
        _adamw(state)["state"][0]["step"] = torch.tensor(value)

    return change


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(state: dict[str, Any]) -> None:
        state[key] = value

    return change


def _step_at(step: int) -> Callable[[dict[str, Any]], None]:
    def change(state: dict[str, Any]) -> None:
        state["step"], state["data"] = step, {"next_step": step}
        state["loss"] = state["loss"][:step]

    return change


def _torch_rng(change_bytes: Callable[[torch.Tensor], None]) -> Callable[[dict[str, Any]], None]:
    def change(state: dict[str, Any]) -> None:
        rng = state["rng"][0]["torch"].clone()
        change_bytes(rng)
        state["rng"][0]["torch"] = rng

    return change


def _nan_normal(rng: torch.Tensor) -> None:
    rng[5016:5024] = torch.tensor(list(struct.pack("<d", math.nan)), dtype=torch.uint8)


def _zero(rng: torch.Tensor) -> None:
    rng.zero_()


def _python(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(state: dict[str, Any]) -> None:
        state["rng"][0]["python"][key] = value

    return change


def _nested(state: dict[str, Any]) -> None:
    state["config"] = "[" * 100_000 + "]" * 100_000


FIELDS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "weights-1e30": (_weights(1e30), r"field model\['.*'\] must be of magnitude <= 1e\+06"),
    "lr-nan": (_group("lr", math.nan), r"\['param_groups'\]\[0\]\['lr'\] must be a finite num"),
    "lr-negative": (_group("lr", -1.0), r"\['lr'\] must be a finite number >= 0"),
    "lr-off-schedule": (_group("lr", 0.5), r"\['lr'\] must be the schedule's lr at this step"),
    "weight-decay-other": (_group("weight_decay", 5.0), r"\['weight_decay'\] must be the run's"),
    "eps-nan": (_group("eps", math.nan), r"\['eps'\] must be the run's 1e-08"),
    "betas-other": (_group("betas", (2.0, 0.5)), r"\['betas'\] must be the run's"),
    "maximize-on": (_group("maximize", True), r"\['maximize'\] must be the run's False"),
    "group-unknown-key": (_group("junk", 1), r"\['junk'\] must be a setting of the run's"),
    "loss-long": (_set("loss", [0.5] * 10**6), r"field loss must be a list of the last 4 "),
    "loss-short": (_set("loss", [0.5]), r"field loss must be a list of the last 4 "),
    "loss-huge": (_set("loss", [1e300] * 4), r"field loss\[0\] must be .* <= 3\.40282e\+38"),
    "step-off-checkpoints": (_step_at(3), r"field step must be a multiple of checkpoint_every"),
    "seconds-huge": (_set("seconds", 1e300), r"field seconds must be .*<= 1e\+09"),
    "exp-avg-1e30": (_moment("exp_avg", 1e30), r"\['exp_avg'\] must be of magnitude <= 1e\+06"),
    "exp-avg-sq-negative": (_moment("exp_avg_sq", -1.0), r"\['exp_avg_sq'\] must be >= 0"),
    "adam-step-huge": (_adam_step(1e9), r"\['step'\] must be a whole number in \[0, 4\]"),
    "adam-step-fraction": (_adam_step(2.5), r"\['step'\] must be a whole number in \[0, 4\]"),
    "adam-step-nan": (_adam_step(math.nan), r"\['step'\] must be finite"),
    "rng-torch-invalid": (_torch_rng(_zero), r"rng\[0\]\['torch'\] must be a torch generator"),
    "rng-torch-nan-normal": (_torch_rng(_nan_normal), r"must be a state with finite normal"),
    "rng-python-version": (_python("version", 2), r"\['version'\] must be an integer in \[3, 3\]"),
    "rng-python-index": (_python("state", [0] * 624 + [9999]), r"\['state'\] must be 625 32-bit"),
    "format-tensor": (_set("format", torch.tensor([2, 2])), r"has format tensor"),
    "config-nested": (_nested, r"field config must be a JSON object"),
}


def test_the_untouched_checkpoint_loads(saved: Path, tmp_path: Path) -> None:
    path = tmp_path / "rope.pt"
    path.write_bytes(saved.read_bytes())
    reseal(path, lambda state: None)  # the helper itself changes nothing
    assert path.read_bytes() == saved.read_bytes()
    state = _load(path, saved)
    assert state["step"] == 4 and len(state["loss"]) == 4


@pytest.mark.parametrize("field", list(FIELDS))
def test_a_resealed_field_out_of_range_is_refused(saved: Path, tmp_path: Path, field: str) -> None:
    _refused(saved, tmp_path, *FIELDS[field])


def test_muon_momentum_out_of_range_is_refused(tmp_path: Path) -> None:
    path = killed_run(tmp_path, "muon", 2)

    def change(state: dict[str, Any]) -> None:
        entry = state["optimizer"]["muon"]["state"][0]
        entry["momentum_buffer"] = torch.full_like(entry["momentum_buffer"], -1e30)

    original = tmp_path / "original.pt"
    original.write_bytes(path.read_bytes())
    reseal(path, change)
    with pytest.raises(PosEncError, match=r"\['muon'\]\['state'\]\[0\]\['momentum_buffer'\]"):
        _load(path, original)


def _optimizer_parts(state: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The optimizer state_dicts of a checkpoint: AdamW's alone, or Muon's and AdamW's."""
    opt = state["optimizer"]
    if "muon" in opt:
        return [("optimizer['adamw']", opt["adamw"]), ("optimizer['muon']", opt["muon"])]
    return [("optimizer", opt)]


def _refused(saved: Path, tmp_path: Path, change: Callable[[dict[str, Any]], None], pattern: str):
    path = tmp_path / "rope.pt"
    path.write_bytes(saved.read_bytes())
    reseal(path, change)
    with pytest.raises(PosEncError, match=pattern) as info:
        _load(path, saved)
    message = str(info.value)
    assert "\n" not in message and len(message) < 400 and str(path) in message, message


def _unknown(*path: Any) -> Callable[[dict[str, Any]], None]:
    def change(state: dict[str, Any]) -> None:
        target = state
        for key in path:
            target = target[key]
        target["junk"] = 1

    return change


def _meta_rng(state: dict[str, Any]) -> None:
    state["rng"][0]["torch"] = state["rng"][0]["torch"].to("meta")


# Keys torch or posenc would ignore, and a generator state torch would fail on with a
# TypeError: each one line of PosEncError naming the field.
KEYS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "top-level": (_unknown(), r"is not a posenc checkpoint \(unknown keys \['junk'\]\)"),
    "data": (_unknown("data"), r"field data\['junk'\] must be absent \(not a key of data\)"),
    "rng": (_unknown("rng", 0), r"field rng\[0\]\['junk'\] must be absent"),
    "rng-torch-meta": (_meta_rng, r"rng\[0\]\['torch'\] must be a uint8 .* on the CPU, got 'a t"),
}


@pytest.mark.parametrize("case", list(KEYS))
def test_an_unknown_key_is_refused(saved: Path, tmp_path: Path, case: str) -> None:
    _refused(saved, tmp_path, *KEYS[case])


def _in_part(
    label: str, edit: Callable[[dict[str, Any]], None]
) -> Callable[[dict[str, Any]], None]:
    def change(state: dict[str, Any]) -> None:
        edit(dict(_optimizer_parts(state))[label])

    return change


def _bool_index(part: dict[str, Any]) -> None:
    """Parameter index 1 given as True (which equals 1, and is not an index)."""
    for group in part["param_groups"]:
        group["params"] = [True if i == 1 else i for i in group["params"]]


def _part_cases(state: dict[str, Any]) -> Iterator[tuple[str, Callable[[Any], None], str]]:
    """(what, edit of one optimizer state_dict, the pattern its error matches after the
    part's field name) for every rule an optimizer state_dict is held to."""
    last = max(state["state"])
    yield "unknown-key", lambda part: part.update(junk=1), r"\['junk'\] must be absent"
    yield (
        f"state-{last}-missing",
        lambda part: part["state"].pop(last),
        rf"\['state'\] must be the state of every parameter \(0 to {last}\), got 'no entry {last}'",
    )
    yield (
        "state-key-bool",
        lambda part: part["state"].update({True: part["state"].pop(1)}),
        r"\['state'\]\[True\] must be the state of a parameter",
    )
    yield (
        "state-entry-unknown-key",
        lambda part: part["state"][0].update(junk=torch.zeros(1)),
        r"\['state'\]\[0\]\['junk'\] must be absent",
    )
    yield (
        "params-bool",
        _bool_index,
        r"\['param_groups'\] must be \d groups of the model's parameters \(int indices\)",
    )
    for key in state["param_groups"][0]:
        if key not in ("params", "lr"):
            yield (
                f"group-{key}-missing",
                lambda part, key=key: part["param_groups"][0].pop(key),
                rf"\['param_groups'\]\[0\]\['{key}'\] must be the run's .*, got 'absent'",
            )
    if "step" in state["state"][0]:  # AdamW's
        for what, step in (("bool", torch.tensor(True)), ("shape-1", torch.tensor([4.0]))):
            yield (
                f"step-{what}",
                lambda part, step=step: part["state"][0].update(step=step),
                r"\['state'\]\[0\]\['step'\] must be a one-element float32 or float64 tensor",
            )


def test_every_optimizer_part_is_held_to_exactly_its_keys(saved: Path, tmp_path: Path) -> None:
    """AdamW's state_dict, and with Muon both Muon's and AdamW's: a parameter's state or a
    group setting missing (torch would start it afresh or fill in its default), an unknown
    key, a bool index or a step of another shape or dtype are each refused by name."""
    parts = _optimizer_parts(torch.load(saved, weights_only=True))
    tried = []
    for label, part in parts:
        for what, edit, pattern in _part_cases(part):
            case = tmp_path / f"{len(tried)}"
            case.mkdir()
            tried.append(f"{label}: {what}")
            try:
                _refused(saved, case, _in_part(label, edit), re.escape(label) + pattern)
            except (AssertionError, pytest.fail.Exception) as e:
                raise AssertionError(f"case {tried[-1]}: {e}") from None
    # AdamW: 10 settings, Muon: 7 (the Muon run: both parts)
    assert len(tried) >= (17 if len(parts) == 1 else 29), tried
