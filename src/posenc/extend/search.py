"""``posenc extend --search MINUTES``: per-band LongRoPE factors found by an evolutionary
search (Ding et al. 2024, LongRoPE), scored by perplexity on a held-out validation slice.

A candidate is one rescale factor per rotated frequency pair, ``lambda_i`` (the pair turns
at ``inv_freq_i / lambda_i``): ``d / 2`` numbers in ``[1, 2 s]`` (``s = target / L``),
non-decreasing from the highest frequency (``i = 0``) to the lowest, each a float32 number
(what transformers computes the factors in and a GGUF tensor holds, so the export is exact).

- The first generation: PI (every band ``s``), NTK (the ratio the base change
  ``base * s^(d / (d - 2))`` gives each band) and YaRN (its ramp between ``beta_fast`` 32
  and ``beta_slow`` 1 rotations), each read off posenc's own scalings
  (:func:`seed_factors`), then children of the three up to the population.
- Each later generation keeps the ``population // 2`` best candidates scored so far and
  adds children: a one-point crossover of two of them (half the time) or a copy of one,
  then a log-normal step on a few random bands, projected back onto the bounded monotone
  set (isotonic regression in log space, the bounds, float32). Generation ``g`` draws from
  ``numpy.random.default_rng([seed, g])``, so the search is deterministic from the seed.
- A candidate is scored as ``LongRopeScaling(short_factor=(1,) * (d / 2), long_factor=it,
  original_max_position=L, factor=s)`` patched into the model (transformers' longrope
  attention factor ``sqrt(1 + ln s / ln L)`` from ``factor``), by the mean negative
  log-likelihood of the validation document's first ``length`` tokens
  (:func:`posenc.extend.measure.nll_by_position`). ``length`` must exceed ``L``: below it
  longrope runs its short factors.

LongRoPE's starting-token window (n-hat: the first tokens keep their positions) is not
searched: the longrope of transformers, vLLM and llama.cpp cannot express it.

The search stops before the next evaluation would pass the budget (the longest
evaluation so far is the estimate; the first candidate is always scored). After every
evaluation the state goes to ``OUT/search.json`` (:mod:`posenc.extend.search_state`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from posenc._errors import PosEncError, check_float, check_int
from posenc._files import make_out_dir
from posenc.extend import measure
from posenc.extend import search_state as S
from posenc.extend.data import Document
from posenc.extend.model import Loaded, scaled
from posenc.integrations.transformers import rotary_from_config, unpatch
from posenc.registry import build

__all__ = ["SEARCH", "SearchResult", "project", "run_search", "search_scaling", "seed_factors"]

#: The unit name of the searched factors in ``results.json``.
SEARCH = "search"
_SEEDS = ("pi", "ntk", "yarn")
_TRIES = 50  # draws per child before a generation gives up on a new one


def _frequencies(dim: int, base: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """The float64 frequencies of RoPE over ``dim`` channels at ``base`` with ``scaling``."""
    return cast(Any, build("rope", head_dim=dim, base=base, scaling=scaling)).inv_freq


def seed_factors(dim: int, base: float, factor: float, trained: int) -> dict[str, np.ndarray]:
    """PI's, NTK's and YaRN's per-band factors at ``factor``: the unscaled frequencies over
    each scaling's own (posenc's rotary module of each, float64)."""
    plain = _frequencies(dim, base, None)
    specs = {
        "pi": {"type": "linear", "factor": factor},
        "ntk": {"type": "ntk", "factor": factor},
        "yarn": {"type": "yarn", "factor": factor, "original_max_position": trained},
    }
    return {name: (plain / _frequencies(dim, base, spec)).numpy() for name, spec in specs.items()}


def _isotonic(values: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence nearest ``values`` (least squares; pool adjacent
    violators)."""
    sums: list[float] = []
    counts: list[int] = []
    for value in values.tolist():
        sums.append(value)
        counts.append(1)
        while len(sums) > 1 and sums[-2] / counts[-2] > sums[-1] / counts[-1]:
            total, count = sums.pop(), counts.pop()
            sums[-1] += total
            counts[-1] += count
    return np.concatenate([np.full(c, s / c) for s, c in zip(sums, counts)])


