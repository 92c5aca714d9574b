"""``ExtendSettings``: everything one ``posenc extend`` run measures, checked once.

The model's trained context ``L`` is known only once its config is read, so lengths are
given relative to it (``to``: the longest, as a multiple of ``L``; ``lengths``: the
multiples measured) and made absolute by :meth:`ExtendSettings.lengths_for`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc._errors import PosEncError, check_choice, check_device, check_float, check_int
from posenc.rotary.frequencies import SCALINGS

__all__ = [
    "CONFIG",
    "DTYPES",
    "ENGINE_NAMES",
    "FACTOR_SCALINGS",
    "MAP_TYPE",
    "NONE",
    "QUICK_SCALINGS",
    "REMAPS",
    "SCALING_NAMES",
    "SELF_EXTEND",
    "STRING",
    "TASK_NAMES",
    "UNSCALED",
    "ExtendSettings",
    "trained_fields",
]

#: ``posenc extend``'s own names beside the registry's: ``none``, no scaling (the baseline),
#: and ``config``, the model's own configured scaling (Llama 3, LongRoPE, YaRN, ...),
#: measured only where the model's config has one. Both run at factor 1 (:data:`UNSCALED`).
NONE, CONFIG = "none", "config"
UNSCALED = (NONE, CONFIG)
#: The fields of a scaling's parameters that take the trained context ``L``.
_TRAINED_FIELDS = ("max_position", "original_max_position")


def _required(cls: Any) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.init
        and (
            (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
            or f.metadata.get("required")
        )
    ]


def _factor_scalings() -> dict[str, tuple[str, ...]]:
    """The registered RoPE scalings set from a factor alone (the target length over ``L``)
    and at most ``L`` itself, over the rotated channels as every extension is (not
    p-RoPE's whole head): name -> the required fields that take ``L``, in the registry's
    order."""
    found = {}
    for name, (cls, _) in SCALINGS.items():
        fields = {f.name for f in dataclasses.fields(cls) if f.init}
        required = _required(cls)
        if (
            "factor" in fields
            and set(required) <= {"factor", *_TRAINED_FIELDS}
            and getattr(cls, "frequency_span", "rotary_dim") == "rotary_dim"
        ):
            found[name] = tuple(f for f in required if f in _TRAINED_FIELDS)
    return found


_FACTOR_SCALINGS = _factor_scalings()
#: The registry's scalings ``posenc extend`` measures (``linear``, ``ntk``, ``dynamic``,
#: ``yarn``), each set from the factor ``length / L``.
FACTOR_SCALINGS = tuple(_FACTOR_SCALINGS)
#: The position maps ``posenc extend`` measures (:mod:`posenc.remap`), by their command-line
#: names: each remaps positions inside attention, with parameters from ``L`` and the target
#: (:func:`posenc.extend.model.scaling_for`).
SELF_EXTEND, STRING = "self-extend", "string"
REMAPS = (SELF_EXTEND, STRING)
#: The ``"type"`` of each map's config (:data:`posenc.remap.MAP_TYPES`).
MAP_TYPE = {SELF_EXTEND: "self_extend", STRING: "string"}
#: The scalings ``posenc extend`` knows, in the order they are measured and shown.
SCALING_NAMES = (NONE, *FACTOR_SCALINGS, *REMAPS, CONFIG)
#: ``--quick``'s scalings: none and the two maps (STRING past ``L`` runs with YaRN); the
#: formula scalings are left to the full run, as a remapped prefill costs about two plain ones.
QUICK_SCALINGS = (NONE, *REMAPS, CONFIG)


def trained_fields(name: str) -> tuple[str, ...]:
    """The fields of scaling ``name`` (one of :data:`FACTOR_SCALINGS`) that take ``L``."""
    return _FACTOR_SCALINGS[name]


DTYPES = ("float32", "bfloat16", "float16", "float64")
#: Depths the probes' needles are spread over (fractions of the haystack before them).
DEFAULT_DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
#: The probe tasks (RULER's, :data:`posenc.extend.probes.TASKS`), in the order shown.
TASK_NAMES = ("passkey", "multikey", "multivalue", "vartrack")
#: The engines ``--emit`` writes the chosen setting for
#: (:data:`posenc.integrations.engines.ENGINES`).
ENGINE_NAMES = ("transformers", "vllm", "sglang", "llama.cpp", "gguf", "ollama")


@dataclasses.dataclass(frozen=True)
class ExtendSettings:
    """What ``posenc extend`` measures (see :meth:`from_options` for the checks).

    Attributes:
        model: a transformers model folder or a ``.gguf`` file.
        to: the longest length measured, as a multiple of the trained context ``L``.
        multiples: the lengths measured, as multiples of ``L`` (each ``<= to``; ``to``
            always included). ``none`` at ``L`` is always measured too: the baseline.
        scalings: names from :data:`SCALING_NAMES`.
        texts: the documents perplexity is measured on (empty: the longest Python
            standard-library sources).
        documents: how many documents (the longest first).
        depths: the depths in ``(0, 1)`` the probes' needles are spread over.
        trials: haystacks per ``(scaling, length)``: each is prefilled once and carries
            the needles of every task (0: no probe).
        tasks: the probe tasks, from :data:`TASK_NAMES`.
        seed: the probes' needles, keys and values come from it.
        bar: the fraction of the model's own unscaled score, at the shortest length, a
            scaling must keep on a task to hold there.
        ppl_tolerance: how far perplexity may rise above ``none`` at ``L`` (a fraction)
            for a scaling to hold.
        emit: the engines the chosen setting is written for (empty: every engine that
            applies, :data:`ENGINE_NAMES`; ``gguf`` and ``ollama`` only for a .gguf model).
        scaling: the scaling ``emit`` (and ``--save``) write, set for the longest length
            (None: the answer's choice).
        dtype, device: where the model runs; ``device_map="auto"`` when ``device`` is
            ``"auto"`` (several GPUs).
        context: the trained context ``L`` when given (default: the config's
            ``max_position_embeddings``).
        quick: a short run (one document, one haystack asking the passkey; ``none`` at
            ``L``, and ``none``, ``self-extend`` and ``string`` at ``1.25 L``).
        search, search_length, search_population: the per-band factor search
            (:mod:`posenc.extend.search`): its budget in minutes (None: no search), its
            scoring length (one of ``multiples`` above 1; default ``to``), its population.
    """

    model: str
    to: float = 2.0
    multiples: tuple[float, ...] = (1.0, 1.5, 2.0)
    scalings: tuple[str, ...] = SCALING_NAMES
    texts: tuple[str, ...] = ()
    documents: int = 3
    depths: tuple[float, ...] = DEFAULT_DEPTHS
    trials: int = 2
    tasks: tuple[str, ...] = TASK_NAMES
    seed: int = 0
    bar: float = 0.9
    ppl_tolerance: float = 0.1
    emit: tuple[str, ...] = ()
    scaling: str | None = None
    dtype: str = "float32"
    device: str = "cpu"
    context: int | None = None
    quick: bool = False
    search: float | None = None
    search_length: float | None = None
    search_population: int = 8

    @classmethod
    def from_options(cls, model: str | Path, **options: Any) -> ExtendSettings:
        """The settings of a run, every option checked (``PosEncError`` naming it).

        ``quick=True`` sets, unless given: ``to=1.25``, ``multiples=(to,)``, one document,
        one haystack asking the passkey only, and the scalings of :data:`QUICK_SCALINGS`
        (``none``, ``self-extend``, ``string`` and ``config``), to fit five minutes for a
        135M model on 2 cores.
        """
        if options.get("quick"):
            quick = {
                "to": 1.25,
                "documents": 1,
                "trials": 1,
                "tasks": ["passkey"],
                "scalings": [s for s in QUICK_SCALINGS if s in SCALING_NAMES],
            }
            options = {**quick, **{k: v for k, v in options.items() if v is not None}}
        options = {k: v for k, v in options.items() if v is not None}
        model = check_model(model)
        to = check_float("to", options.pop("to", 2.0), min=1.0, max=64.0)
        multiples = _multiples(options.pop("multiples", None), to, bool(options.get("quick")))
        scalings = _names(
            "scalings", options.pop("scalings", SCALING_NAMES), SCALING_NAMES, empty=False
        )
        depths = tuple(
            check_float("depths", d, min=0.0, max=1.0)
            for d in _sequence("depths", options.pop("depths", DEFAULT_DEPTHS))
        )
        if not depths or any(d in (0.0, 1.0) for d in depths):
            raise PosEncError(f"depths must be fractions strictly between 0 and 1, got {depths}")
        context = options.pop("context", None)
        tasks = _names("tasks", options.pop("tasks", TASK_NAMES), TASK_NAMES, empty=False)
        emit = _names("emit", options.pop("emit", ()), ENGINE_NAMES, empty=True)
        scaling = options.pop("scaling", None)
        settings = cls(
            model=model,
            to=to,
            multiples=multiples,
            scalings=scalings,
            texts=tuple(_model_text(t) for t in _sequence("texts", options.pop("texts", ()))),
            documents=check_int("documents", options.pop("documents", 3), min=1, max=100),
            depths=depths,
            trials=check_int("trials", options.pop("trials", 2), min=0, max=100),
            tasks=tasks,
            seed=check_int("seed", options.pop("seed", 0), min=0, max=2**31 - 1),
            bar=check_float("bar", options.pop("bar", 0.9), min=0.0, max=1.0, min_exclusive=True),
            ppl_tolerance=check_float(
                "ppl_tolerance", options.pop("ppl_tolerance", 0.1), min=0.0, max=100.0
            ),
            emit=emit,
            scaling=None if scaling is None else check_choice("scaling", scaling, SCALING_NAMES),
            dtype=check_choice("dtype", options.pop("dtype", "float32"), DTYPES),
            device=_device(options.pop("device", "cpu")),
            context=None if context is None else check_int("context", context, min=16),
            quick=bool(options.pop("quick", False)),
            **_search_fields(options, multiples),
        )
        if options:
            raise PosEncError(f"unknown option(s) {sorted(options)} for ExtendSettings")
        return settings

    def lengths_for(self, trained: int) -> list[int]:
        """The lengths measured for a model trained at ``trained`` tokens (``multiple *
        trained`` rounded to whole tokens, ascending, no repeats; ``L`` itself only where
        ``multiples`` has 1)."""
        return sorted({round(multiple * trained) for multiple in self.multiples})

    def to_record(self) -> dict[str, Any]:
        """The settings as ``results.json`` holds them (what a resumed run must match)."""
        return dataclasses.asdict(self)


#: The most minutes ``search`` may ask for (a week).
MAX_SEARCH_MINUTES = 7 * 24 * 60.0


def _search_fields(options: dict[str, Any], multiples: tuple[float, ...]) -> dict[str, Any]:
    """``search``, ``search_length`` and ``search_population`` popped from ``options`` and
    checked: a budget in ``(0, a week]`` minutes; a scoring length among ``multiples`` and
    above 1 (LongRoPE's long factors apply past ``L``), default the longest; the two others
    only with ``search``."""
    minutes = options.pop("search", None)
    length = options.pop("search_length", None)
    population = options.pop("search_population", None)
    if minutes is None:
        for name, value in (("search_length", length), ("search_population", population)):
            if value is not None:
                raise PosEncError(
                    f"{name} needs search (the search's minutes) too, got {name}={value!r} "
                    "without it"
                )
        return {}
    minutes = check_float("search", minutes, min=0.0, min_exclusive=True, max=MAX_SEARCH_MINUTES)
    if max(multiples) <= 1.0:
        raise PosEncError(
            "search needs a length past L (to > 1): LongRoPE's long factors apply only there, "
            f"got to = {max(multiples):g}"
        )
    length = max(multiples) if length is None else check_float("search_length", length)
    if length <= 1.0 or length not in multiples:
        above = ", ".join(f"{m:g}" for m in multiples if m > 1.0)
        raise PosEncError(
            f"search_length must be one of the measured multiples of L above 1 ({above}), "
            f"got {length:g}"
        )
    return {
        "search": minutes,
        "search_length": length,
        "search_population": check_int(
            "search_population", 8 if population is None else population, min=4, max=256
        ),
    }


def _multiples(given: Sequence[float] | None, to: float, quick: bool) -> tuple[float, ...]:
    if given is None:
        if quick:
            return (to,)
        steps = [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0]
        return tuple(sorted({*(m for m in steps if m < to), to}))
    name = "multiples (--lengths)"
    values = {check_float(name, m, min=1.0, max=to) for m in _sequence(name, given)}
    return tuple(sorted(values | {to}))


def _names(name: str, value: Any, known: Sequence[str], *, empty: bool) -> tuple[str, ...]:
    """``value`` as a tuple of names from ``known``, each once (none at all only where
    ``empty``)."""
    names = _sequence(name, value)
    if not names and not empty:
        raise PosEncError(f"{name} must name at least one of {', '.join(known)}, got none")
    for item in names:
        check_choice(name, item, tuple(known))
    if len(set(names)) != len(names):
        raise PosEncError(f"{name} must not repeat a name, got {list(names)}")
    return tuple(names)


def _sequence(name: str, value: Any) -> tuple[Any, ...]:
    """``value`` as a tuple: a list or tuple only (a set has no order, a string is one)."""
    if not isinstance(value, (list, tuple)):
        raise PosEncError(f"{name} must be a list or tuple, got {type(value).__name__} {value!r}")
    return tuple(value)


def check_model(model: Any) -> str:
    """``model`` as a path string: a model folder or a ``.gguf`` file that exists."""
    if not isinstance(model, (str, os.PathLike)) or not str(model).strip():
        raise PosEncError(f"model must name a model folder or a .gguf file, got {model!r}")
    path = Path(model)
    if not path.exists():
        raise PosEncError(
            f"model must be a model folder or a .gguf file, got {str(path)!r} (no such path)"
        )
    if path.is_file() and path.suffix != ".gguf":
        raise PosEncError(
            f"model must be a model folder or a .gguf file, got the file {str(path)!r}"
        )
    return str(path)


def _device(device: Any) -> str:
    """``"auto"`` (``device_map="auto"``), or a device this torch can use, by name."""
    if device == "auto":
        return "auto"
    checked = check_device("device", device)
    if checked is None or checked.type == "meta":
        raise PosEncError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {device!r}")
    return str(checked)


def _model_text(text: Any) -> str:
    if not isinstance(text, (str, os.PathLike)) or not str(text).strip():
        raise PosEncError(f"texts must be paths of text files, got {text!r}")
    return str(text)
