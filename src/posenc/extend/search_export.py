"""The factor search as a step of :func:`posenc.extend.run.run_extend`, and its export.

:func:`search_step` runs :func:`posenc.extend.search.run_search` (``--search MINUTES``) on
the validation document (:func:`posenc.extend.search_state.validation_document`) at
``--search-length``, for the run's longest length, before the units; the units ``search``
(:func:`search_units`, one per measured length, all at ``factor = target / L``) then
measure the best candidate on the evaluation documents like any scaling.

The best candidate is written under ``OUT/search/`` (:func:`export_search`):

- ``config.json``: the model's config with ``rope_parameters`` of ``rope_type: longrope``
  (``short_factor``, ``long_factor``, ``original_max_position_embeddings``, ``factor``;
  :func:`posenc.integrations.spelling.to_rope_parameters`) and ``max_position_embeddings``
  the target; read back by transformers and ``rotary_from_config``;
- for a ``.gguf`` model, ``<stem>.search.gguf``: a copy with the tensors
  ``rope_factors_long`` / ``rope_factors_short`` and llama.cpp's longrope keys
  (:func:`posenc.integrations.gguf_longrope.write_longrope_gguf`), read back by
  ``rotary_from_gguf`` before it is renamed into place.

Read back, the factors must equal the measured ones exactly (they are float32 numbers) and
cos/sin over positions ``0..target-1`` must agree with the measured module's within
:func:`posenc.extend.emit.tolerance`; a mismatch raises and leaves nothing written.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from posenc._errors import PosEncError
from posenc._files import atomic_write
from posenc.extend.data import Document
from posenc.extend.emit import tolerance
from posenc.extend.model import Loaded
from posenc.extend.readback import cos_sin_gap, layer_pairs, measured_ropes
from posenc.extend.search import SEARCH, SearchResult, run_search
from posenc.extend.search_state import validation_document
from posenc.integrations.spelling import to_rope_parameters
from posenc.integrations.transformers import rotary_from_config

__all__ = ["Searched", "export_search", "search_emit", "search_step", "search_units"]


@dataclasses.dataclass(frozen=True)
class Searched:
    """A finished search step: its result, what was exported, and the target length."""

    result: SearchResult
    export: dict[str, Any]
    target: int

    @property
    def record(self) -> dict[str, Any]:
        """``results["search"]``: the search's record with the export's."""
        return {**self.result.record, "export": self.export}

    def unit_fingerprint(self, fingerprint: dict[str, Any]) -> dict[str, Any]:
        """A ``search`` unit's fingerprint: the run's, with the factors it measures (a
        resumed run keeps a saved unit only for the same factors)."""
        return {**fingerprint, "search": list(self.result.scaling["long_factor"])}


def search_units(
    searched: Searched, lengths: Sequence[int], trained: int
) -> list[tuple[str, int, float]]:
    """The ``search`` units: every measured length at ``factor = target / L``."""
    return [(SEARCH, length, searched.target / trained) for length in lengths]


def search_step(
    loaded: Loaded,
    settings: Any,
    docs: Sequence[Document],
    lengths: Sequence[int],
    out: Path,
    resume: bool,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
) -> Searched | None:
    """The search of ``settings`` (an ``ExtendSettings``; None where ``--search`` is not
    given), scored on a document none of ``docs`` is, then exported."""
    if settings.search is None:
        return None
    if not getattr(loaded, "scalable", True):
        raise PosEncError(
            f"--search cannot run on model {loaded.identity.get('name')!r}: "
            f"{getattr(loaded, 'note', None) or 'no layer of it is scaled'}"
        )
    target = max(lengths)
    length = round(settings.search_length * loaded.trained)
    validation = validation_document(loaded.tokenizer, docs, length)
    result = run_search(
        loaded,
        validation,
        out,
        seed=settings.seed,
        minutes=settings.search,
        target=target,
        length=length,
        population=settings.search_population,
        resume=resume,
        on_event=on_event,
    )
    return Searched(result, export_search(loaded, result.scaling, target, out), target)


def _compare(
    what: str,
    ours: Mapping[str | None, Any],
    theirs: Mapping[str | None, Any],
    target: int,
    float32: bool,
) -> str:
    """Check each layer type read back: the same factors, cos/sin within the tolerance."""
    worst, allowed = 0.0, tolerance(target, float32_keys=float32)
    for key, rope, mine in layer_pairs(what, ours, theirs):
        if getattr(mine.scaling, "type", None) == "longrope":
            got = (
                getattr(rope.scaling, "long_factor", None),
                getattr(rope.scaling, "short_factor", None),
            )
            if got != (mine.scaling.long_factor, mine.scaling.short_factor):
                raise PosEncError(
                    f"{what} does not hold the searched factors (layer type {key!r}): got {got[0]}"
                )
        gap = cos_sin_gap(
            rope, mine, target, lambda a, b: f"{what} rotates {a} channels, the measured model {b}"
        )
        worst = max(worst, gap)
    if worst > allowed:
        raise PosEncError(
            f"{what} does not reproduce the measured RoPE: cos/sin differ by {worst:.3g} over "
            f"positions 0..{target - 1} (allowed {allowed:.3g})"
        )
    return (
        f"{what}: the searched factors read back equal; cos/sin over positions 0..{target - 1} "
        f"within {worst:.2g} of the measured module's (allowed {allowed:.2g})"
    )


def _config(
    loaded: Loaded, scaling: dict[str, Any], target: int, folder: Path, measured: dict
) -> dict[str, Any]:
    """``config.json`` with the searched ``rope_parameters``, read back by transformers."""
    import transformers

    model_config = loaded.model.config
    text = model_config.get_text_config()
    layer = loaded.scaled_types[0]
    old = text.rope_parameters if layer is None else text.rope_parameters[layer]
    rope = rotary_from_config(text, layer_type=layer)
    params = to_rope_parameters(
        scaling,
        base=float(rope.base),
        rotary_dim=rope.rotary_dim,
        partial_rotary_factor=(old or {}).get("partial_rotary_factor"),
    )
    new = (
        params
        if layer is None
        else {**text.rope_parameters, **dict.fromkeys(loaded.scaled_types, params)}
    )
    before = (copy.deepcopy(text.rope_parameters), text.max_position_embeddings)
    quantization = getattr(model_config, "quantization_config", None)
    try:
        text.rope_parameters, text.max_position_embeddings = new, target
        if quantization is not None:  # a GGUF's: the config goes with dequantized weights
            del model_config.quantization_config
        data = model_config.to_json_string(use_diff=True).encode("utf-8")
    finally:
        text.rope_parameters, text.max_position_embeddings = before
        if quantization is not None:
            model_config.quantization_config = quantization
    path = folder / "config.json"
    atomic_write(path, data)
    try:
        back = transformers.AutoConfig.from_pretrained(folder).get_text_config()
        theirs = {t: rotary_from_config(back, layer_type=t) for t in loaded.layer_types}
        checked = _compare("transformers' config.json", measured, theirs, target, False)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return {
        "files": ["search/config.json"],
        "command": "transformers.AutoConfig.from_pretrained('search/'), passed as config= "
        "to from_pretrained of the model",
        "settings": {"rope_parameters": params, "max_position_embeddings": target},
        "warnings": [],
        "checked": checked,
    }


def _gguf(
    loaded: Loaded, scaling: dict[str, Any], target: int, folder: Path, measured: dict
) -> dict[str, Any]:
    """The GGUF copy with the searched factors, read back before it is renamed in place."""
    from posenc.integrations.gguf import gguf_layer_types, rotary_from_gguf
    from posenc.integrations.gguf_longrope import write_longrope_gguf

    name = f"{loaded.path.stem}.search.gguf"
    checked: list[str] = []

    def check(tmp: Path) -> None:
        theirs = {
            t: rotary_from_gguf(tmp, layer=t, layout_for="transformers")
            for t in gguf_layer_types(tmp)
        }
        checked.append(_compare("the GGUF copy", measured, theirs, target, True))

    done = write_longrope_gguf(
        loaded.path, folder / name, scaling, target=target, overwrite=True, check=check
    )
    return {
        "files": [f"search/{name}"],
        "command": f"llama-server -m search/{name} -c {target}",
        "settings": {"metadata": done["set"]},
        "warnings": [
            "llama.cpp picks LongRoPE's long factors by the context size (-c), not per "
            "sequence (src/llama-model.cpp get_rope_factors, llama.cpp 0c1e570)"
        ],
        "checked": f"{checked[0]}; tensor SHA-256 {done['tensor_sha256']}",
        "tensor_sha256": done["tensor_sha256"],
    }


def export_search(
    loaded: Loaded, scaling: dict[str, Any], target: int, out: Path
) -> dict[str, Any]:
    """Write the searched ``scaling`` under ``out/search/`` (module docstring); returns
    ``{"transformers": record, "gguf": record}`` (``gguf`` only for a ``.gguf`` model), each
    record as ``results["emit"]`` holds an engine's."""
    folder = Path(out) / "search"
    folder.mkdir(parents=True, exist_ok=True)
    measured = measured_ropes(loaded, scaling)
    export = {"transformers": _config(loaded, scaling, target, folder, measured)}
    if loaded.path.is_file():
        export["gguf"] = _gguf(loaded, scaling, target, folder, measured)
    return export


def search_emit(searched: Searched, engines: Sequence[str]) -> dict[str, Any]:
    """``results["emit"]`` where the choice is the searched factors: the export's records
    for ``transformers`` and ``gguf``; every other engine refused by name."""
    out: dict[str, Any] = {}
    for name in engines:
        if name in searched.export:
            out[name] = searched.export[name]
        else:
            out[name] = {
                "refused": f"{name}: the searched factors are written as transformers' "
                "config.json (search/config.json, whose rope_parameters vLLM and SGLang read "
                "too) and, for a .gguf model, as a GGUF copy (search/*.search.gguf)"
            }
    return out
