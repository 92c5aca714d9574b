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
from posenc._fields import At, fail, integer, keys_known, number
from posenc.experiments.optim import MuonAdamW
from posenc.experiments.schedule import warmup_cosine

__all__ = ["KEYS", "LOSS_WINDOW", "MAX_SECONDS", "MAX_WEIGHT", "check_fields", "check_fits"]

KEYS = ("format", "config", "step", "model", "optimizer", "rng", "data", "seconds", "loss")
#: A checkpoint's ``loss`` holds the training losses of its last ``min(step, LOSS_WINDOW)``
#: steps (their mean is the run's ``final_loss``).
LOSS_WINDOW = 10
#: The largest magnitude of a weight (and of a gradient average) a checkpoint may hold: far
#: above what a model posenc trains reaches, far below what overflows a float32 forward.
MAX_WEIGHT = 1e6
MAX_SECONDS = 1e9  # 31 years of training
_MAX_LOSS = float(torch.finfo(torch.float32).max)  # a float32 cross-entropy is below it
_PY_VERSION = random.getstate()[0]
_PY_STATE_LEN = len(random.getstate()[1])  # 625 for the Mersenne Twister


def _tensors(at: At, value: Any, limit: float = math.inf) -> None:
    """Every tensor nested in ``value`` is finite (floating ones), of magnitude at most
    ``limit``, and on no meta device."""
    if isinstance(value, torch.Tensor):
        if value.is_meta:
            raise fail(at, "a tensor with data", "a meta tensor")
        if value.is_floating_point() or value.is_complex():
            if not bool(torch.isfinite(value).all()):
                raise fail(at, "finite", "a tensor holding NaN or inf")
            if value.numel() and float(value.abs().max()) > limit:
                largest = float(value.abs().max())
                raise fail(at, f"of magnitude <= {limit:g}", f"an entry of {largest:g}")
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _tensors(at[k], v, limit)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _tensors(at[i], v, limit)


def _torch_state(at: At, cpu: Any) -> None:
    """A CPU generator state torch takes, its cached normal samples finite (tried on a
    generator of its own: the global one is not touched)."""
    reference = torch.get_rng_state()
    if (
        not isinstance(cpu, torch.Tensor)
        or cpu.device.type != "cpu"
        or cpu.dtype != torch.uint8
        or cpu.shape != reference.shape
    ):
        shown = (
            f"a tensor on {cpu.device}" if isinstance(cpu, torch.Tensor) and cpu.is_meta else cpu
        )
        raise fail(at, f"a uint8 tensor of shape {list(reference.shape)} on the CPU", shown)
    try:
        torch.Generator().set_state(cpu.clone())
    except (RuntimeError, TypeError) as e:
        raise fail(at, "a torch generator state", str(e).splitlines()[0]) from None
    normals = cpu[5016:5040].clone().view(torch.float64), cpu[5048:5052].clone().view(torch.float32)
    if not all(bool(torch.isfinite(t).all()) for t in normals):
        raise fail(at, "a state with finite normal samples", "NaN or inf")


def _python_state(at: At, py: Any) -> None:
    """Python's ``random`` state as ``random.getstate()`` gives it, taken by a generator of
    its own."""
    if not isinstance(py, Mapping) or set(py) != {"version", "state", "gauss"}:
        raise fail(at, "a dict of version, state and gauss", py)
    integer(at["version"], py["version"], _PY_VERSION, _PY_VERSION)
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
        raise fail(at["state"], f"{_PY_STATE_LEN} 32-bit words", words)
    if py["gauss"] is not None:
        number(at["gauss"], py["gauss"])
    try:
        random.Random().setstate((py["version"], tuple(words), py["gauss"]))
    except (ValueError, TypeError, OverflowError) as e:
        raise fail(at, "a state random.setstate takes", str(e)) from None


