"""``run_extend``: every ``(scaling, length)`` unit measured, resumable, into ``results.json``.

The units: ``none`` at every length; each other scaling at each length past ``L`` with
factor ``length / L`` (what a user would set to run at that length); and, where ``L`` is
among the lengths, each scaling at ``L`` with factor ``to`` (the one set for the longest
length, run at ``L``: what it costs in distribution). A unit whose rotary tables equal an
already measured unit's of the same length, bit for bit (dynamic NTK at ``<= L`` is no
scaling), and whose position map moves the same pairs there (none, for a plain scaling or a
map that moves no pair at that length), takes that unit's numbers, with ``same_as`` naming
it, instead of running again; a longer pass is shared only within one scaling and factor.

Every unit is written to ``OUT/units/`` when done; ``resume=True`` keeps the units whose
settings and model hash match, so a killed run goes on where it stopped.

With ``--search``, per-band LongRoPE factors are searched first and measured as the units
``search`` at every length (:mod:`posenc.extend.search_export`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from posenc._errors import PosEncError
from posenc._files import MIB, atomic_write, lock_out_dir, make_out_dir, read_regular
from posenc._version import __version__
from posenc.experiments.results import write_results
from posenc.extend import measure
from posenc.extend.answer import answer
from posenc.extend.data import Document, documents
from posenc.extend.model import (
    Loaded,
    active_map,
    check_maps,
    check_scalable,
    load_model,
    prefix_equal,
    rotary_tables,
    scaled,
    scaling_for,
    split_spec,
)
from posenc.extend.search import SEARCH
from posenc.extend.search_export import Searched, search_emit, search_step, search_units
from posenc.extend.settings import CONFIG, NONE, UNSCALED, ExtendSettings
from posenc.integrations.transformers import unpatch

__all__ = ["Event", "chosen", "execution_order", "plan_units", "run_extend", "unit_fingerprint"]

#: ``on_event(kind, info)``: ``"loaded"`` (model, lengths, units), ``"unit"`` (a unit
#: starts: scaling, length, factor, index, total), ``"step"`` (one forward done inside a
#: unit: done, total), ``"done"`` (a unit's record), ``"written"`` (paths).
Event = Callable[[str, dict[str, Any]], None]


def plan_units(
    settings: ExtendSettings,
    lengths: Sequence[int],
    trained: int,
    configured: bool,
    *,
    scalable: bool = True,
) -> list[tuple[str, int, float]]:
    """``(scaling, length, factor)`` of every unit, in the order they run (with
    ``scalable`` False, a model whose long-range layers are all NoPE: ``none`` and
    ``config`` only)."""
    names = [
        n for n in settings.scalings if (n != CONFIG or configured) and (scalable or n in UNSCALED)
    ]
    units = [(NONE, trained, 1.0)]
    for length in lengths:
        for name in names:
            if name == NONE:
                if length != trained:
                    units.append((NONE, length, 1.0))
            elif name == CONFIG:
                units.append((CONFIG, length, 1.0))
            elif length == trained:
                units.append((name, length, settings.to))
            else:
                units.append((name, length, length / trained))
    return units


def execution_order(units: Sequence[tuple[str, int, float]]) -> list[int]:
    """The order the units run in: grouped by ``(scaling, factor)`` (in order of first
    appearance), the longest length of a group first, so its forward pass can give the
    group's shorter lengths their perplexity (see :func:`run_extend`)."""
    groups: dict[tuple[str, float], list[int]] = {}
    for i, (name, _, factor) in enumerate(units):
        groups.setdefault((name, factor), []).append(i)
    return [i for group in groups.values() for i in sorted(group, key=lambda i: -units[i][1])]


def _key(scaling: str, length: int, factor: float) -> str:
    return f"{scaling}-{length}-{factor:g}"


@dataclasses.dataclass
class _Pass:
    """A forward pass over the documents at one ``(scaling, factor)``, kept so a shorter
    length at the same scaling and factor takes its losses instead of running again."""

    key: str
    length: int
    tables: list[torch.Tensor]
    nlls: dict[str, torch.Tensor]


def _haystacks(loaded: Loaded, settings: ExtendSettings, docs: list[Document], length: int) -> Any:
    """The probes' haystacks at ``length`` (the same for every scaling), or the reason
    there are none (``trials`` 0, or a length too short for the needles)."""
    if not settings.trials:
        return []
    from posenc.extend.probes import haystacks

    try:
        return haystacks(
            loaded.tokenizer,
            docs[0].ids,
            length,
            seed=settings.seed,
            tasks=settings.tasks,
            count=settings.trials,
            depths=settings.depths,
        )
    except PosEncError as error:
        return str(error)


