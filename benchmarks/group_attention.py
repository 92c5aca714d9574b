"""llama.cpp's group attention (Self-Extend, ``--grp-attn-n G --grp-attn-w W``), replayed
through llama-cpp-python's low-level API for ``benchmarks/engines.py``.

What llama-completion does (``tools/completion/completion.cpp``, llama.cpp 0c1e570, as
vendored by llama-cpp-python 0.3.36; the loop is unchanged since group attention came in):
the prompt is fed in batches of ``--batch-size`` tokens, each decoded at positions
``n_past, n_past + 1, ...``; before each batch, while ``n_past >= ga_i + W``, the positions
held in the KV cache are moved in place (``ga_i``: grouped positions so far, starting at 0):

    ib = G * ga_i // W;  bd = W // G * (G - 1);  dd = W // G - ib * bd - W
    seq_add [ga_i, n_past)                        += ib * bd
    seq_div [ga_i + ib * bd, ga_i + ib * bd + W)  //= G
    seq_add [ga_i + ib * bd + W, n_past + ib * bd) += dd
    n_past -= bd;  ga_i += W // G

(``llama_memory_seq_add`` / ``seq_div`` act on the cells whose position lies in
``[p0, p1)``; llama.cpp re-rotates the cached keys by each move at the next decode.) With
batches of ``W`` the cached keys end at ``j // G`` and a new block of ``W`` queries starts
right after them, so a query ``i`` of block ``k`` (``i = k W + r``) sits at ``k W / G + r``
against keys ``j // G`` of the earlier blocks and at exact offsets inside its own block.
LongLM's Self-Extend (posenc's ``SelfExtend``) decides per pair instead: offsets below ``W``
exact, the rest ``i // G + W - W / G`` against ``j // G``. :func:`relative_positions` gives
both, so the two maps can be compared pair by pair.

The cached keys are re-rotated by each move. An add turns them by ``delta``; a division, in
``llama_kv_cells::pos_div`` (``src/llama-kv-cells.h``), accumulates ``p_old - p_new``, the
opposite sign (the pre-refactor ``llama_kv_cache_seq_div`` added ``p_new - p_old``), so a
divided key ends at ``2 p_old - p_new``, not ``p_new``. :func:`torch_replay_nll` replays the
procedure in transformers either way (:data:`ROTATIONS`), which tells which one llama.cpp ran.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Move:
    """One ``llama_memory_seq_add`` (``op`` "add", ``value`` the delta) or ``seq_div`` ("div",
    ``value`` the divisor) on the cells at positions ``[p0, p1)``."""

    op: str
    p0: int
    p1: int
    value: int


@dataclass(frozen=True)
class Batch:
    """Tokens ``[start, stop)`` decoded at positions ``pos0, pos0 + 1, ...``, after ``moves``."""

    start: int
    stop: int
    pos0: int
    moves: tuple[Move, ...]


def schedule(n_tokens: int, group: int, window: int, n_batch: int) -> Iterator[Batch]:
    """llama-completion's prompt loop with group attention, batch by batch. Raises
    ValueError where llama-completion asserts (``G >= 1``, ``W`` a multiple of ``G``)."""
    if group < 1 or window < 1 or n_batch < 1 or window % group:
        raise ValueError(
            f"group attention needs G >= 1 and W a multiple of G, and a batch size >= 1; "
            f"got G={group}, W={window}, n_batch={n_batch}"
        )
    n_past, ga_i = 0, 0
    for start in range(0, n_tokens, n_batch):
        moves: list[Move] = []
        while group > 1 and n_past >= ga_i + window:
            ib = group * ga_i // window
            bd = window // group * (group - 1)
            dd = window // group - ib * bd - window
            moves += [
                Move("add", ga_i, n_past, ib * bd),
                Move("div", ga_i + ib * bd, ga_i + ib * bd + window, group),
                Move("add", ga_i + ib * bd + window, n_past + ib * bd, dd),
            ]
            n_past -= bd
            ga_i += window // group
        stop = min(start + n_batch, n_tokens)
        yield Batch(start, stop, n_past, tuple(moves))
        n_past += stop - start


#: How a ``div`` re-rotates the cached keys: ``intended`` by ``new - old`` (what an add does,
#: and what ``llama_kv_cache_seq_div`` did before llama.cpp's KV cells were refactored);
#: ``llama.cpp`` by ``old - new``, as ``llama_kv_cells::pos_div`` accumulates it
#: (``shift[i] += p_old - pos[i]``, ``src/llama-kv-cells.h``), which is what llama.cpp
#: 0c1e570 computes (measured: ``engines.py`` runs both).
ROTATIONS = ("intended", "llama.cpp")


def apply_moves(
    positions: np.ndarray, moves: Sequence[Move], rotation: str = "intended"
) -> tuple[np.ndarray, np.ndarray]:
    """``(positions, turn)`` after ``moves`` (copies): an add shifts, a div floor-divides the
    cells inside ``[p0, p1)``; ``turn`` is how far each cell's key is re-rotated
    (:data:`ROTATIONS`). A cell moved below 0 is an error (llama.cpp would drop it)."""
    if rotation not in ROTATIONS:
        raise ValueError(f"rotation must be one of {ROTATIONS}, got {rotation!r}")
    out = positions.copy()
    turn = np.zeros_like(out)
    for move in moves:
        inside = (out >= move.p0) & (out < move.p1)
        old = out[inside]
        new = old + move.value if move.op == "add" else old // move.value
        flip = move.op == "div" and rotation == "llama.cpp"
        turn[inside] += old - new if flip else new - old
        out[inside] = new
        if (out < 0).any():
            raise ValueError(f"{move} moves a cached position below 0")
    return out, turn


def relative_positions(
    n_tokens: int, group: int, window: int, n_batch: int, rows: int = 256
) -> Iterator[tuple[int, int, np.ndarray]]:
    """``(start, stop, rel)`` per ``rows`` queries of each batch: ``rel[r, j]`` is the relative
    position llama.cpp gives query ``start + r`` and key ``j`` (-1 where ``j > start + r``)."""
    cached = np.zeros(0, dtype=np.int64)
    for batch in schedule(n_tokens, group, window, n_batch):
        cached = apply_moves(cached, batch.moves)[0]
        own = batch.pos0 + np.arange(batch.stop - batch.start)
        keys = np.concatenate([cached, own])
        for r0 in range(0, own.size, rows):
            queries = np.arange(batch.start + r0, min(batch.start + r0 + rows, batch.stop))
            rel = own[queries - batch.start][:, None] - keys[None, :]
            causal = np.arange(keys.size)[None, :] <= queries[:, None]
            yield int(queries[0]), int(queries[-1]) + 1, np.where(causal, rel, -1)
        cached = keys


def self_extend_relative(i: np.ndarray, j: np.ndarray, group: int, window: int) -> np.ndarray:
    """LongLM's relative position of the pairs (``i``, ``j <= i``): exact below ``window``,
    ``i // G + W - W / G - j // G`` from it on (float64)."""
    d = (i - j).astype(np.float64)
    grouped = i // group + window - window / group - j // group
    return np.where(d < window, d, grouped)