def _rng(at: At, state: Any) -> None:
    if not isinstance(state, Mapping) or "torch" not in state or "python" not in state:
        raise fail(at, "a dict with 'torch' and 'python' generator states", state)
    keys_known(at, state, ("torch", "python", "cuda"))
    _torch_state(at["torch"], state["torch"])
    _python_state(at["python"], state["python"])
    if "cuda" in state:
        cuda = state["cuda"]
        if (
            not isinstance(cuda, list)
            or len(cuda) > 2**10
            or any(
                not isinstance(t, torch.Tensor)
                or t.device.type != "cpu"
                or t.dtype != torch.uint8
                or t.ndim != 1
                or t.numel() > 2**10
                for t in cuda
            )
        ):
            raise fail(at["cuda"], "a list of uint8 generator states", cuda)
        if torch.cuda.is_available():  # set_rng_state restores them here: each must take
            count = torch.cuda.device_count()
            if len(cuda) > count:
                raise fail(at["cuda"], f"at most {count} states", len(cuda))
            for i, t in enumerate(cuda):
                try:
                    torch.Generator(device=f"cuda:{i}").set_state(t.clone())
                except (RuntimeError, TypeError) as e:
                    reason = str(e).splitlines()[0]
                    raise fail(at["cuda"][i], "a CUDA state", reason) from None


def _steps(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], int]:
    train = config.get("train")
    train = train if isinstance(train, Mapping) else {}
    given = train.get("steps")
    return train, given if type(given) is int and given >= 1 else 2**62


def _number(train: Mapping[str, Any], key: str) -> float | None:
    value = train.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _scheduled_lr(train: Mapping[str, Any], step: int) -> float | None:
    """The learning rate the run's schedule set for its step ``step`` (1-based), or None
    when ``train`` does not say enough to know it."""
    peak, ratio = _number(train, "lr"), _number(train, "min_lr_ratio")
    warmup, steps = train.get("warmup"), train.get("steps")
    if peak is None or ratio is None or type(warmup) is not int or type(steps) is not int:
        return None
    try:
        return warmup_cosine(step - 1, steps=steps, peak=peak, warmup=warmup, min_ratio=ratio)
    except PosEncError:
        return None


def _groups_lr(at: At, part: Mapping[str, Any], wanted: float | None) -> None:
    for i, group in enumerate(part["param_groups"]):
        name = at["param_groups"][i]["lr"]
        lr = number(name, group.get("lr"), low=0.0)
        if wanted is not None and not math.isclose(lr, wanted, rel_tol=1e-9, abs_tol=1e-300):
            raise fail(name, f"the schedule's lr at this step ({wanted!r})", lr)


