"""Copies of a class's ``forward`` that read other globals, for :func:`~._hf_patch.patch`.

A transformers attention's ``forward`` finds ``apply_rotary_pos_emb`` in its modeling
module's globals. :func:`rebuild_forward` makes a copy of it whose globals are another dict
(a copy of the module's with posenc's apply functions), so one model's layers can use
posenc while the class, the module and every other model are untouched. A decorated
``forward`` (``@deprecate_kwarg``, ...) is rebuilt decorator by decorator: each wrapper's
copy holds, in its closure, the copy of the function it wraps.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

from posenc._errors import PosEncError

__all__ = ["forward_chain", "globals_copy", "rebuild_forward"]


def _copy_function(fn: types.FunctionType, globals_: dict[str, Any], closure: Any) -> Any:
    new = types.FunctionType(fn.__code__, globals_, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__dict__.update(fn.__dict__)
    new.__qualname__, new.__module__, new.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    new.__annotations__ = dict(fn.__annotations__)
    return new


def _cell_is(cell: Any, value: Any) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


def forward_chain(cls: type, module_dict: dict[str, Any]) -> list[Any] | None:
    """``cls.forward`` and the functions its decorators wrap (``__wrapped__``), down to the
    one defined in the modeling module; ``None`` where the chain leads elsewhere (a forward
    inherited from outside the module, or a wrapper that does not name what it wraps)."""
    chain = [getattr(cls, "forward", None)]
    while isinstance(chain[-1], types.FunctionType):
        if chain[-1].__globals__ is module_dict:
            return chain
        chain.append(getattr(chain[-1], "__wrapped__", None))
    return None


def rebuild_forward(chain: list[Any], globals_: dict[str, Any], model_type: str) -> Any:
    """A copy of ``chain[0]`` (``cls.forward``) whose innermost function reads ``globals_``:
    each decorator's wrapper is rebuilt with its closure cell pointing to the copy."""
    new = _copy_function(chain[-1], globals_, chain[-1].__closure__)
    for wrapper, inner in zip(reversed(chain[:-1]), reversed(chain[1:])):
        closure = wrapper.__closure__ or ()
        if not any(_cell_is(c, inner) for c in closure):
            raise PosEncError(
                f"model_type {model_type!r}: the decorator {wrapper.__qualname__} does not "
                f"hold the function it wraps in its closure; patch cannot rebuild it"
            )
        copied = new
        cells = tuple(types.CellType(copied) if _cell_is(c, inner) else c for c in closure)
        new = _copy_function(wrapper, wrapper.__globals__, cells)
        new.__dict__["__wrapped__"] = copied
    return new


def globals_copy(
    modeling: types.ModuleType, prefix: str, replaced: Callable[[], Mapping[str, Any]]
) -> types.ModuleType:
    """A module holding a copy of ``modeling``'s dict with the globals ``replaced()`` gives
    set in it, made once per modeling module and kept in ``sys.modules`` as ``prefix.<last
    part of modeling's name>`` (``torch.compile`` finds an inlined function's globals by
    their ``__name__``); a reloaded transformers gets a new copy."""
    name = f"{prefix}.{modeling.__name__.rsplit('.', 1)[-1]}"
    cached = sys.modules.get(name)
    if cached is not None and getattr(cached, "__posenc_source__", None) is modeling:
        return cached
    copy = types.ModuleType(name, modeling.__doc__)
    skip = ("__name__", "__spec__", "__loader__")
    vars(copy).update({k: v for k, v in vars(modeling).items() if k not in skip})
    vars(copy).update(replaced())
    vars(copy)["__posenc_source__"] = modeling
    sys.modules[name] = copy
    return copy
