"""posenc._fields: the one vocabulary of field rules, and its one message shape."""

from __future__ import annotations

import math

import pytest

from posenc import PosEncError
from posenc._fields import (
    At,
    boolean,
    choice,
    integer,
    mapping,
    number,
    sequence,
    shown,
    string,
)


def test_a_field_is_named_by_its_record_and_its_path() -> None:
    at = At("checkpoint 'run.pt'")
    assert str(at) == "checkpoint 'run.pt'"
    assert str(at["rng"][0]["python"]) == "checkpoint 'run.pt' field rng[0]['python']"
    assert str(At(path="labels")[2]) == "labels[2]"
    assert at["optimizer"]["state"].owner == "optimizer['state']"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: integer(At("r")["n"], True, 1), "r field n must be an integer >= 1, got True"),
        (lambda: integer("n", 11, 1, 10), "n must be an integer in [1, 10], got 11"),
        (lambda: integer("n", 1.0), "n must be an integer, got 1.0"),
        (lambda: number("x", math.inf), "x must be a finite number, got inf"),
        (
            lambda: number("x", -1.0, 0.0, 9.0),
            "x must be a finite number >= 0.0 and <= 9, got -1.0",
        ),
        (lambda: number("x", "1", null=True), "x must be a number or None, got '1'"),
        (lambda: string("s", "", "a run label", empty=False), "s must be a run label, got ''"),
        (lambda: boolean("b", 1), "b must be True or False, got 1"),
        (lambda: choice("c", "z", ("a", "b")), "c must be one of 'a', 'b', got 'z'"),
        (lambda: sequence("l", (1,)), "l must be a list, got (1,)"),
        (lambda: sequence("l", [], low=1), "l must be a list, got []"),
        (
            lambda: mapping(At("r"), {}, required=("k",)),
            "r field k must be present (a key of r), got 'absent'",
        ),
        (
            lambda: mapping(At("r")["d"], {"k": 1, "j": 2}, allowed=("k",)),
            "r field d['j'] must be absent (not a key of d), got 2",
        ),
        (lambda: mapping(At("r"), [1]), "r must be an object, got [1]"),
    ],
)
def test_every_rule_has_the_one_message_shape(call, message) -> None:
    with pytest.raises(PosEncError) as info:
        call()
    assert str(info.value) == message


def test_a_rule_returns_what_it_checked() -> None:
    assert integer("n", 3, 1, 10) == 3
    assert math.isnan(number("x", math.nan, finite=False))
    assert number("x", None, null=True) is None
    assert mapping(At("r"), {"k": 1}, required=("k",), allowed=("k",)) == {"k": 1}
    assert sequence("l", (1, 2), types=(list, tuple), low=2, high=2) == (1, 2)


def test_a_long_value_is_cut() -> None:
    assert shown("x" * 200).endswith("...") and len(shown("x" * 200)) == 80


def test_a_tensor_is_shown_by_shape_and_dtype_not_its_values():
    import torch

    from posenc import _fields

    with pytest.raises(PosEncError) as info:
        _fields.integer(_fields.At("checkpoint 'x.pt'", "step"), torch.arange(3), 0, 10)
    assert "tensor(" not in str(info.value)
    assert "a tensor of shape (3,) and dtype torch.int64" in str(info.value)
