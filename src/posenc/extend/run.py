"""``run_extend``: every ``(scaling, length)`` unit measured, resumable, into ``results.json``.

The units: ``none`` at every length; each other scaling at each length past ``L`` with
factor ``length / L`` (what a user would set to run at that length); and, where ``L`` is
among the lengths, each scaling at ``L`` with factor ``to`` (the one set for the longest
length, run at ``L``: what it costs in distribution). A unit whose rotary tables equal an
already measured unit's of the same length, bit for bit (dynamic NTK at ``<= L`` is no
scaling), takes that unit's numbers, with ``same_as`` naming it, instead of running again.

Every unit is written to ``OUT/units/`` when done; ``resume=True`` keeps the units whose
settings and model hash match, so a killed run goes on where it stopped.
"""

from __future__ import annotations

import json
import math
import random
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
from posenc.extend.data import Document, documents, passkey_prompt
from posenc.extend.model import Loaded, load_model, scaled, scaling_for
from posenc.extend.settings import CONFIG, NONE, ExtendSettings
from posenc.integrations.transformers import PatchedRotaryEmbedding, unpatch

__all__ = ["Event", "plan_units", "run_extend", "unit_fingerprint"]

#: ``on_event(kind, info)``: ``"loaded"`` (model, lengths, units), ``"unit"`` (a unit
#: starts: scaling, length, factor, index, total), ``"step"`` (one forward done inside a
#: unit: done, total), ``"done"`` (a unit's record), ``"written"`` (paths).
Event = Callable[[str, dict[str, Any]], None]


def plan_units(
    settings: ExtendSettings, lengths: Sequence[int], trained: int, configured: bool
) -> list[tuple[str, int, float]]:
    """``(scaling, length, factor)`` of every unit, in the order they run."""
    names = [n for n in settings.scalings if n != CONFIG or configured]
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


def _tables(model: Any, length: int) -> list[torch.Tensor]:
    """The cos/sin of every patched rotary module over positions ``0..length-1``."""
    positions = torch.arange(length)[None]
    out: list[torch.Tensor] = []
    for module in model.modules():
        if isinstance(module, PatchedRotaryEmbedding):
            for rope in module.ropes.values():
                out.extend(rope.cos_sin(positions, dtype=torch.float64))
    return out


def _key(scaling: str, length: int, factor: float) -> str:
    return f"{scaling}-{length}-{factor:g}"


def _passkeys(
    loaded: Loaded, settings: ExtendSettings, length: int, step: Callable[[], None]
) -> list[dict[str, Any]]:
    rows = []
    for i, depth in enumerate(settings.depths):
        hits, outputs = 0, []
        for trial in range(settings.trials):
            rng = random.Random(f"{settings.seed}-{length}-{i}-{trial}")  # same for every scaling
            prompt = passkey_prompt(loaded.tokenizer, length, depth, rng)
            hit, text = measure.passkey_hit(loaded.model, loaded.tokenizer, prompt)
            hits += hit
            outputs.append({"key": prompt.key, "output": text, "hit": hit})
            step()
        rows.append({"depth": depth, "trials": settings.trials, "hits": hits, "outputs": outputs})
    return rows