def map_difference(n_tokens: int, group: int, window: int, n_batch: int) -> dict[str, Any]:
    """How far llama.cpp's relative positions are from LongLM's, over every causal pair."""
    pairs = moved = 0
    total = largest = 0.0
    for start, stop, rel in relative_positions(n_tokens, group, window, n_batch):
        i = np.arange(start, stop)[:, None]
        j = np.arange(rel.shape[1])[None, :]
        ours = self_extend_relative(i, j, group, window)
        causal = rel >= 0
        gap = np.abs(rel - ours)[causal]
        pairs += int(causal.sum())
        moved += int((gap > 0).sum())
        total += float(gap.sum())
        largest = max(largest, float(gap.max()) if gap.size else 0.0)
    return {
        "pairs": pairs,
        "pairs_differing": moved,
        "fraction_differing": moved / pairs if pairs else 0.0,
        "mean_abs_difference": total / pairs if pairs else 0.0,
        "max_abs_difference": largest,
    }


def batch_nll(logits: np.ndarray, targets: Sequence[int]) -> np.ndarray:
    """Float64 cross-entropy of ``targets`` from the first ``len(targets)`` rows."""
    rows = np.asarray(logits[: len(targets)], dtype=np.float64)
    top = rows.max(axis=1, keepdims=True)
    lse = np.log(np.exp(rows - top).sum(axis=1)) + top[:, 0]
    return lse - rows[np.arange(len(targets)), np.asarray(targets, dtype=np.int64)]


