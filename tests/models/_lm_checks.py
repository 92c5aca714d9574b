"""The checks every causal TinyTransformer must pass, shared by the model tests of each
encoding: a KV cache (plain and left-padded) equals the full pass, and cached generation
equals recomputing the whole sequence at every step."""

from __future__ import annotations

import json
from collections.abc import Callable

import torch
import torch.nn.functional as F

import posenc
from posenc.models import KVCache, TinyTransformer


def cache_equals_full_pass(
    model: TinyTransformer, t: torch.Tensor, cuts: tuple[int, ...] = (4, 5, 9)
) -> tuple[torch.Tensor, KVCache]:
    """The logits of ``t`` fed in pieces ending at ``cuts`` through one cache equal those of
    one full pass (whole tensors); returns the full logits and the cache."""
    with torch.no_grad():
        full = model(t)
        cache = KVCache()
        parts = [model(t[:, a:b], cache=cache) for a, b in zip((0, *cuts), cuts)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)
    return full, cache


def left_padded_cache_equals_full_pass(
    model: TinyTransformer, t: torch.Tensor, *, pad: int = 3, prompt: int = 5
) -> tuple[torch.Tensor, KVCache]:
    """Row 1 left-padded by ``pad`` tokens: a prompt of ``prompt`` tokens then one token at a
    time through the cache (positions from the mask, continued per row) equals the full
    pass; returns the positions and the cache."""
    s = t.shape[1]
    mask = torch.ones(2, s, dtype=torch.bool)
    mask[1, :pad] = False
    pos = posenc.positions.from_attention_mask(mask)
    with torch.no_grad():
        full = model(t, pos, attn_mask=mask)
        cache = KVCache()
        first = model(t[:, :prompt], pos[:, :prompt], attn_mask=mask[:, :prompt], cache=cache)
        rest = [model(t[:, i : i + 1], cache=cache) for i in range(prompt, s)]
    torch.testing.assert_close(torch.cat([first, *rest], dim=1), full, atol=1e-5, rtol=1e-5)
    return pos, cache


def generate_cache_equals_recompute(model: TinyTransformer, t: torch.Tensor, n: int = 6) -> None:
    """Greedy generation with the cache equals generation recomputing every step, with and
    without a left-padded prompt, and keeps the prompt."""
    b, s = t.shape
    mask = torch.ones(b, s, dtype=torch.long)
    mask[1, : s // 2] = 0
    for kw in ({}, {"attn_mask": mask}):
        cached = model.generate(t, n, **kw)
        recomputed = model.generate(t, n, use_cache=False, **kw)
        assert cached.shape == (b, s + n)
        assert torch.equal(cached, recomputed)
        assert torch.equal(cached[:, :s], t)


def config_round_trip(model: TinyTransformer, t: torch.Tensor) -> dict:
    """The model's config survives JSON and builds a twin that, given the model's weights
    (strictly), computes the same logits bit for bit; returns the JSON config."""
    config = json.loads(json.dumps(model.to_config()))
    twin = TinyTransformer.from_config(config)
    assert twin.to_config() == model.to_config()
    twin.load_state_dict(model.state_dict(), strict=True)
    twin.eval()
    with torch.no_grad():
        assert torch.equal(twin(t), model.eval()(t))
    return config


def copy_loss(model: TinyTransformer, batch: int = 16, half: int = 6) -> Callable[[], torch.Tensor]:
    """The loss of a copy task (``half`` tokens, a separator, the same tokens again) on
    the copied half: a task a model learns in a few dozen steps only through attention."""
    first = torch.randint(1, 8, (batch, half))
    data = torch.cat([first, torch.zeros(batch, 1, dtype=torch.long), first], dim=1)

    def loss() -> torch.Tensor:
        logits = model(data[:, :-1])[:, half:]  # predict the copy
        return F.cross_entropy(logits.flatten(0, 1), data[:, half + 1 :].flatten())

    return loss


def trains(
    loss: Callable[[], torch.Tensor],
    opt: torch.optim.Optimizer,
    steps: int,
    *,
    after_first_backward: Callable[[], None] | None = None,
) -> None:
    """``steps`` optimizer steps lower ``loss()`` by at least 20%; ``after_first_backward``
    (checks on the first gradients) runs once, before the first step."""
    start = loss().item()
    for step in range(steps):
        opt.zero_grad()
        loss().backward()
        if step == 0 and after_first_backward is not None:
            after_first_backward()
        opt.step()
    assert loss().item() < 0.8 * start
