"""The rules every field of a checkpoint must meet before a run resumes from it.

:func:`check_fields` checks what the file alone can tell (types, ranges, finite numbers,
generator states); :func:`check_fits` checks the weights and optimizer state against the
model and optimizer they are about to be loaded into. Each broken rule is one line of
:class:`~posenc.PosEncError` naming the checkpoint, the field, the rule and the value.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

import torch

from posenc._errors import PosEncError
from posenc.experiments.optim import MuonAdamW

__all__ = ["KEYS", "check_fields", "check_fits"]

KEYS = ("format", "config", "step", "model", "optimizer", "rng", "data", "seconds", "loss")
_PY_STATE_LEN = len(random.getstate()[1])  # 625 for the Mersenne Twister


def _fail(where: str, field: str, rule: str, value: Any) -> PosEncError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return PosEncError(f"{where} field {field} must be {rule}, got {shown}")


def _int(where: str, field: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(where, field, f"an integer in [{low}, {high}]", value)
    return value


def _finite(where: str, field: str, value: Any, *, low: float = -math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(where, field, "a number", value)
    if not math.isfinite(value) or value < low:
        raise _fail(where, field, f"a finite number >= {low}", value)
    return float(value)


def _tensors(where: str, field: str, value: Any) -> None:
    """Every tensor nested in ``value`` is finite (floating ones) and on no meta device."""
    if isinstance(value, torch.Tensor):
        if value.is_meta:
            raise _fail(where, field, "a tensor with data", "a meta tensor")
        if value.is_floating_point() or value.is_complex():
            if not bool(torch.isfinite(value).all()):
                raise _fail(where, field, "finite", "a tensor holding NaN or inf")
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _tensors(where, f"{field}[{k!r}]", v)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _tensors(where, f"{field}[{i}]", v)


def _rng(where: str, field: str, state: Any) -> None:
    if not isinstance(state, Mapping) or "torch" not in state or "python" not in state:
        raise _fail(where, field, "a dict with 'torch' and 'python' generator states", state)
    cpu = state["torch"]
    reference = torch.get_rng_state()
    if (
        not isinstance(cpu, torch.Tensor)
        or cpu.dtype != torch.uint8
        or cpu.shape != reference.shape
    ):
        raise _fail(
            where, f"{field}['torch']", f"a uint8 tensor of shape {list(reference.shape)}", cpu
        )
    py = state["python"]
    if not isinstance(py, Mapping) or set(py) != {"version", "state", "gauss"}:
        raise _fail(where, f"{field}['python']", "a dict of version, state and gauss", py)
    _int(where, f"{field}['python']['version']", py["version"], 1, 3)
    words = py["state"]
    if (
        not isinstance(words, list)
        or len(words) != _PY_STATE_LEN
        or any(
            isinstance(w, bool) or not isinstance(w, int) or not 0 <= w < 2**32 for w in words[:-1]
        )
        or isinstance(words[-1], bool)
        or not isinstance(words[-1], int)
        or not 0 <= words[-1] <= _PY_STATE_LEN - 1
    ):
        raise _fail(where, f"{field}['python']['state']", f"{_PY_STATE_LEN} 32-bit words", words)
    if py["gauss"] is not None:
        _finite(where, f"{field}['python']['gauss']", py["gauss"])
    if "cuda" in state:
        cuda = state["cuda"]
        if not isinstance(cuda, list) or any(
            not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.ndim != 1 for t in cuda
        ):
            raise _fail(where, f"{field}['cuda']", "a list of uint8 generator states", cuda)


def check_fields(where: str, state: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    """Check every field of a loaded checkpoint ``state`` of the run ``config``."""
    train = config.get("train")
    given = train.get("steps") if isinstance(train, Mapping) else None
    steps: int = given if isinstance(given, int) and not isinstance(given, bool) else 2**62
    step = _int(where, "step", state["step"], 1, steps)
    data = state["data"]
    if not isinstance(data, Mapping) or "next_step" not in data:
        raise _fail(where, "data", "a dict holding next_step", data)
    next_step = _int(where, "data['next_step']", data["next_step"], 1, steps)
    if next_step != step:
        raise _fail(where, "data['next_step']", f"equal to step ({step})", next_step)
    _finite(where, "seconds", state["seconds"], low=0.0)
    loss = state["loss"]
    if not isinstance(loss, list) or not loss:
        raise _fail(where, "loss", "a non-empty list of training losses", loss)
    for i, value in enumerate(loss):
        _finite(where, f"loss[{i}]", value, low=0.0)
    model = state["model"]
    if (
        not isinstance(model, Mapping)
        or not model
        or any(not isinstance(k, str) or not isinstance(v, torch.Tensor) for k, v in model.items())
    ):
        raise _fail(where, "model", "a non-empty dict of parameter names to tensors", model)
    _tensors(where, "model", model)
    train = config.get("train")
    muon = isinstance(train, Mapping) and train.get("optimizer") == "muon"
    opt = state["optimizer"]
    if muon and (not isinstance(opt, Mapping) or sorted(opt) != ["adamw", "muon"]):
        raise _fail(where, "optimizer", "a dict of the 'adamw' and 'muon' states", opt)
    for field, part in _parts(opt) if muon else [("optimizer", opt)]:
        if (
            not isinstance(part, Mapping)
            or not isinstance(part.get("state"), Mapping)
            or not isinstance(part.get("param_groups"), list)
            or any(not isinstance(g, Mapping) for g in part["param_groups"])
        ):
            raise _fail(where, field, "an optimizer state_dict (state, param_groups)", part)
    _tensors(where, "optimizer", opt)
    rng = state["rng"]
    world = config.get("world_size", 1)
    if not isinstance(rng, list) or (isinstance(world, int) and len(rng) != world):
        raise _fail(where, "rng", f"a list of {world} generator states (one per rank)", rng)
    for rank, entry in enumerate(rng):
        _rng(where, f"rng[{rank}]", entry)


def _same_shapes(
    where: str, field: str, saved: Mapping[str, Any], wanted: Mapping[str, torch.Tensor]
) -> None:
    missing = sorted(set(wanted) - set(saved))
    extra = sorted(set(saved) - set(wanted))
    if missing or extra:
        raise _fail(
            where, field, f"the model's entries (missing {missing}, unexpected {extra})", ""
        )
    for name, tensor in wanted.items():
        got = saved[name]
        if got.shape != tensor.shape or got.dtype != tensor.dtype:
            raise _fail(
                where,
                f"{field}[{name!r}]",
                f"a {tensor.dtype} tensor of shape {list(tensor.shape)}",
                f"{got.dtype} {list(got.shape)}",
            )


def _parts(opt: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return [(f"optimizer[{key!r}]", opt[key]) for key in ("adamw", "muon")]


# What each optimizer keeps: numbers in every param group, tensors the shape of the
# parameter in every parameter's state (besides AdamW's one-element step).
_GROUP_NUMBERS = {
    "adamw": ("lr", "weight_decay", "eps"),
    "muon": ("lr", "weight_decay", "eps", "momentum"),
}
_STATE_TENSORS = {"adamw": ("exp_avg", "exp_avg_sq"), "muon": ("momentum_buffer",)}


def check_fits(
    where: str,
    state: Mapping[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | MuonAdamW,
) -> None:
    """The saved weights and optimizer state (AdamW's, or Muon's and AdamW's) fit
    ``model`` and ``optimizer`` exactly."""
    _same_shapes(where, "model", state["model"], model.state_dict())
    if isinstance(optimizer, MuonAdamW):
        saved = state["optimizer"]
        if not isinstance(saved, Mapping) or sorted(saved) != ["adamw", "muon"]:
            raise _fail(where, "optimizer", "a dict of the 'adamw' and 'muon' states", saved)
        _fits(where, "optimizer['adamw']", saved["adamw"], optimizer.adamw, "adamw")
        _fits(where, "optimizer['muon']", saved["muon"], optimizer.muon, "muon")
    else:
        _fits(where, "optimizer", state["optimizer"], optimizer, "adamw")


def _fits(
    where: str, field: str, saved: Mapping[str, Any], optimizer: torch.optim.Optimizer, kind: str
) -> None:
    fresh = optimizer.state_dict()
    groups, wanted = saved["param_groups"], fresh["param_groups"]
    ids = [g.get("params") for g in groups]
    if len(groups) != len(wanted) or ids != [g["params"] for g in wanted]:
        raise _fail(
            where,
            f"{field}['param_groups']",
            f"{len(wanted)} groups of the model's parameters",
            ids,
        )
    for g in groups:
        for key in _GROUP_NUMBERS[kind]:
            value = g.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _fail(where, f"{field}['param_groups'][..][{key!r}]", "a number", value)
        if kind == "adamw" and (
            not isinstance(g.get("betas"), (list, tuple)) or len(g["betas"]) != 2
        ):
            raise _fail(where, f"{field}['param_groups'][..]['betas']", "a pair", g.get("betas"))
    params: dict[Any, torch.Tensor] = {}
    for w, live in zip(wanted, optimizer.param_groups):
        params.update(zip(w["params"], live["params"]))
    for index, entry in saved["state"].items():
        if index not in params or not isinstance(entry, Mapping):
            raise _fail(where, f"{field}['state'][{index!r}]", "the state of a parameter", entry)
        shape = params[index].shape
        for key in _STATE_TENSORS[kind]:
            t = entry.get(key)
            if not isinstance(t, torch.Tensor) or t.shape != shape:
                raise _fail(
                    where,
                    f"{field}['state'][{index}][{key!r}]",
                    f"a tensor of shape {list(shape)}",
                    t,
                )
        if kind == "muon":
            continue
        step = entry.get("step")
        if not isinstance(step, torch.Tensor) or step.numel() != 1:
            raise _fail(where, f"{field}['state'][{index}]['step']", "a one-element tensor", step)
