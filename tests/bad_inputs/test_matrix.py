"""The bad-input matrix: every public callable and module method (``_targets.TARGETS``) x every
mutation kind that applies to each of its arguments (``_mutations``), one argument at a time.

A case passes when the call raises :class:`posenc.PosEncError` whose message names the
argument, or (where its rule allows) returns a correct result: finite from finite input, on
the meta device only from meta input, the same with an aliased argument as with a copy. Other
exception types, silent accepts of a bad value and calls past the time guard fail. A case's
id is ``target-argument-mutation``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import signal
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import posenc

from . import (
    _targets_conformance,  # noqa: F401  (the conformance check's)
    _targets_more,  # noqa: F401  (appends its targets to TARGETS)
)
from ._mutations import KEY_NAMES, mutations
from ._targets import TARGETS, Target

TIME_LIMIT_S = 10.0  # one case; a hang (a Python loop over a huge size) trips it

# Names a message may use for an argument (the positional `spec` is "the encoding").
ALIASES = {
    "spec": ("encoding", "build"),
    "encodings": ("encoding",),
    "new_len_or_grid": ("new_len", "grid", "size"),
    "rope_scaling": ("scaling",),
    "adapter_or_adapters": ("adapter", "adapters"),  # conformance.check's first argument
}


class Hang(Exception):
    pass


def _alarm(signum, frame):  # pragma: no cover - only on a hang
    raise Hang(f"took more than {TIME_LIMIT_S} s")


def _call(target: Target, fn, args: dict[str, Any]) -> Any:
    pos = [args.pop(n) for n in target.positional]
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*pos, **args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _names(message: str, name: str) -> bool:
    """Whether ``message`` names ``name`` as a word of its own: ``dim`` is not named by
    ``head_dim``, nor ``num_heads`` by ``heads`` (a message naming a sibling is vague)."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message) is not None


def _leaves(value: Any, depth: int = 0) -> Iterator[Any]:
    """Tensors and floats inside a result (tuples, dicts, dataclasses, modules)."""
    if depth > 6:
        return
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, float):
        yield torch.tensor(value, dtype=torch.float64)  # 1e300 is finite
    elif isinstance(value, torch.nn.Module):
        yield from (t.detach() for t in value.parameters())
        yield from value.buffers()
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _leaves(v, depth + 1)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v, depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _leaves(getattr(value, f.name), depth + 1)


def _nonfinite(value: Any) -> set[str]:
    """Which of NaN, +inf and -inf a result holds (values on the meta device count as none)."""
    found: set[str] = set()
    for t in _leaves(value):
        if t.device.type == "meta" or not (t.is_floating_point() or t.is_complex()):
            continue
        t = torch.view_as_real(t) if t.is_complex() else t
        if bool(torch.isnan(t).any()):
            found.add("nan")
        if bool((t == math.inf).any()):
            found.add("+inf")
        if bool((t == -math.inf).any()):
            found.add("-inf")
    return found


def _close(value: Any) -> None:
    if type(value).__name__ == "Figure":
        import matplotlib.pyplot as plt

        plt.close(value)


_BASELINE: dict[str, set[str]] = {}


def _baseline(target: Target) -> tuple[Any, set[str]]:
    torch.manual_seed(0)
    fn, args = target.make()
    result = _call(target, fn, args)
    _BASELINE[target.name] = _nonfinite(result)
    return result, _BASELINE[target.name]


def _equal(a: Any, b: Any) -> bool:
    la, lb = list(_leaves(a)), list(_leaves(b))
    return len(la) == len(lb) and all(
        x.shape == y.shape and torch.equal(x.nan_to_num(), y.nan_to_num()) for x, y in zip(la, lb)
    )


def _aliases(args: dict[str, Any], skip: frozenset[str]) -> Iterator[tuple[str, str]]:
    tensors = [(n, v) for n, v in args.items() if isinstance(v, torch.Tensor) and n not in skip]
    for i, (a, x) in enumerate(tensors):
        for b, y in tensors[i + 1 :]:
            if x.shape == y.shape and x.dtype == y.dtype:
                yield a, b


