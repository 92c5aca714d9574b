"""The rotary room reads posenc's spelling only: another library's reaches it through the one
hook of ``posenc.rotary.scalings.foreign``, which importing ``posenc.rotary`` fills with
``posenc.integrations.spelling``'s reader (the package's ``_lazy.after_import`` hook). Without it a transformers dict is refused by name.
A scaling type that is no string is one ``PosEncError`` naming the key, in either spelling.
The names of the old ``posenc.rotary._spelling`` work for one release, with a warning.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import posenc
from posenc import PosEncError, RotaryEmbedding, build
from posenc.integrations import spelling
from posenc.integrations.transformers import scaling_from_transformers
from posenc.rotary.frequencies import parse_scaling
from posenc.rotary.scalings import foreign


@pytest.fixture
def no_reader() -> Iterator[None]:
    previous = foreign.set_foreign_reader(None)
    try:
        yield
    finally:
        foreign.set_foreign_reader(previous)


def test_import_posenc_installs_the_integrations_reader() -> None:
    previous = foreign.set_foreign_reader(None)
    foreign.set_foreign_reader(previous)
    assert previous is spelling.read_transformers


def test_without_the_reader_transformers_spelling_is_refused(no_reader: None) -> None:
    theirs = {"rope_type": "linear", "factor": 2.0}
    with pytest.raises(PosEncError, match="scaling_from_transformers") as info:
        RotaryEmbedding(8, scaling=theirs)
    assert "must hold a 'type' key" in str(info.value)
    ours = RotaryEmbedding(8, scaling={"type": "linear", "factor": 2.0})  # posenc's: as ever
    assert ours.scaling == scaling_from_transformers(theirs)


def test_the_reader_answers_none_for_posenc_spelling() -> None:
    given = foreign.Given("test", 10000.0)
    assert foreign.read_foreign({"type": "linear", "factor": 2.0}, given) is None
    assert foreign.read_foreign(None, given) is None
    assert foreign.read_foreign({"rope_type": "linear", "factor": 2.0}, given) == {
        "type": "linear",
        "factor": 2.0,
    }


# --- a scaling type that is no string ---------------------------------------------------------

_NOT_STRINGS = {
    "list": ["linear"],
    "tuple": ("yarn",),
    "int": 3,
    "float": 2.0,
    "bool": True,
    "dict": {"type": "linear"},
    "bytes": b"linear",
    "tensor": torch.tensor([1, 2]),
}
# id -> (a call taking a scaling dict, the type keys it reads)
_CALLS: dict[str, tuple[Callable[[dict[str, Any]], Any], tuple[str, ...]]] = {
    "RotaryEmbedding": (lambda s: RotaryEmbedding(8, scaling=s), ("type", "rope_type")),
    "build": (lambda s: build("rope", head_dim=8, scaling=s), ("type", "rope_type")),
    "parse_scaling": (parse_scaling, ("type",)),
    "scaling_from_transformers": (scaling_from_transformers, ("type", "rope_type")),
    "rope_frequencies": (lambda s: posenc.rope_frequencies(8, scaling=s), ("type", "rope_type")),
}
_TYPE_CASES = [
    pytest.param(call, key, value, id=f"{call}-{key}-{kind}")
    for call, (_, keys) in _CALLS.items()
    for key in keys
    for kind, value in _NOT_STRINGS.items()
]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(("call", "key", "value"), _TYPE_CASES)
def test_a_scaling_type_that_is_no_string_is_named(call: str, key: str, value: Any) -> None:
    fn, _ = _CALLS[call]
    with pytest.raises(PosEncError) as info:
        fn({key: value, "factor": 2.0})
    message = str(info.value)
    assert f"scaling[{key!r}] must be a string, not {type(value).__name__}" in message
    assert message.startswith("scaling type must be one of 'default', 'linear'")
    assert "tensor(" not in message


def test_the_messages_in_full() -> None:
    with pytest.raises(PosEncError) as info:
        RotaryEmbedding(8, scaling={"type": ["linear"]})
    assert str(info.value) == (
        "scaling type must be one of 'default', 'linear', 'llama3', 'longrope', 'ntk', "
        "'dynamic', 'proportional', 'yarn', got ['linear'] (scaling['type'] must be a string, "
        "not list)"
    )
    with pytest.raises(PosEncError) as info:
        RotaryEmbedding(8, scaling={"rope_type": "what"})
    assert str(info.value).endswith("got 'what' (scaling['rope_type'])")


# --- the old module ------------------------------------------------------------------------------

_OLD_NAMES = importlib.import_module("posenc.rotary._spelling")._NAMES  # the shim's own list


@pytest.mark.parametrize("name", _OLD_NAMES)
def test_old_names_moved_with_a_warning(name: str) -> None:
    old = importlib.import_module("posenc.rotary._spelling")
    with pytest.warns(DeprecationWarning, match=f"moved to posenc.integrations.spelling.{name}"):
        value = getattr(old, name)
    assert value is getattr(spelling, name)


def test_old_module_has_no_other_names() -> None:
    old = importlib.import_module("posenc.rotary._spelling")
    with pytest.raises(AttributeError):
        old.read_transformers  # noqa: B018
