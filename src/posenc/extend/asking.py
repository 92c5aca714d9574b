"""Answering a haystack's probes (:mod:`posenc.extend.probes`) from one prefill.

The haystack is prefilled once, with its KV cache kept and logits only at its last
position (no ``[s, vocab]`` tensor). Each probe then continues from that cache: its
question, then greedy decoding, one token at a time, up to ``max_new_tokens``, stopping at
an end-of-sequence token or at a newline once something was written. The cache is then
put back to the haystack's state for the next probe: ``DynamicCache.crop`` after
``activate_past_recording`` (transformers 5: a sliding-window layer keeps the states it
would drop until the crop, so it rolls back too), or, where the cache cannot record its
past (older transformers), a ``copy.deepcopy`` of the haystack's cache per probe.

Positions continue from the cache: the question starts at the haystack's length. Nothing
here builds a ``[s, s]`` tensor: transformers' SDPA path passes no mask for a causal
prefill without padding, and a question's mask is ``[q, s + q]``.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from posenc.extend.probes import Haystack, Probe, score

__all__ = ["answer_haystack"]


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def _cache_key(model: Any) -> str:
    """The name ``model.forward`` takes the KV cache by: ``cache`` (transformers 5.24 on)
    or ``past_key_values`` (before)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _stops(model: Any, tokenizer: Any) -> set[int]:
    """The end-of-sequence ids: the tokenizer's and the generation config's (which may
    list several, as instruction-tuned models do)."""
    ids = {tokenizer.eos_token_id}
    config = getattr(model, "generation_config", None)
    extra = getattr(config, "eos_token_id", None)
    ids.update(extra if isinstance(extra, (list, tuple)) else [extra])
    return {int(i) for i in ids if i is not None}


def _records_past(cache: Any) -> bool:
    """Whether ``cache`` can keep what a sliding window drops until it is cropped
    (transformers 5's ``activate_past_recording``)."""
    return hasattr(cache, "activate_past_recording") and hasattr(cache, "crop")


def _rollback(cache: Any, length: int) -> Callable[[], Any]:
    """A function giving, at each call, a cache in the state of ``cache`` (``length``
    tokens): ``cache`` itself, cropped back to ``length`` (past recording on), or a deep
    copy of it where it cannot record its past."""
    if not _records_past(cache):
        return lambda: copy.deepcopy(cache)
    cache.activate_past_recording()

    def crop() -> Any:
        grown = cache.get_seq_length() - length
        if grown:
            cache.crop(-grown)
        return cache

    return crop


def _finished(tokenizer: Any, produced: list[int]) -> bool:
    """Whether the text of ``produced`` holds a newline after something was written."""
    return "\n" in str(tokenizer.decode(produced, skip_special_tokens=True)).lstrip()


def _out_cache(out: Any, key: str) -> Any:
    cache = getattr(out, key, None)
    return out.past_key_values if cache is None else cache


def _decode(
    model: Any,
    tokenizer: Any,
    cache: Any,
    start: int,
    probe: Probe,
    stops: set[int],
    keep: list[torch.Tensor] | None,
) -> list[int]:
    """Feed ``probe.question`` on ``cache`` (``start`` tokens), then greedy-decode until an
    end-of-sequence token (left out), a newline after some text, or ``max_new_tokens``:
    the tokens produced; each step's next-token logits (``[vocab]``, in the model's
    dtype, on the CPU) appended to ``keep`` where it is given."""
    device = _device(model)
    key = _cache_key(model)
    takes_position = "cache_position" in inspect.signature(model.forward).parameters
    step_ids, position, produced = list(probe.question), start, []
    for _ in range(probe.max_new_tokens):
        positions = torch.arange(position, position + len(step_ids), device=device)[None]
        extra = {"cache_position": positions[0]} if takes_position else {}
        out = model(
            input_ids=torch.tensor([step_ids], device=device),
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{key: cache},
            **extra,
        )
        cache = _out_cache(out, key)
        logits = out.logits[0, -1]
        if keep is not None:
            keep.append(logits.cpu())
        token = int(logits.argmax())
        if token in stops:
            break
        produced.append(token)
        position += len(step_ids)
        if _finished(tokenizer, produced):
            break
        step_ids = [token]
    return produced


def _text(tokenizer: Any, produced: list[int]) -> str:
    """The answer's text, up to the first newline after something was written."""
    text = str(tokenizer.decode(produced, skip_special_tokens=True))
    lead = len(text) - len(text.lstrip())
    cut = text.find("\n", lead)
    return text if cut < 0 else text[:cut]


@torch.inference_mode()
def answers(
    model: Any,
    tokenizer: Any,
    haystack: Haystack,
    *,
    keep_logits: bool = False,
    cache: Any = None,
) -> Iterator[tuple[dict[str, Any], list[torch.Tensor]]]:
    """Each probe's record (as :func:`answer_haystack`) with, where ``keep_logits``, its
    next-token logits at the answer position and at each greedy step after; from
    ``cache`` where given (the KV cache of a forward of exactly ``haystack.ids``, as
    :func:`posenc.extend.measure.prefill` returns it), else from a prefill of its own."""
    key = _cache_key(model)
    if cache is None:
        x = torch.tensor([haystack.ids], device=_device(model))
        cache = _out_cache(model(input_ids=x, use_cache=True, logits_to_keep=1), key)
    fresh = _rollback(cache, len(haystack.ids))
    stops = _stops(model, tokenizer)
    for probe in haystack.probes:
        logits: list[torch.Tensor] = []
        kept = logits if keep_logits else None
        produced = _decode(model, tokenizer, fresh(), len(haystack.ids), probe, stops, kept)
        output = _text(tokenizer, produced)
        row = {
            "id": probe.id,
            "task": probe.task,
            "haystack": haystack.index,
            "depth": probe.depth,
            "answers": list(probe.answers),
            "output": output,
            "score": score(output, probe.answers),
        }
        yield row, logits


def answer_haystack(
    model: Any, tokenizer: Any, haystack: Haystack, cache: Any = None
) -> list[dict[str, Any]]:
    """The records of ``haystack``'s probes, answered by ``model`` from one prefill of the
    haystack (``cache``, where the caller ran it: :func:`posenc.extend.measure.prefill`):
    ``{"id", "task", "haystack", "depth", "answers", "output", "score"}`` each, ``output``
    the text greedy decoding wrote (up to its first newline after some text)."""
    return [row for row, _ in answers(model, tokenizer, haystack, cache=cache)]