def replay_nll(
    path: Path,
    ids: Sequence[int],
    kwargs: Mapping[str, Any],
    group: int,
    window: int,
    n_batch: int,
    threads: int = 2,
) -> dict[str, Any]:
    """Run ``ids`` through llama.cpp as llama-completion does with ``--grp-attn-n group
    --grp-attn-w window --batch-size n_batch``: the per-token losses of ``ids[1:]``, the
    seconds, llama.cpp's log and the largest cached position after each batch."""
    import llama_cpp

    log = io.StringIO()
    start = time.perf_counter()
    nll = np.empty(len(ids) - 1, dtype=np.float64)
    pos_max = []
    with contextlib.redirect_stderr(log):
        llm = llama_cpp.Llama(
            model_path=str(path),
            n_threads=threads,
            n_threads_batch=threads,
            n_batch=n_batch,
            verbose=True,
            **{"n_ctx": len(ids), **kwargs},
        )
        try:
            ctx, vocab = llm._ctx.ctx, llm.n_vocab()
            memory = llama_cpp.llama_get_memory(ctx)
            for batch in schedule(len(ids), group, window, n_batch):
                for move in batch.moves:
                    if move.op == "add" and move.value and move.p0 < move.p1:
                        llama_cpp.llama_memory_seq_add(memory, 0, move.p0, move.p1, move.value)
                    elif move.op == "div":
                        llama_cpp.llama_memory_seq_div(memory, 0, move.p0, move.p1, move.value)
                tokens = list(ids[batch.start : batch.stop])
                llm._batch.set_batch(batch=tokens, n_past=batch.pos0, logits_all=True)
                llm._ctx.decode(llm._batch)
                logits = np.ctypeslib.as_array(
                    llama_cpp.llama_get_logits(ctx), shape=(len(tokens), vocab)
                )
                targets = list(ids[batch.start + 1 : batch.stop + 1])
                nll[batch.start : batch.start + len(targets)] = batch_nll(logits, targets)
                pos_max.append(int(llama_cpp.llama_memory_seq_pos_max(memory, 0)))
        finally:
            llm.close()
    return {
        "nll": nll,
        "seconds": time.perf_counter() - start,
        "log": log.getvalue(),
        "pos_max": pos_max,
    }


def torch_replay_nll(
    model: Any,
    ids: Sequence[int],
    group: int,
    window: int,
    n_batch: int,
    rotation: str = "intended",
) -> dict[str, Any]:
    """The same procedure in transformers (the model unpatched, its own RoPE): batches
    decoded at the positions of :func:`schedule` through a ``DynamicCache`` whose keys are
    re-rotated by each move as ``rotation`` says (RoPE of ``p`` then of ``d`` is RoPE of
    ``p + d``), as llama.cpp's K-shift does: the per-token losses and the seconds."""
    import torch
    from transformers import DynamicCache

    inv_freq = model.model.rotary_emb.inv_freq.detach().to(torch.float64)
    cache = DynamicCache(config=model.config)
    cached = np.zeros(0, dtype=np.int64)
    nll = np.empty(len(ids) - 1, dtype=np.float64)
    start_time = time.perf_counter()
    with torch.no_grad():
        for batch in schedule(len(ids), group, window, n_batch):
            cached, turn = apply_moves(cached, batch.moves, rotation)
            if turn.any():
                _rotate_cached(cache, torch.from_numpy(turn), inv_freq)
            tokens = torch.tensor([list(ids[batch.start : batch.stop])])
            positions = torch.arange(batch.pos0, batch.pos0 + tokens.shape[1])[None]
            out = model(input_ids=tokens, position_ids=positions, cache=cache, use_cache=True)
            targets = list(ids[batch.start + 1 : batch.stop + 1])
            nll[batch.start : batch.start + len(targets)] = batch_nll(
                out.logits[0].float().numpy(), targets
            )
            cached = np.concatenate([cached, positions[0].numpy()])
    return {"nll": nll, "seconds": time.perf_counter() - start_time}


def _rotate_cached(cache: Any, delta: Any, inv_freq: Any) -> None:
    """Rotate every layer's cached keys ``[b, h, n, d]`` (half layout) by ``delta[n]``."""
    import torch

    angles = delta.to(torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)
    for layer in cache.layers:
        keys = layer.keys
        half = keys.shape[-1] // 2
        if cos.shape[-1] != keys.shape[-1]:
            raise ValueError(f"keys of width {keys.shape[-1]} are not fully rotary")
        turned = torch.cat([-keys[..., half:], keys[..., :half]], dim=-1)
        layer.keys = (keys * cos.to(keys.dtype) + turned * sin.to(keys.dtype)).contiguous()