def check_fields(where: str, state: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    """Check every field of a loaded checkpoint ``state`` of the run ``config``: types,
    and ranges the run's settings give (steps, the schedule's lr, the loss window)."""
    at = At(where)
    train, steps = _steps(config)
    step = integer(at["step"], state["step"], 1, steps)
    every = train.get("checkpoint_every")
    if type(every) is int and every > 0 and step != steps and step % every:
        raise fail(at["step"], f"a multiple of checkpoint_every ({every}) or {steps}", step)
    data = state["data"]
    if not isinstance(data, Mapping) or "next_step" not in data:
        raise fail(at["data"], "a dict holding next_step", data)
    keys_known(at["data"], data, ("next_step",))
    next_step = integer(at["data"]["next_step"], data["next_step"], 1, steps)
    if next_step != step:
        raise fail(at["data"]["next_step"], f"equal to step ({step})", next_step)
    number(at["seconds"], state["seconds"], low=0.0, high=MAX_SECONDS)
    loss = state["loss"]
    window = min(step, LOSS_WINDOW)
    if not isinstance(loss, list) or len(loss) != window:
        rule = f"a list of the last {window} training losses (step {step})"
        raise fail(at["loss"], rule, loss if not isinstance(loss, list) else len(loss))
    for i, value in enumerate(loss):
        number(at["loss"][i], value, low=0.0, high=_MAX_LOSS)
    model = state["model"]
    if (
        not isinstance(model, Mapping)
        or not model
        or any(not isinstance(k, str) or not isinstance(v, torch.Tensor) for k, v in model.items())
    ):
        raise fail(at["model"], "a non-empty dict of parameter names to tensors", model)
    _tensors(at["model"], model, MAX_WEIGHT)
    muon = train.get("optimizer") == "muon"
    opt = state["optimizer"]
    if muon and (not isinstance(opt, Mapping) or sorted(opt) != ["adamw", "muon"]):
        raise fail(at["optimizer"], "a dict of the 'adamw' and 'muon' states", opt)
    lr = _scheduled_lr(train, step)
    for part_at, part in _parts(at, opt) if muon else [(at["optimizer"], opt)]:
        if (
            not isinstance(part, Mapping)
            or not isinstance(part.get("state"), Mapping)
            or not isinstance(part.get("param_groups"), list)
            or any(not isinstance(g, Mapping) for g in part["param_groups"])
        ):
            raise fail(part_at, "an optimizer state_dict (state, param_groups)", part)
        keys_known(part_at, part, ("state", "param_groups"))
        _groups_lr(part_at, part, lr)
    _tensors(at["optimizer"], opt)
    rng = state["rng"]
    world = config.get("world_size", 1)
    if not isinstance(rng, list) or (isinstance(world, int) and len(rng) != world):
        raise fail(at["rng"], f"a list of {world} generator states (one per rank)", rng)
    for rank, entry in enumerate(rng):
        _rng(at["rng"][rank], entry)


def _same_shapes(at: At, saved: Mapping[str, Any], wanted: Mapping[str, torch.Tensor]) -> None:
    missing = sorted(set(wanted) - set(saved))
    extra = sorted(set(saved) - set(wanted))
    if missing or extra:
        raise fail(at, f"the model's entries (missing {missing}, unexpected {extra})", "")
    for name, tensor in wanted.items():
        got = saved[name]
        if got.shape != tensor.shape or got.dtype != tensor.dtype:
            raise fail(
                at[name],
                f"a {tensor.dtype} tensor of shape {list(tensor.shape)}",
                f"{got.dtype} {list(got.shape)}",
            )


def _parts(at: At, opt: Mapping[str, Any]) -> list[tuple[At, Any]]:
    return [(at["optimizer"][key], opt[key]) for key in ("adamw", "muon")]


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
    ``model`` and ``optimizer`` exactly: the same shapes, the same settings in every
    param group (none missing), a state for every parameter holding exactly what the
    optimizer keeps, moments of sane magnitude, step counts within the checkpoint's step."""
    step = state.get("step")
    steps = step if type(step) is int and step >= 0 else 0
    at = At(where)
    _same_shapes(at["model"], state["model"], model.state_dict())
    if isinstance(optimizer, MuonAdamW):
        saved = state["optimizer"]
        if not isinstance(saved, Mapping) or sorted(saved) != ["adamw", "muon"]:
            raise fail(at["optimizer"], "a dict of the 'adamw' and 'muon' states", saved)
        _fits(at["optimizer"]["adamw"], saved["adamw"], optimizer.adamw, "adamw", steps)
        _fits(at["optimizer"]["muon"], saved["muon"], optimizer.muon, "muon", steps)
    else:
        _fits(at["optimizer"], state["optimizer"], optimizer, "adamw", steps)


def _fits(
    at: At,
    saved: Mapping[str, Any],
    optimizer: torch.optim.Optimizer,
    kind: str,
    steps: int,
) -> None:
    fresh = optimizer.state_dict()
    groups, wanted = saved["param_groups"], fresh["param_groups"]
    ids = [g.get("params") for g in groups]
    exact = all(isinstance(i, list) and all(type(p) is int for p in i) for i in ids)
    if not exact or len(groups) != len(wanted) or ids != [g["params"] for g in wanted]:
        raise fail(
            at["param_groups"],
            f"{len(wanted)} groups of the model's parameters (int indices)",
            ids,
        )
    for i, (g, w) in enumerate(zip(groups, wanted)):
        _group(at["param_groups"][i], g, w, kind)
    params: dict[Any, torch.Tensor] = {}
    for w, live in zip(wanted, optimizer.param_groups):
        params.update(zip(w["params"], live["params"]))
    for index, entry in saved["state"].items():
        if type(index) is not int or index not in params or not isinstance(entry, Mapping):
            raise fail(at["state"][index], "the state of a parameter", entry)
        _param_state(at["state"][index], entry, params[index], kind, steps)
    # Every parameter has a gradient at every step of a run posenc trains, so each has its
    # state from the first step on; torch would quietly start a missing one afresh.
    missing = [i for i in params if i not in saved["state"]]
    if missing:
        rule = f"the state of every parameter (0 to {len(params) - 1})"
        raise fail(at["state"], rule, f"no entry {missing[0]}")


def _group(at: At, group: Mapping[str, Any], fresh: Mapping[str, Any], kind: str) -> None:
    """A saved param group: its numbers are numbers, and it has exactly the settings the
    run's optimizer has (none missing, none unknown), each but ``lr`` (the schedule's,
    :func:`check_fields`) equal to the run's."""
    # torch would fill in a missing setting with its default, not necessarily the run's
    absent = [key for key in fresh if key not in group and key not in ("params", "lr")]
    if absent:
        raise fail(at[absent[0]], f"the run's {fresh[absent[0]]!r}", "absent")
    for key in _GROUP_NUMBERS[kind]:
        value = group.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail(at[key], "a number", value)
    if kind == "adamw" and (
        not isinstance(group.get("betas"), (list, tuple)) or len(group["betas"]) != 2
    ):
        raise fail(at["betas"], "a pair", group.get("betas"))
    for key, value in group.items():
        if key in ("params", "lr"):
            continue
        if key not in fresh:
            raise fail(at[key], "a setting of the run's optimizer", value)
        same = type(value) is type(fresh[key]) and value == fresh[key]
        if not same or (isinstance(value, float) and math.isnan(value)):
            raise fail(at[key], f"the run's {fresh[key]!r}", value)


def _param_state(
    at: At,
    entry: Mapping[str, Any],
    param: torch.Tensor,
    kind: str,
    steps: int,
) -> None:
    """One parameter's optimizer state: tensors of its shape, of sane magnitude (AdamW's
    second moment not negative), and AdamW's step count within the checkpoint's steps."""
    shape = param.shape
    keys_known(at, entry, (*_STATE_TENSORS[kind], *(("step",) if kind == "adamw" else ())))
    for key in _STATE_TENSORS[kind]:
        t = entry.get(key)
        if not isinstance(t, torch.Tensor) or t.shape != shape or not t.is_floating_point():
            raise fail(at[key], f"a floating tensor of shape {list(shape)}", t)
        squared = key == "exp_avg_sq"
        _tensors(at[key], t, MAX_WEIGHT**2 if squared else MAX_WEIGHT)
        if squared and t.numel() and float(t.min()) < 0:
            raise fail(at[key], ">= 0 (a mean of squares)", float(t.min()))
    if kind == "muon":
        return
    step = entry.get("step")
    if (
        not isinstance(step, torch.Tensor)
        or step.shape != ()
        or step.dtype not in (torch.float32, torch.float64)
    ):  # what torch's AdamW keeps (not capturable, not fused)
        shown = (
            f"a {step.dtype} tensor of shape {list(step.shape)}"
            if isinstance(step, torch.Tensor)
            else step
        )
        raise fail(
            at["step"],
            "a one-element float32 or float64 tensor (shape [])",
            shown,
        )
    value = float(step.item())
    if not (math.isfinite(value) and value == int(value) and 0 <= value <= steps):
        raise fail(at["step"], f"a whole number in [0, {steps}]", value)