def _filler_losses(nll: torch.Tensor, haystack: Any, length: int) -> torch.Tensor:
    """A haystack's losses as a document's: NaN where the token predicted is a needle's,
    padded with NaN to ``length - 1`` positions."""
    out = torch.full((length - 1,), math.nan, dtype=torch.float64)
    out[: nll.shape[0]] = nll
    for start, stop in haystack.needles:
        out[max(start - 1, 0) : stop - 1] = math.nan  # entry i predicts token i + 1
    return out


def _measure(
    loaded: Loaded,
    settings: ExtendSettings,
    docs: list[Document],
    unit: tuple[str, int, float],
    tables: list[torch.Tensor],
    passes: dict[tuple[str, float], _Pass],
    hays: Any,
    on_step: Callable[[int, int], None],
) -> dict[str, Any]:
    """Perplexity, probes and cost of the model as patched now, at ``length``: one prefill
    per haystack answers its probes and gives the first document's losses (its needles
    left out); the other documents take a longer pass's losses at the same scaling and
    factor where its tables agree, else run."""
    name, length, factor = unit
    device = next(loaded.model.parameters()).device
    stacks = hays if isinstance(hays, list) else []
    longer = passes.get((name, factor))
    shared = (
        longer
        if longer is not None and longer.length >= length and prefix_equal(longer.tables, tables)
        else None
    )
    total = len(stacks) + sum(1 for d in docs if shared is None or d.name not in shared.nlls)
    done = [0]

    def step() -> None:
        done[0] += 1
        on_step(done[0], total)

    nlls: dict[str, torch.Tensor] = {}
    rows: list[dict[str, Any]] = []
    with measure.measured(device) as probe_cost:
        from posenc.extend.asking import answer_haystack

        for h in stacks:
            nll, cache = measure.prefill(loaded.model, h.ids)
            if h.index == 0 and len(docs[0].ids) >= length:
                nlls[docs[0].name] = _filler_losses(nll, h, length)
            rows.extend(answer_haystack(loaded.model, loaded.tokenizer, h, cache))
            del cache
            step()
    fresh: dict[str, torch.Tensor] = {}
    took = False
    with measure.measured(device) as cost:
        for d in docs:
            if d.name in nlls or (ids := measure.ids_of(d, length)) is None:
                continue
            if shared is not None and d.name in shared.nlls:
                nlls[d.name] = shared.nlls[d.name][: length - 1]
                took = True
                continue
            nlls[d.name] = fresh[d.name] = measure.nll_by_position(loaded.model, ids)
            step()
    if not nlls:
        raise PosEncError(
            f"no document has {length} tokens; pass longer --text files or a lower --to"
        )
    if fresh and (longer is None or longer.length < length):
        passes[(name, factor)] = _Pass(_key(*unit), length, tables, fresh)
    names = [d.name for d in docs if d.name in nlls]
    record = measure.perplexities([nlls[n] for n in names], length, max(1, loaded.trained // 4))
    record["ppl_by_bucket_document"] = dict(zip(names, record.pop("bucket_ppl_by_document")))
    record["ppl_by_document"] = {
        n: math.exp(float(nlls[n][~torch.isnan(nlls[n])].mean())) for n in names
    }
    record["tokens"] = int(sum(int((~torch.isnan(nlls[n])).sum()) for n in names))
    record["shared_pass"] = shared.key if took and shared is not None else None
    from posenc.extend.probes import summarize

    record["probes"] = rows
    record["scores"] = summarize(rows)
    if isinstance(hays, str):
        record["probes_skipped"] = hays
    record["seconds_ppl"] = cost.seconds
    record["seconds_probes"] = probe_cost.seconds
    record["seconds"] = cost.seconds + probe_cost.seconds
    record["peak_bytes"] = max(cost.peak_bytes, probe_cost.peak_bytes)
    record["base_bytes"] = probe_cost.base_bytes if stacks else cost.base_bytes
    return record


#: Settings that choose which units run or what is made of them, not what one unit
#: measures: a resumed run may add a scaling or a length, or change the bar, and keep every
#: unit already measured.
_PLAN_ONLY: tuple[str, ...] = (
    "to",
    "multiples",
    "scalings",
    "quick",
    "bar",
    "ppl_tolerance",
    "emit",
    "scaling",
)
# the factor search has its own state (search_state.fingerprint); its units theirs
_PLAN_ONLY += ("search", "search_length", "search_population")


def unit_fingerprint(
    settings: ExtendSettings, files: dict[str, str], docs: list[Document]
) -> dict[str, Any]:
    """What a saved unit must match to be kept by ``--resume``: the settings that change a
    unit's numbers (model, texts, documents, haystacks, tasks, depths, seed, dtype,
    device, context), the SHA-256 of the model's files and of the documents; as JSON gives
    it back (tuples are lists there), so a saved one compares equal."""
    record = {k: v for k, v in settings.to_record().items() if k not in _PLAN_ONLY}
    documents = sorted(d.sha256 for d in docs)
    return json.loads(json.dumps({"settings": record, "files": files, "documents": documents}))


_UNIT_MAX_BYTES = 16 * MIB  # a unit's record: a few numbers per bucket and probe


def _saved_unit(path: Path, fingerprint: dict[str, Any]) -> dict[str, Any] | None:
    """The record saved at ``path`` when it matches ``fingerprint`` (None: missing, damaged
    or of other settings, so the unit is measured again); a FIFO, a device or a file
    larger than a unit's record can be is refused (``PosEncError``), never waited on."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        saved = json.loads(read_regular(path, what="unit record", max_bytes=_UNIT_MAX_BYTES))
    except (OSError, ValueError, RecursionError) as error:
        if isinstance(error, PosEncError):
            raise
        return None
    if not isinstance(saved, dict) or saved.get("fingerprint") != fingerprint:
        return None
    record = saved.get("record")
    return record if isinstance(record, dict) else None


def run_extend(
    settings: ExtendSettings,
    *,
    out_dir: str | Path,
    resume: bool = False,
    plot: bool = True,
    on_event: Event | None = None,
) -> dict[str, Any]:
    """Measure ``settings.model`` under each scaling and length; write ``OUT/results.json``
    (and, with ``plot``, the figures and ``OUT/index.html``). Returns the results.

    Raises:
        PosEncError: the model cannot be read or has no RoPE, the longest length would not
            fit in memory (estimated before anything runs), no document is long enough, a
            position map ``patch`` refuses or ``--scaling`` that reaches no layer (both
            before any unit runs).
    """
    if not isinstance(settings, ExtendSettings):
        raise PosEncError(f"settings must be an ExtendSettings, got {type(settings).__name__}")
    emit = on_event or (lambda kind, info: None)
    out = make_out_dir(out_dir)
    with lock_out_dir(out):
        loaded = load_model(
            settings.model, dtype=settings.dtype, device=settings.device, context=settings.context
        )
        check_scalable(loaded, settings.scaling)
        lengths = settings.lengths_for(loaded.trained)
        estimate = measure.check_memory(loaded.model, max(lengths))
        docs = documents(loaded.tokenizer, settings.texts, settings.documents)
        if len(docs[0].ids) < max(lengths):  # checked before any unit runs
            raise PosEncError(
                f"no document has {max(lengths)} tokens; pass longer --text files or a lower --to"
            )
        configured, scalable = loaded.configured is not None, loaded.scalable
        units = plan_units(settings, lengths, loaded.trained, configured, scalable=scalable)
        check_maps(loaded, units)  # a map patch refuses: before anything runs
        emit(
            "loaded",
            {
                "identity": loaded.identity,
                "trained": loaded.trained,
                "lengths": lengths,
                "units": units,
                "note": loaded.note,
            },
        )
        searched = search_step(loaded, settings, docs, lengths, out, resume, emit)
        if searched is not None:  # --search: its units measure the best factors found
            units += search_units(searched, lengths, loaded.trained)
        fingerprint = unit_fingerprint(settings, loaded.identity["files"], docs)
        (out / "units").mkdir(exist_ok=True)
        records = _run_units(
            loaded, settings, docs, units, out, fingerprint, resume, emit, searched=searched
        )
        results = {
            "posenc": __version__,
            "model": loaded.identity,
            "trained_context": loaded.trained,
            "layer_types_scaled": loaded.scaled_types,
            "rope_layers": loaded.rope_layers,
            "model_note": loaded.note,
            "settings": settings.to_record(),
            "lengths": lengths,
            "estimated_peak_bytes": estimate,
            "documents": [{"name": d.name, "sha256": d.sha256, "tokens": len(d.ids)} for d in docs],
            "device": str(next(loaded.model.parameters()).device),
            "threads": torch.get_num_threads(),
            "records": records,
        }
        if searched is not None:
            results["search"] = searched.record
        results["answer"] = answer(results)
        results["emit"] = _emit(loaded, settings, results, out, searched)
        paths = [write_results(results, out)]
        if plot:
            from posenc.extend.page import write_page

            paths.extend(write_page(results, out))
        emit("written", {"paths": [str(p) for p in paths]})
    return results


def _run_units(
    loaded: Loaded,
    settings: ExtendSettings,
    docs: list[Document],
    units: list[tuple[str, int, float]],
    out: Path,
    fingerprint: dict[str, Any],
    resume: bool,
    emit: Event,
    *,
    searched: Searched | None = None,
) -> list[dict[str, Any]]:
    """Every unit's record, in the order of ``units`` (run in :func:`execution_order`);
    ``searched`` gives the ``search`` units their scaling."""
    records: dict[int, dict[str, Any]] = {}
    # per length: the rotary tables, the position map that moves pairs there, the record
    seen: dict[int, list[tuple[list[torch.Tensor], Any, dict[str, Any]]]] = {}
    passes: dict[tuple[str, float], _Pass] = {}
    hays: dict[int, Any] = {}
    for done, index in enumerate(execution_order(units)):
        name, length, factor = units[index]
        key = _key(name, length, factor)
        emit(
            "unit",
            {
                "scaling": name,
                "length": length,
                "factor": factor,
                "index": done,
                "total": len(units),
            },
        )
        path = out / "units" / f"{key}.json"
        found = searched if name == SEARCH else None
        unit_fp = fingerprint if found is None else found.unit_fingerprint(fingerprint)
        record = _saved_unit(path, unit_fp) if resume else None
        scaling = scaling_for(name, factor, loaded) if found is None else found.result.scaling
        model = scaled(loaded, scaling)
        remap = active_map(loaded, scaling, length)
        try:
            tables = rotary_tables(model, length)
            same = next(
                (r for t, m, r in seen.get(length, []) if m == remap and prefix_equal(t, tables)),
                None,
            )
            if record is None and same is not None:
                record = {**same, "same_as": same["key"], "shared_pass": None}
            elif record is None:
                if length not in hays:
                    hays[length] = _haystacks(loaded, settings, docs, length)
                measured = _measure(
                    loaded,
                    settings,
                    docs,
                    (name, length, factor),
                    tables,
                    passes,
                    hays[length],
                    lambda d, t: emit("step", {"done": d, "total": t}),
                )
                record = {**measured, "same_as": None}
        finally:
            unpatch(model)
        record.update(key=key, scaling=name, factor=factor, length=length, rope=_spelled(scaling))
        record.update(map=split_spec(scaling)[0], map_changes=remap is not None)
        atomic_write(
            path,
            (
                json.dumps({"fingerprint": unit_fp, "record": record}, allow_nan=False) + "\n"
            ).encode(),
        )
        seen.setdefault(length, []).append((tables, remap, record))
        records[index] = record
        emit("done", record)
    return [records[i] for i in range(len(units))]


def chosen(settings: ExtendSettings, results: dict[str, Any]) -> tuple[str, float, int] | None:
    """The setting ``--emit`` and ``--save`` write: ``settings.scaling`` set for the longest
    length, else the answer's choice; ``(scaling, factor, length)``, None where nothing
    holds."""
    if settings.scaling is not None:
        target = max(results["lengths"])
        factor = 1.0 if settings.scaling in UNSCALED else target / results["trained_context"]
        return settings.scaling, factor, target
    choice = results["answer"].get("choice")
    if not choice:
        return None
    return str(choice["scaling"]), float(choice["factor"]), int(choice["length"])


def _emit(
    loaded: Loaded,
    settings: ExtendSettings,
    results: dict[str, Any],
    out: Path,
    searched: Searched | None = None,
) -> dict[str, Any]:
    """The chosen setting written for each engine (:func:`posenc.extend.emit.write_emit`);
    empty where nothing was chosen (else ``results["chosen"]`` is set: it, with its spec).
    Where ``--emit`` and ``--scaling`` are both given, an engine that cannot take the
    scaling raises ``PosEncError`` instead of being noted."""
    from posenc.extend.emit import default_engines, write_emit

    choice = chosen(settings, results)
    if choice is None:
        return {}
    if choice[0] == SEARCH and searched is not None:  # written under OUT/search/ already
        spec = _spelled(searched.result.scaling)
        results["chosen"] = dict(zip(("scaling", "factor", "length"), choice), spec=spec)
        return search_emit(searched, settings.emit or default_engines(loaded.path.is_file()))
    spec = _spelled(scaling_for(choice[0], choice[1], loaded))  # what the page shows
    results["chosen"] = dict(zip(("scaling", "factor", "length"), choice), spec=spec)
    engines = settings.emit or default_engines(loaded.path.is_file())
    # engines and a scaling both named: a refusal is the user's answer, not a footnote
    strict = bool(settings.emit) and settings.scaling is not None
    return write_emit(loaded, *choice, out, engines, strict=strict)


def _spelled(scaling: Any) -> dict[str, Any] | None:
    """The unit's scaling as ``results.json`` holds it (posenc's spelling)."""
    if scaling is None or isinstance(scaling, dict):
        return scaling
    fields = {f.name: getattr(scaling, f.name) for f in dataclasses.fields(scaling) if f.init}
    return {"type": scaling.type, **{k: v for k, v in fields.items() if v is not None}}
