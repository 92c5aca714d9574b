"""Crafted checkpoints: a real checkpoint of a tiny run with one field changed, re-sealed
(its SHA-256 recomputed, as anyone who can write the file can), then resumed.

The cases are generated from the checkpoint itself: every leaf of its state (the step, the
config, the losses, the generator states, the optimizer's settings, and one tensor of each
kind of the model and the optimizer) gets the matrix's mutations for its type
(``_mutations``), every dict loses each key in turn and gains an unknown one. A case passes
when loading raises :class:`posenc.PosEncError` naming a part of the field's path, or (where
the mutation's rule allows) loads; never another exception type, never a silent resume of a
value the rule says is bad.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.experiments.test_checkpoint_ranges import _load, killed_run, reseal

from posenc import PosEncError

from ._mutations import mutations

Path_ = tuple[Any, ...]
Change = Callable[[dict[str, Any]], None]


def _saved_state(folder: Path) -> tuple[Path, dict[str, Any]]:
    path = killed_run(folder, "adamw", 5)
    return path, torch.load(path, weights_only=True)


# Of the model's weights and the optimizer's per-parameter states, one of each kind is
# mutated (the others are checked by the same code).
_SAMPLED = {("model",): 2, ("optimizer", "state"): 1, ("optimizer", "param_groups"): 1}


def _leaves(value: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    if isinstance(value, dict):
        items = list(value.items())
        keep = _SAMPLED.get(path)
        yield from ((path, value),)  # the dict itself (keys removed and added)
        for key, item in items[:keep] if keep else items:
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list) and value and len(value) <= 16:
        for i, item in enumerate(value[: _SAMPLED.get(path, len(value))]):
            yield from _leaves(item, (*path, i))
    else:
        yield path, value


def _get(state: Any, path: Path_) -> Any:
    for key in path:
        state = state[key]
    return state


def _setter(path: Path_, make: Callable[[], Any]) -> Change:
    def change(state: dict[str, Any]) -> None:
        _get(state, path[:-1])[path[-1]] = make()

    return change


def _dict_cases(path: Path_, value: dict[str, Any]) -> Iterator[tuple[str, Change, str]]:
    for key in value:

        def drop(state: dict[str, Any], key: Any = key) -> None:
            del _get(state, path)[key]

        yield f"missing_{key}", drop, "raise"

    def extra(state: dict[str, Any]) -> None:
        _get(state, path)["no_such_key"] = 1

    yield "extra_key", extra, "raise"


def _cases() -> Iterator[Any]:
    import tempfile

    _, state = _saved_state(Path(tempfile.mkdtemp()))
    for path, value in _leaves(state):
        where = "/".join(map(str, path)) or "state"
        if isinstance(value, dict):
            found = list(_dict_cases(path, value))
        elif value is None:
            found = [("type_str", _setter(path, lambda: "bogus"), "raise")]
        else:
            name = next((p for p in reversed(path) if isinstance(p, str)), "state")
            found = [(k, _setter(path, m), r) for k, m, r in mutations(name, value)]
            found = [f for f in found if f[0] not in ("device_meta", "shape_ndim_plus")] + [
                (k, _setter(path, m), "raise")
                for k, m, _ in mutations(name, value)
                if k in ("device_meta", "shape_ndim_plus")
            ]
        for kind, change, rule in found:
            yield pytest.param(path, change, rule, id=f"{where}-{kind}")


CASES = list(_cases())


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _saved_state(tmp_path_factory.mktemp("run"))[0]


def _names(message: str, path: Path_) -> bool:
    names = [str(p) for p in path if isinstance(p, str)] or ["checkpoint"]
    return any(
        re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", message) for n in names
    )


@pytest.mark.parametrize(("path", "change", "rule"), CASES)
def test_a_crafted_field(saved: Path, tmp_path: Path, path: Path_, change: Change, rule: str):
    crafted = tmp_path / "rope.pt"
    crafted.write_bytes(saved.read_bytes())
    reseal(crafted, change)
    try:
        _load(crafted, saved)
    except PosEncError as e:
        assert _names(str(e), path) or "no_such_key" in str(e), f"message names no field: {e}"
        return
    except Exception as e:
        pytest.fail(f"{type(e).__name__} instead of PosEncError: {str(e)[:300]}")
    assert rule != "raise", f"a crafted {'/'.join(map(str, path))} was resumed"