def _measure(
    loaded: Loaded,
    settings: ExtendSettings,
    docs: list[Document],
    length: int,
    on_step: Callable[[int, int], None],
) -> dict[str, Any]:
    """Perplexity, passkeys and cost of the model as patched now, at ``length``."""
    device = next(loaded.model.parameters()).device
    texts = [(d.name, ids) for d in docs if (ids := measure.ids_of(d, length)) is not None]
    if not texts:
        raise PosEncError(
            f"no document has {length} tokens; pass longer --text files or a lower --to"
        )
    total = len(texts) + len(settings.depths) * settings.trials
    done = [0]

    def step() -> None:
        done[0] += 1
        on_step(done[0], total)

    with measure.measured(device) as cost:
        nlls = []
        for _, ids in texts:
            nlls.append(measure.nll_by_position(loaded.model, ids))
            step()
    record = measure.perplexities(nlls, length, max(1, loaded.trained // 4))
    record["ppl_by_document"] = {
        name: math.exp(float(nll.mean())) for (name, _), nll in zip(texts, nlls)
    }
    record["tokens"] = len(texts) * (length - 1)
    with measure.measured(device) as passkey_cost:
        try:
            rows = _passkeys(loaded, settings, length, step)
        except PosEncError as error:  # a prompt longer than the length: no passkey here
            rows, record["passkey_skipped"] = [], str(error)
    trials = sum(r["trials"] for r in rows)
    record["passkey"] = rows
    record["passkey_accuracy"] = sum(r["hits"] for r in rows) / trials if trials else None
    record["seconds_ppl"] = cost.seconds
    record["seconds_passkey"] = passkey_cost.seconds
    record["seconds"] = cost.seconds + passkey_cost.seconds
    record["peak_bytes"] = max(cost.peak_bytes, passkey_cost.peak_bytes)
    record["base_bytes"] = cost.base_bytes
    return record


#: Settings that choose which units run, not what one unit measures: a resumed run may
#: add a scaling or a length and keep every unit already measured.
_PLAN_ONLY = ("to", "multiples", "scalings", "quick")


def unit_fingerprint(
    settings: ExtendSettings, files: dict[str, str], docs: list[Document]
) -> dict[str, Any]:
    """What a saved unit must match to be kept by ``--resume``: the settings that change a
    unit's numbers (model, texts, documents, passkey depths and trials, seed, dtype,
    device, context), the SHA-256 of the model's files and of the documents; as JSON gives
    it back (tuples are lists there), so a saved one compares equal."""
    record = {k: v for k, v in settings.to_record().items() if k not in _PLAN_ONLY}
    documents = sorted(d.sha256 for d in docs)
    return json.loads(json.dumps({"settings": record, "files": files, "documents": documents}))


_UNIT_MAX_BYTES = 16 * MIB  # a unit's record: a few numbers per bucket and passkey


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
            fit in memory (estimated before anything runs), no document is long enough.
    """
    if not isinstance(settings, ExtendSettings):
        raise PosEncError(f"settings must be an ExtendSettings, got {type(settings).__name__}")
    emit = on_event or (lambda kind, info: None)
    out = make_out_dir(out_dir)
    with lock_out_dir(out):
        loaded = load_model(
            settings.model, dtype=settings.dtype, device=settings.device, context=settings.context
        )
        lengths = settings.lengths_for(loaded.trained)
        estimate = measure.check_memory(loaded.model, max(lengths))
        docs = documents(loaded.tokenizer, settings.texts, settings.documents)
        units = plan_units(settings, lengths, loaded.trained, loaded.configured is not None)
        emit(
            "loaded",
            {
                "identity": loaded.identity,
                "trained": loaded.trained,
                "lengths": lengths,
                "units": units,
            },
        )
        fingerprint = unit_fingerprint(settings, loaded.identity["files"], docs)
        (out / "units").mkdir(exist_ok=True)
        records = _run_units(loaded, settings, docs, units, out, fingerprint, resume, emit)
        results = {
            "posenc": __version__,
            "model": loaded.identity,
            "trained_context": loaded.trained,
            "layer_types_scaled": loaded.scaled_types,
            "settings": settings.to_record(),
            "lengths": lengths,
            "estimated_peak_bytes": estimate,
            "documents": [{"name": d.name, "sha256": d.sha256, "tokens": len(d.ids)} for d in docs],
            "device": str(next(loaded.model.parameters()).device),
            "threads": torch.get_num_threads(),
            "records": records,
        }
        results["answer"] = answer(results)
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
) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    seen: dict[int, list[tuple[list[torch.Tensor], dict[str, Any]]]] = {}
    for index, (name, length, factor) in enumerate(units):
        key = _key(name, length, factor)
        emit(
            "unit",
            {
                "scaling": name,
                "length": length,
                "factor": factor,
                "index": index,
                "total": len(units),
            },
        )
        path = out / "units" / f"{key}.json"
        record = _saved_unit(path, fingerprint) if resume else None
        scaling = scaling_for(name, factor, loaded)
        model = scaled(loaded, scaling)
        try:
            tables = _tables(model, length)
            same = next(
                (
                    r
                    for t, r in seen.get(length, [])
                    if all(torch.equal(a, b) for a, b in zip(t, tables))
                ),
                None,
            )
            if record is None and same is not None:
                record = {**same, "same_as": same["key"]}
            elif record is None:
                measured = _measure(
                    loaded,
                    settings,
                    docs,
                    length,
                    lambda d, t: emit("step", {"done": d, "total": t}),
                )
                record = {**measured, "same_as": None}
        finally:
            unpatch(model)
        record.update(
            key=key,
            scaling=name,
            factor=factor,
            length=length,
            rope=_spelled(scaling),
        )
        atomic_write(
            path,
            (
                json.dumps({"fingerprint": fingerprint, "record": record}, allow_nan=False) + "\n"
            ).encode(),
        )
        seen.setdefault(length, []).append((tables, record))
        records.append(record)
        emit("done", record)
    return records


def _spelled(scaling: Any) -> dict[str, Any] | None:
    """The unit's scaling as ``results.json`` holds it (posenc's spelling)."""
    if scaling is None or isinstance(scaling, dict):
        return scaling
    import dataclasses

    fields = {f.name: getattr(scaling, f.name) for f in dataclasses.fields(scaling) if f.init}
    return {"type": scaling.type, **{k: v for k, v in fields.items() if v is not None}}
