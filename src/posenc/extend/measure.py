"""The measurements of one ``(scaling, length)`` unit: perplexity by position, the
forward pass a haystack's probes continue from, and what it cost (wall time, peak
memory), with the memory estimated first.

Perplexity never builds the ``[length, vocab]`` logits at once: the decoder's last hidden
states are taken once, then the output head, any final soft-capping, and the negative
log-likelihood run over chunks of 1024 positions. Losses are summed in float64. A loss
not counted (a needle's token in a haystack, a position past a shorter text) is NaN, and
every mean skips it.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from posenc._errors import PosEncError
from posenc.extend.data import Document

__all__ = [
    "Cost",
    "bucket_edges",
    "estimate_bytes",
    "measured",
    "nll_by_position",
    "perplexities",
    "prefill",
]

_CHUNK = 1024


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def _logits(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    logits = model.get_output_embeddings()(hidden).float()
    cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def _nll(model: Any, x: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    out = []
    for start in range(0, x.shape[1] - 1, _CHUNK):
        stop = min(start + _CHUNK, x.shape[1] - 1)
        logits = _logits(model, hidden[start:stop])
        out.append(
            torch.nn.functional.cross_entropy(logits, x[0, start + 1 : stop + 1], reduction="none")
        )
    return torch.cat(out).double().cpu()


@torch.inference_mode()
def nll_by_position(model: Any, ids: Sequence[int]) -> torch.Tensor:
    """The negative log-likelihood (float64, nats) of each token ``ids[1:]`` given those
    before it: ``[len(ids) - 1]``, entry ``i`` is the loss of predicting position ``i + 1``."""
    x = torch.tensor([list(ids)], device=_device(model))
    hidden = model.get_decoder()(input_ids=x, use_cache=False).last_hidden_state[0]
    return _nll(model, x, hidden)


@torch.inference_mode()
def prefill(model: Any, ids: Sequence[int]) -> tuple[torch.Tensor, Any]:
    """One forward of ``ids`` that keeps its KV cache: the losses of
    :func:`nll_by_position` and the cache (transformers' ``Cache``) the probes continue
    from, so one pass gives a haystack's perplexity and answers its probes."""
    x = torch.tensor([list(ids)], device=_device(model))
    out = model.get_decoder()(input_ids=x, use_cache=True)
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    return _nll(model, x, out.last_hidden_state[0]), cache


def bucket_edges(length: int, width: int) -> list[int]:
    """Bucket boundaries ``[0, width, 2 width, ..., length]`` of predicted positions."""
    edges = list(range(0, length, width))
    return [*edges, length]


def perplexities(nlls: Sequence[torch.Tensor], length: int, width: int) -> dict[str, Any]:
    """``ppl`` (all predicted tokens), ``ppl_last_quarter`` (positions in the last quarter)
    and ``by_bucket`` (``[{start, stop, ppl}]``) over documents whose losses are ``nlls``
    (each ``[length - 1]``: entry ``i`` predicts position ``i + 1``; NaN: not counted);
    also ``ppl_by_bucket_document``: per document, its perplexity in each bucket (None
    where it counts no token there)."""
    stacked = torch.stack(list(nlls))  # [docs, length - 1]
    positions = torch.arange(1, length, dtype=torch.long)

    def ppl(values: torch.Tensor) -> float | None:
        kept = values[~torch.isnan(values)]
        return math.exp(float(kept.mean())) if kept.numel() else None

    edges = bucket_edges(length, width)
    masks = [
        (a, b, (positions >= a) & (positions < b))
        for a, b in itertools.pairwise(edges)
        if ((positions >= a) & (positions < b)).any()
    ]
    return {
        "ppl": ppl(stacked),
        "ppl_last_quarter": ppl(stacked[:, positions >= length - length // 4]),
        "by_bucket": [{"start": a, "stop": b, "ppl": ppl(stacked[:, m])} for a, b, m in masks],
        "bucket_ppl_by_document": [[ppl(row[m]) for _, _, m in masks] for row in stacked],
    }


def estimate_bytes(model: Any, length: int) -> int:
    """Peak memory of one forward of ``length`` tokens, estimated before it runs: the
    weights, the decoder's activations (a few ``[length, hidden]`` and ``[length,
    intermediate]`` tensors of one layer at a time, kept hidden states), the KV cache a
    haystack's probes continue from, a logits chunk,
    and ``[length, length]`` per head where attention is eager (or masked on a sliding
    window: the mask itself)."""
    config = model.config.get_text_config()
    size = next(model.parameters()).element_size()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    hidden = int(getattr(config, "hidden_size", 0))
    inter = int(getattr(config, "intermediate_size", 4 * hidden) or 4 * hidden)
    heads = int(getattr(config, "num_attention_heads", 1))
    vocab = int(getattr(config, "vocab_size", 0))
    layers = int(getattr(config, "num_hidden_layers", 1) or 1)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // max(heads, 1))
    cache = 2 * layers * kv_heads * head_dim * length * size  # a haystack's KV cache
    acts = length * (12 * hidden + 4 * inter) * size + _CHUNK * vocab * 12 + cache
    square = length * length
    attention = 0
    if getattr(config, "_attn_implementation", "sdpa") == "eager":
        attention = heads * square * 4 * 2
    elif getattr(config, "sliding_window", None) and getattr(config, "layer_types", None):
        attention = square * 2  # the boolean masks, one per layer type
    return int(weights + acts + attention)


def _psutil() -> Any:
    try:
        import psutil
    except ImportError as error:  # pragma: no cover - the extend extra installs it
        raise ImportError(
            "posenc extend measures memory with psutil: pip install 'posenc[extend]'"
        ) from error
    return psutil


def available_bytes(device: torch.device) -> int:
    """The memory free for a forward now: CUDA's free bytes, or the machine's available
    memory (``psutil.virtual_memory().available``)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return int(_psutil().virtual_memory().available)


class Cost:
    """Wall time and peak memory of what runs inside :func:`measured`."""

    seconds: float = 0.0
    peak_bytes: int = 0  # the peak (CUDA: allocated; CPU: the process' resident memory)
    base_bytes: int = 0  # the same on entry (the weights and what else the process holds)


@contextmanager
def measured(device: torch.device) -> Iterator[Cost]:
    """Time the block and track its peak memory: CUDA's peak allocated bytes, or on the
    CPU the process' peak resident memory, sampled every 5 ms by a thread
    (``psutil.Process().memory_info().rss``); both with what was held on entry
    (``base_bytes``)."""
    cost = Cost()
    stop = threading.Event()
    peak = [0]
    sampler: threading.Thread | None = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        process = _psutil().Process()

        def _rss() -> int:
            return int(process.memory_info().rss)

        base = _rss()

        def sample() -> None:
            while not stop.wait(0.005):
                peak[0] = max(peak[0], _rss())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
    start = time.perf_counter()
    try:
        yield cost
    finally:
        cost.seconds = time.perf_counter() - start
        if sampler is not None:
            stop.set()
            sampler.join()
            peak[0] = max(peak[0], _rss())
            cost.peak_bytes = peak[0]
            cost.base_bytes = base
        else:
            cost.peak_bytes = int(torch.cuda.max_memory_allocated(device))
            cost.base_bytes = int(base)


def check_memory(model: Any, length: int, option: str = "--to") -> int:
    """The estimate of :func:`estimate_bytes`; refused (``PosEncError`` naming ``option``)
    when it exceeds 90% of the memory available now."""
    need = estimate_bytes(model, length)
    have = available_bytes(_device(model))
    if need > 0.9 * have:
        raise PosEncError(
            f"{option}: a forward of {length} tokens needs about {need / 2**30:.1f} GiB, "
            f"{have / 2**30:.1f} GiB is available; ask for a shorter length"
        )
    return need


def ids_of(doc: Document, length: int) -> list[int] | None:
    """The first ``length`` tokens of ``doc`` (None: it is shorter)."""
    return list(doc.ids[:length]) if len(doc.ids) >= length else None