def _cases() -> Iterator[Any]:
    for target in TARGETS:
        torch.manual_seed(0)
        _, args = target.make()
        for name, value in args.items():
            if name in target.fixed:
                continue
            for kind, make, rule in mutations(name, value):
                yield pytest.param(
                    target, name, kind, make, rule, id=f"{target.name}-{name}-{kind}"
                )
        for a, b in _aliases(args, target.fixed):
            yield pytest.param(
                target, b, f"alias_{a}", a, "alias", id=f"{target.name}-{b}-alias_{a}"
            )
        if _module_of(_) is not None:  # a module's method: the module itself on meta
            yield pytest.param(
                target, "self", "device_meta", None, "module_meta", id=f"{target.name}-self-meta"
            )


def _module_of(fn: Any) -> torch.nn.Module | None:
    """The module a target calls (itself, or the one its bound method belongs to)."""
    owner = getattr(fn, "__self__", fn)
    return owner if isinstance(owner, torch.nn.Module) else None


CASES = list(_cases())


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_valid_call(target: Target) -> None:
    """Every valid call of the table works and gives no NaN / +inf."""
    result, found = _baseline(target)
    _close(result)
    assert not found & {"nan", "+inf"}, f"{target.name}: valid call gives {found}"


@pytest.mark.parametrize(("target", "name", "kind", "make", "rule"), CASES)
def test_bad_input(target: Target, name: str, kind: str, make: Any, rule: str) -> None:
    if target.name not in _BASELINE:
        _close(_baseline(target)[0])
    allowed = _BASELINE[target.name]
    torch.manual_seed(0)
    fn, args = target.make()
    expected = None
    if rule == "module_meta":  # the same inputs; the module's tensors moved to meta
        torch.manual_seed(0)
        fn2, args2 = target.make()
        expected = _call(target, fn2, args2)
        module = _module_of(fn)
        assert module is not None
        module.to("meta")
    elif rule == "alias":
        torch.manual_seed(0)
        fn2, args2 = target.make()
        args2[name] = args2[make].clone()
        expected = _call(target, fn2, args2)
        args[name] = args[make]
    else:
        args[name] = make()
    try:
        result = _call(target, fn, args)
    except posenc.PosEncError as e:
        names = ("meta",) if rule == "module_meta" else (name, *ALIASES.get(name, ()))
        if kind in KEY_NAMES:  # a config's key: the message names the key
            names = (KEY_NAMES[kind],)
        elif kind == "value_unknown_key":  # or the key it does not know
            names = (*names, "no_such_key")
        assert any(_names(str(e), n) for n in names), f"message does not name {names[0]!r}: {e}"
        return
    except Hang as e:
        pytest.fail(f"hang: {e}")
    except Exception as e:
        pytest.fail(f"{type(e).__name__} instead of PosEncError: {str(e)[:300]}")
    try:
        if rule == "raise":
            pytest.fail(f"silently accepted {kind} for {name!r}")
        if rule == "meta":
            on = {t.device.type for t in _leaves(result) if isinstance(t, torch.Tensor)}
            assert on <= {"meta"} or not on or isinstance(result, torch.nn.Module), (
                f"meta input gave tensors on {on}"
            )
            return
        if rule == "module_meta":
            on = {t.device.type for t in _leaves(result) if isinstance(t, torch.Tensor)}
            if on == {"meta"}:
                return
            assert _equal(result, expected), "a module on the meta device returns other values"
        if rule == "alias":
            assert _equal(result, expected), "an aliased argument changes the result"
        if rule != "nonfinite":
            bad = _nonfinite(result) - allowed
            assert not bad, f"{kind} for {name!r} gives {sorted(bad)} from finite input"
    finally:
        _close(result)
        _close(expected)