def _cap32(cap: float) -> float:
    """The largest float32 number at most ``cap``."""
    value = np.float32(cap)
    return float(value if float(value) <= cap else np.nextafter(value, np.float32(0)))


def project(factors: np.ndarray, cap: float) -> np.ndarray:
    """``factors`` made a candidate: non-decreasing (isotonic regression of their logs),
    within ``[1, cap]``, float32 numbers (as float64)."""
    top = _cap32(cap)
    logs = np.log(np.clip(np.asarray(factors, dtype=np.float64), 1.0, top))
    out = np.exp(_isotonic(logs)).astype(np.float32).astype(np.float64)
    return np.maximum.accumulate(np.clip(out, 1.0, top))  # float32 rounding kept in order


def _child(
    parents: list[np.ndarray], rng: np.random.Generator, cap: float
) -> tuple[np.ndarray, str]:
    """A crossover of two parents (half the time) or a copy of one, then a log-normal step
    on ``1..max(1, n / 4)`` random bands, projected."""
    n = len(parents[0])
    child = parents[int(rng.integers(len(parents)))]
    origin = "mutation"
    if len(parents) > 1 and n > 1 and rng.random() < 0.5:
        other = parents[int(rng.integers(len(parents)))]
        cut = int(rng.integers(1, n))
        child, origin = np.concatenate([child[:cut], other[cut:]]), "crossover"
    count = int(rng.integers(1, max(1, n // 4) + 1))
    bands = rng.choice(n, size=count, replace=False)
    logs = np.log(child)
    logs[bands] += rng.normal(0.0, math.log(cap) / 8, size=count)
    return project(np.exp(logs), cap), origin


def _children(
    parents: list[np.ndarray], count: int, rng: np.random.Generator, cap: float, seen: set
) -> list[dict[str, Any]]:
    """``count`` new candidates (none already in ``seen``, which they join)."""
    out: list[dict[str, Any]] = []
    for _ in range(count * _TRIES):
        if len(out) == count:
            break
        factors, origin = _child(parents, rng, cap)
        key = tuple(factors.tolist())
        if key not in seen:
            seen.add(key)
            out.append({"factors": list(key), "origin": origin})
    return out


def _first(seeds: dict[str, np.ndarray], population: int, seed: int, cap: float) -> list[dict]:
    """Generation 0: the three seeds, then their children up to ``population``."""
    first = [{"factors": project(seeds[n], cap).tolist(), "origin": n} for n in _SEEDS]
    seen = {tuple(c["factors"]) for c in first}
    parents = [np.asarray(c["factors"]) for c in first]
    rng = np.random.default_rng([seed, 0])
    return first + _children(parents, population - len(first), rng, cap, seen)


def _ranked(scored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The scored candidates, best first (a candidate without a finite score last; ties in
    the order scored)."""
    order = sorted(
        range(len(scored)),
        key=lambda i: (scored[i]["nll"] is None, scored[i]["nll"] or 0.0, i),
    )
    return [scored[i] for i in order]


def _next(state: dict[str, Any], population: int, seed: int, cap: float) -> None:
    """Draw the next generation into ``state``: the best ``population // 2`` as parents."""
    state["generation"] += 1
    parents = [np.asarray(c["factors"]) for c in _ranked(state["scored"])[: population // 2]]
    seen = {tuple(c["factors"]) for c in state["scored"]}
    rng = np.random.default_rng([seed, state["generation"]])
    state["pending"] = _children(parents, population - len(parents), rng, cap, seen)


def search_scaling(factors: Any, trained: int, target: int) -> dict[str, Any]:
    """The LongRoPE scaling (posenc's spelling) of the long ``factors`` for ``target`` tokens
    (short factors 1: within ``L`` the model's own frequencies, under longrope's attention
    factor ``sqrt(1 + ln s / ln L)``)."""
    long = [float(f) for f in factors]
    return {
        "type": "longrope",
        "short_factor": [1.0] * len(long),
        "long_factor": long,
        "original_max_position": trained,
        "factor": target / trained,
    }


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """The best candidate of a search and how it was found.

    Attributes:
        scaling: the best candidate, a ``longrope`` scaling in posenc's spelling.
        ppl: its validation perplexity.
        record: what ``results.json`` keeps (``run_search``'s record: the validation
            document, lengths, counts, seconds, why it stopped, each seed's and the best
            perplexity and origin, the best perplexity after each evaluation, and
            ``bands``: each band's wavelength and the seeds' factors, as scored).
    """

    scaling: dict[str, Any]
    ppl: float
    record: dict[str, Any]


def _score(loaded: Loaded, scaling: dict[str, Any], ids: list[int]) -> float | None:
    model = scaled(loaded, scaling)
    try:
        nll = float(measure.nll_by_position(model, ids).mean())
    finally:
        unpatch(model)
    return nll if math.isfinite(nll) else None


def run_search(
    loaded: Loaded,
    validation: Document,
    out: Path,
    *,
    seed: int,
    minutes: float,
    target: int,
    length: int,
    population: int = 8,
    resume: bool = False,
    evaluations: int | None = None,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
) -> SearchResult:
    """Search the long factors of ``loaded`` for ``target`` tokens for ``minutes`` (module
    docstring), scoring on ``validation``'s first ``length`` tokens; with ``resume``,
    continue ``out/search.json`` (else start over). ``evaluations`` caps the candidates
    scored (across resumes); ``on_event("search", info)`` follows each one (``info``: the
    count scored, its ``nll``, ``origin`` and ``generation``, the ``seconds`` spent of the
    ``budget``, the cap on ``evaluations`` and the ``best`` so far: its ``nll``, ``origin``).

    Raises:
        PosEncError: ``length`` not above ``L`` or longer than ``validation``, ``target``
            not above ``L``, ``minutes`` not above 0, a population below 4, a saved state
            of other settings (or one that does not read).
    """
    trained = loaded.trained
    length = check_int("length", length, min=trained + 1)
    target = check_int("target", target, min=trained + 1)
    population = check_int("population", population, min=4, max=256)
    seed = check_int("seed", seed, min=0, max=2**31 - 1)
    minutes = check_float("minutes", minutes, min=0.0, min_exclusive=True)
    if evaluations is not None:
        evaluations = check_int("evaluations", evaluations, min=1)
    if len(validation.ids) < length:
        raise PosEncError(
            f"length must be at most the validation document's {len(validation.ids)} "
            f"tokens, got {length}"
        )
    rope = rotary_from_config(
        loaded.model.config.get_text_config(), layer_type=loaded.scaled_types[0]
    )
    factor, cap = target / trained, 2.0 * target / trained
    wanted = S.fingerprint(
        loaded, validation, seed=seed, target=target, length=length, population=population
    )
    path = make_out_dir(out) / S.STATE_FILE
    state = S.read_state(path, wanted, cap) if resume else None
    seeds = seed_factors(rope.rotary_dim, float(rope.base), factor, trained)
    if state is None:
        state = {
            "fingerprint": wanted,
            "generation": 0,
            "pending": _first(seeds, population, seed, cap),
            "scored": [],
            "seconds": 0.0,
        }
        S.write_state(path, state)
    stop = _Stop(minutes * 60.0, evaluations)
    stopped = _evaluate(loaded, state, list(validation.ids[:length]), path, stop, on_event)
    wavelengths = 2 * math.pi / _frequencies(rope.rotary_dim, float(rope.base), None)
    bands = {"wavelength": wavelengths.tolist()}
    bands.update({n: project(seeds[n], cap).tolist() for n in _SEEDS})
    return _result(state, validation, minutes=minutes, stopped=stopped, bands=bands)


@dataclasses.dataclass(frozen=True)
class _Stop:
    seconds: float  # the budget
    evaluations: int | None  # the most candidates scored, across resumes


def _evaluate(
    loaded: Loaded,
    state: dict[str, Any],
    ids: list[int],
    path: Path,
    stop: _Stop,
    on_event: Callable[[str, dict[str, Any]], None] | None,
) -> str:
    """Score candidates into ``state`` (saved after each) until the budget or the count is
    reached; why it stopped: ``budget``, ``evaluations`` or ``exhausted`` (no new candidate
    could be drawn)."""
    fp = state["fingerprint"]
    trained, target = fp["trained"], fp["target"]
    cap = 2.0 * target / trained
    longest = max((c["seconds"] for c in state["scored"]), default=0.0)
    while True:
        if not state["pending"]:
            _next(state, fp["population"], fp["seed"], cap)
            if not state["pending"]:
                return "exhausted"
        if stop.evaluations is not None and len(state["scored"]) >= stop.evaluations:
            return "evaluations"
        if state["scored"] and state["seconds"] + longest > stop.seconds:
            return "budget"
        candidate = state["pending"][0]
        start = time.perf_counter()
        nll = _score(loaded, search_scaling(candidate["factors"], trained, target), ids)
        seconds = time.perf_counter() - start
        longest = max(longest, seconds)
        done = {**candidate, "nll": nll, "generation": state["generation"], "seconds": seconds}
        state["scored"].append(done)
        state["pending"] = state["pending"][1:]
        state["seconds"] += seconds
        S.write_state(path, state)
        if on_event is not None:
            best = _ranked(state["scored"])[0]
            on_event(
                "search",
                {
                    "done": len(state["scored"]),
                    "nll": nll,
                    "generation": state["generation"],
                    "origin": candidate["origin"],
                    "seconds": state["seconds"],
                    "budget": stop.seconds,
                    "evaluations": stop.evaluations,
                    "best": {"nll": best["nll"], "origin": best["origin"]},
                },
            )


def _result(
    state: dict[str, Any],
    validation: Document,
    *,
    minutes: float,
    stopped: str,
    bands: dict[str, list[float]],
) -> SearchResult:
    fp = state["fingerprint"]
    trained = fp["trained"]
    scored = state["scored"]
    best = _ranked(scored)[0]
    if best["nll"] is None:
        raise PosEncError(
            "every candidate of the search gave a non-finite perplexity on the validation document"
        )
    history, low = [], math.inf
    for c in scored:
        low = min(low, c["nll"] if c["nll"] is not None else math.inf)
        history.append(math.exp(low) if math.isfinite(low) else None)
    record = {
        "validation": {
            "name": validation.name,
            "sha256": validation.sha256,
            "tokens": fp["length"],
        },
        "length": fp["length"],
        "target": fp["target"],
        "factor": fp["target"] / trained,
        "seed": fp["seed"],
        "population": fp["population"],
        "minutes": minutes,
        "seconds": state["seconds"],
        "evaluated": len(scored),
        "generations": scored[-1]["generation"] + 1,  # those with a candidate scored
        "stopped": stopped,
        "seeds": {c["origin"]: _ppl(c["nll"]) for c in scored if c["origin"] in _SEEDS},
        "best": {
            "ppl": _ppl(best["nll"]),
            "origin": best["origin"],
            "generation": best["generation"],
            "long_factor": best["factors"],
        },
        "best_ppl_by_evaluation": history,
        "bands": bands,
    }
    scaling = search_scaling(best["factors"], trained, fp["target"])
    return SearchResult(scaling=scaling, ppl=math.exp(best["nll"]), record=record)


def _ppl(nll: float | None) -> float | None:
    return None if nll is None else math.exp(nll)
