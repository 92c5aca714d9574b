"""The position maps: their branches and positions against the reference, configs, each
paper's parameter rule, and every bad value refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc.remap import MAP_TYPES, SelfExtend, String, position_map, self_extend_for, string_for

from ._cases import map_params, pair_positions

MAPS = map_params(SelfExtend(2, 4), SelfExtend(3, 4), SelfExtend(1, 5), String(5, 2), String(1, 0))


@pytest.mark.parametrize("pmap", MAPS)
def test_per_pair_positions_equal_the_reference(pmap) -> None:
    q_pos, k_pos = torch.arange(4, 17), torch.arange(17)
    offsets = q_pos[:, None] - k_pos[None, :]
    branch = pmap.branch_at(offsets)
    qp = torch.zeros(offsets.shape, dtype=torch.float64)
    kp = torch.zeros(offsets.shape, dtype=torch.float64)
    for b in range(pmap.branches):
        at = branch == b
        qb = pmap.query_positions_at(b, q_pos).double()[:, None].expand_as(qp)
        kb = pmap.key_positions_at(b, k_pos).double()[None, :].expand_as(kp)
        qp, kp = torch.where(at, qb, qp), torch.where(at, kb, kp)
    want_q, want_k = pair_positions(pmap, q_pos.numpy(), k_pos.numpy())
    seen = (offsets >= 0).numpy()
    np.testing.assert_array_equal(qp.numpy()[seen], want_q[seen])
    np.testing.assert_array_equal(kp.numpy()[seen], want_k[seen])


@given(
    group=st.integers(1, 9),
    window=st.integers(1, 40),
    string=st.booleans(),
    offsets=st.lists(st.integers(0, 10**6), min_size=1, max_size=30),
)
def test_offset_bounds_are_the_branches(group, window, string, offsets) -> None:
    pmap = String(window + group, window) if string else SelfExtend(group, window)
    d = torch.tensor(offsets)
    branch = pmap.branch_at(d)
    for b in range(pmap.branches):
        lo, hi = pmap.offset_bounds(b)
        inside = (d >= lo) & (d <= (hi if hi is not None else d.max()))
        assert torch.equal(branch == b, inside)


@pytest.mark.parametrize(
    ("pmap", "dtype"),
    [
        (SelfExtend(2, 4), torch.int64),
        (SelfExtend(3, 4), torch.float64),
        (String(5, 2), torch.int64),
    ],
    ids=["SE-whole", "SE-fraction", "STRING"],
)
def test_position_dtypes(pmap, dtype) -> None:
    assert pmap.query_positions_at(1, torch.arange(6)).dtype == dtype
    assert pmap.key_positions_at(1, torch.arange(6)).dtype == torch.int64
    p = torch.arange(6)
    assert pmap.query_positions_at(0, p) is p and pmap.key_positions_at(0, p) is p


@pytest.mark.parametrize("pmap", MAPS)
def test_config_round_trip(pmap) -> None:
    config = pmap.to_config()
    assert config["type"] in MAP_TYPES and pmap.kind == "position_map"
    assert position_map(config) == pmap and posenc.position_map(pmap) is pmap


def test_self_extend_for_follows_longlm() -> None:
    # W = L / 4 = 1024; 1024 + (16384 - 1024) / G <= 2048 first holds at G = 16 (15 fails)
    assert self_extend_for(4096, 16384) == SelfExtend(16, 1024)
    assert self_extend_for(4096, 2048) == SelfExtend(1, 1024)  # 2048 <= 2048 at G = 1


@given(trained=st.integers(4, 10**6), target=st.integers(1, 10**7))
def test_self_extend_for_picks_the_smallest_power_of_two(trained: int, target: int) -> None:
    pmap = self_extend_for(trained, target)
    g, w = pmap.group_size, pmap.neighbor_window
    assert w == trained // 4 and g & (g - 1) == 0
    assert w + (target - w) / g <= trained / 2
    assert g == 1 or w + (target - w) / (g // 2) > trained / 2
    pmap.check_trained(trained)


def test_string_for_follows_the_paper() -> None:
    assert string_for(8192, 8192) == String(2730, 128)
    assert string_for(8192, 32768) == String(10922, 128)
    assert string_for(300, 100) == String(100, 50)


@given(trained=st.integers(1, 10**6), target=st.integers(3, 10**7))
def test_string_for_is_a_valid_map(trained: int, target: int) -> None:
    pmap = string_for(trained, target)
    assert pmap.shift == max(trained, target) // 3
    assert pmap.local_window == min(128, pmap.shift // 2) < pmap.shift


# --- bad values ------------------------------------------------------------------------------

BAD_MAPS = [
    (lambda: SelfExtend(0, 4), "group_size"),
    (lambda: SelfExtend(True, 4), "group_size"),
    (lambda: SelfExtend(2.0, 4), "group_size"),
    (lambda: SelfExtend(-2, 4), "group_size"),
    (lambda: SelfExtend(2, 0), "neighbor_window"),
    (lambda: String(0, 0), "shift"),
    (lambda: String(4, 4), "local_window"),
    (lambda: String(4, -1), "local_window"),
    (lambda: SelfExtend(2, 8).check_trained(4), "neighbor_window"),
    (lambda: String(9, 1).check_trained(8), "shift"),
    (lambda: SelfExtend(2, 8).check_trained(0), "trained"),
    (lambda: position_map({"type": "yarn"}), "type"),
    (lambda: position_map({"type": "string", "shift": 4, "window": 1}), "window"),
    (lambda: position_map({"type": "string", "shift": 4}), "local_window"),
    (lambda: position_map("string"), "spec"),
    (lambda: self_extend_for(3, 100), "trained"),
    (lambda: self_extend_for(8, 0), "target"),
    (lambda: string_for(1, 2), "target"),
]


@pytest.mark.parametrize(
    ("call", "name"), BAD_MAPS, ids=[f"{i}-{n}" for i, (_, n) in enumerate(BAD_MAPS)]
)
def test_bad_values_are_refused_by_name(call, name: str) -> None:
    with pytest.raises(posenc.PosEncError, match=rf"\b{name}\b"):
        call()
