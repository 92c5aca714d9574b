"""``posenc extend --emit``: the measured scaling written in each engine's own spelling,
each artifact read back and checked against the module that was measured.

:func:`write_emit` writes ``OUT/emit/<engine>/``:

- ``transformers/config.json``: the model's config with ``rope_parameters`` (as ``--save``
  writes it);
- ``vllm/command.sh`` and ``hf_overrides.json``; ``sglang/command.sh`` and
  ``override.json``; ``llama.cpp/command.sh``;
- ``gguf/<stem>.<scaling>x<factor>.gguf`` (a copy of the input GGUF file with the scaling in
  its metadata, tensor bytes hash-checked: :func:`posenc.integrations.gguf_write.write_scaled_gguf`)
  and ``command.sh``; ``ollama/Modelfile`` (``FROM`` that copy) and ``command.sh``.

The spellings are :mod:`posenc.integrations.engines`'; an engine that cannot take the
scaling is recorded as refused (its one-line reason), or raises where the caller asked for it
by name (:func:`check_emit` up front, ``strict=True`` here). Read back: the config through
``rotary_from_config`` and the GGUF copy through ``rotary_from_gguf`` (before it is renamed
into place) must give, for every layer type, cos/sin over positions ``0..target-1`` equal to
the measured module's (:func:`tolerance`); vLLM's and SGLang's keys must each be one their
source reads (``VLLM_KEYS`` / ``SGLANG_KEYS``). A mismatch raises: a setting that does not
reproduce what was measured is never left written.
"""

from __future__ import annotations

import functools
import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc._errors import PosEncError, check_bool, check_choice, check_float, check_int, describe
from posenc._files import atomic_write
from posenc.extend.model import Loaded, map_for, scaling_for, split_spec
from posenc.extend.readback import cos_sin_gap, layer_pairs, measured_ropes
from posenc.extend.save import rope_parameters_for
from posenc.extend.settings import CONFIG, FACTOR_SCALINGS, REMAPS, SCALING_NAMES, trained_fields
from posenc.integrations import engines as _engines
from posenc.integrations.engines import ENGINES, EngineSetting, engine_setting
from posenc.integrations.spelling import to_rope_parameters
from posenc.integrations.transformers import rotary_from_config

__all__ = ["NEEDS_GGUF", "check_emit", "default_engines", "tolerance", "write_emit"]

#: The engines whose artifact is a copy of the input GGUF file (refused for a model folder).
NEEDS_GGUF = ("gguf", "ollama")
_FLOAT64_ULPS = 8  # angles off by a few float64 roundings where two formulas meet
_FLOAT32_ULPS = 4  # a GGUF key is float32: a parameter off by half an ulp, with margin


def default_engines(is_gguf: bool) -> tuple[str, ...]:
    """The engines ``--emit`` writes by default: all of them for a GGUF input; without the
    GGUF copy and ollama (which runs that copy) for a model folder."""
    return ENGINES if is_gguf else tuple(e for e in ENGINES if e not in NEEDS_GGUF)


def _check_names(engines: Sequence[str], is_gguf: bool) -> tuple[str, ...]:
    """The engines asked for (the argument ``engines``, ``--emit`` on the command line)."""
    if not isinstance(engines, (list, tuple)):
        raise PosEncError(f"engines must be a list of engine names, got {describe(engines)}")
    names = tuple(check_choice("engines", e, ENGINES) for e in engines)
    if len(set(names)) != len(names):
        raise PosEncError(f"engines must not repeat an engine, got {list(names)}")
    for name in names:
        if name in NEEDS_GGUF and not is_gguf:
            raise PosEncError(
                f"emit {name!r} needs a .gguf model (it writes a copy of that file), got a "
                f"model folder"
            )
    return names


def _probe_parameters(scaling: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A ``rope_parameters`` dict of scaling ``scaling`` (factor 2 of ``L`` = 4096, base
    1e4, 64 rotated channels), and a position map's config (its own rule for 4096 and 8192
    tokens): what an engine is asked whether it can take that scaling."""
    spec: dict[str, Any] | None = None
    if scaling in FACTOR_SCALINGS:
        spec = {"type": scaling, "factor": 2.0, **dict.fromkeys(trained_fields(scaling), 4096)}
    remap = map_for(scaling, 4096, 8192) if scaling in REMAPS else None
    return to_rope_parameters(spec, base=1e4, rotary_dim=64), remap


def check_emit(engines: Sequence[str], scaling: str, is_gguf: bool) -> None:
    """Refuse, before anything runs, an ``--emit`` request that cannot be written: an unknown
    or repeated engine, ``gguf`` / ``ollama`` without a ``.gguf`` model, or a scaling one of
    the engines cannot take (``config``, the model's own, is known only once it is loaded;
    :func:`write_emit` with ``strict=True`` refuses it then).

    Raises:
        PosEncError: naming the engine (and the scaling).
    """
    names = _check_names(engines, check_bool("is_gguf", is_gguf))
    check_choice("scaling", scaling, SCALING_NAMES)
    if scaling == CONFIG:
        return
    params, remap = _probe_parameters(scaling)
    for name in names:
        engine_setting(
            name, params, trained=4096, target=8192, arch="llama", model="MODEL", position_map=remap
        )


def tolerance(target: int, *, float32_keys: bool) -> float:
    """The largest difference allowed between a read-back module's cos/sin and the measured
    one's over positions ``0..target-1``, where their parameters or formulas differ (where
    both are the same module, the check is exact): angles ``p * w`` (``w <= 1``) off by a
    few float64 roundings, ``8 * target * 2^-53``; a GGUF key being float32 (a base or a
    factor not exact in float32) moves the angle by up to ``target * 2^-24`` per key, hence
    ``4 * target * 2^-24`` there. Any spelling mistake (a factor, a type, an original
    context) moves the angles by far more at the longer positions."""
    ulps = _FLOAT32_ULPS * 2.0**-24 if float32_keys else _FLOAT64_ULPS * 2.0**-53
    return target * ulps


def _measured(loaded: Loaded, scaling: str, factor: float) -> dict[str | None, Any]:
    """The rotary module of each layer type, as the measured run patched them in."""
    return measured_ropes(loaded, scaling_for(scaling, factor, loaded))


def _compare(
    what: str,
    ours: Mapping[str | None, Any],
    theirs: Mapping[str | None, Any],
    target: int,
    float32_keys: bool,
) -> str:
    """Check each layer type's cos/sin; the sentence ``checked`` records."""
    worst, allowed = 0.0, tolerance(target, float32_keys=float32_keys)
    for key, rope, measured in layer_pairs(what, ours, theirs):
        # the same parameters and formula: the same bits, or the spelling is wrong
        bound = 0.0 if rope.to_config() == measured.to_config() else allowed

        def channels(a: int, b: int, key: str | None = key) -> str:
            return (
                f"{what} does not reproduce the measured RoPE: layer type {key!r} rotates "
                f"{a} channels, the measured one {b}"
            )

        worst = max(worst, cos_sin_gap(rope, measured, target, channels))
        if worst > bound:
            raise PosEncError(
                f"{what} does not reproduce the measured RoPE: layer type {key!r} cos/sin "
                f"differ by {worst:.3g} over positions 0..{target - 1} (allowed {bound:.3g})"
            )
    if worst == 0.0:
        return f"{what}: cos/sin over positions 0..{target - 1} equal to the measured module's"
    return (
        f"{what}: cos/sin over positions 0..{target - 1} within {worst:.2g} of the measured "
        f"module's (allowed {allowed:.2g})"
    )


def _rope_parameters(loaded: Loaded, scaling: str, factor: float) -> dict[str, Any]:
    """The ``rope_parameters`` the engines get: one dict, or one per layer type (nested)."""
    config = loaded.model.config.get_text_config()
    params = rope_parameters_for(loaded, scaling, factor)  # a GGUF file's own scaling too
    if loaded.scaled_types == [None]:
        return params
    return {**config.rope_parameters, **dict.fromkeys(loaded.scaled_types, params)}


class _Job:
    """One ``write_emit`` call: what every engine's writer needs, and the GGUF copy once."""

    def __init__(self, loaded: Loaded, scaling: str, factor: float, target: int, out: Path):
        self.loaded, self.scaling, self.factor, self.target = loaded, scaling, factor, target
        self.out = out
        self.rope = _rope_parameters(loaded, scaling, factor)
        self.map = split_spec(scaling_for(scaling, factor, loaded))[0]  # a position map's
        self.arch = _arch(loaded)
        self.copy: dict[str, Any] | None = None  # the GGUF copy, once written

    @functools.cached_property
    def measured(self) -> dict[str | None, Any]:  # what read-backs compare (not for a map)
        return _measured(self.loaded, self.scaling, self.factor)

    def folder(self, engine: str) -> Path:
        folder = self.out / "emit" / engine
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def relative(self, path: Path) -> str:
        return path.relative_to(self.out).as_posix()

    def setting(self, engine: str, model: str) -> EngineSetting:
        return engine_setting(
            engine,
            self.rope,
            trained=self.loaded.trained,
            target=self.target,
            arch=self.arch,
            model=model,
            position_map=self.map,
        )

    def copy_name(self) -> str:
        return f"{self.loaded.path.stem}.{self.scaling}x{self.factor:g}.gguf"

    def model_for(self, engine: str) -> str:
        """The model as ``engine``'s command names it: the input's file or folder name, the
        GGUF copy's name, or its path from ollama's folder."""
        if engine == "gguf":
            return self.copy_name()
        if engine == "ollama":
            return f"../gguf/{self.copy_name()}"
        return self.loaded.path.name


def _arch(loaded: Loaded) -> str:
    """The GGUF architecture: the file's own, or the model type of a folder."""
    if loaded.path.is_file():
        from posenc.integrations.gguf import gguf_rope_metadata

        arch = gguf_rope_metadata(loaded.path).get("general.architecture")
        if isinstance(arch, str):
            return arch
    return str(loaded.identity.get("model_type", "llama"))


def _plain(value: Any) -> Any:
    """``value`` in JSON's shapes, by a round trip through JSON: NumPy scalars as Python
    numbers, tuples as lists, every mapping a dict with string keys."""

    def unknown(v: Any) -> Any:
        if isinstance(v, Mapping):
            return dict(v)
        if isinstance(v, np.generic):
            return v.item()
        raise TypeError(f"{type(v).__name__} is not a JSON value")

    return json.loads(json.dumps(value, default=unknown))


def _script(job: _Job, setting: EngineSetting, *, alternative: str | None = None) -> bytes:
    """``command.sh``: what it runs, the warnings as comments, the environment, the command
    (and an ``alternative`` command as a comment)."""
    env = setting.settings.get("env") or {}
    lines = [
        "#!/bin/sh",
        f"# posenc extend: {job.loaded.identity.get('name', job.loaded.path.name)} with "
        f"{job.scaling} (factor {job.factor:g}) for {job.target} tokens, as "
        f"{setting.engine} spells it",
        *(f"# warning: {' '.join(w.split())}" for w in setting.warnings),
        *(f"export {k}={shlex.quote(str(v))}" for k, v in env.items()),
        str(setting.command),
        *([f"# or: {alternative}"] if alternative else []),
    ]
    return ("\n".join(lines) + "\n").encode("utf-8")


def _record(job: _Job, setting: EngineSetting, files: list[Path], checked: str) -> dict[str, Any]:
    return {
        "files": [job.relative(f) for f in files],
        "command": setting.command,
        "settings": _plain(setting.settings),
        "warnings": list(setting.warnings),
        "checked": checked,
    }


def _transformers(job: _Job, setting: EngineSetting) -> dict[str, Any]:
    """``config.json``: the model's config with the setting's ``rope_parameters`` and
    ``max_position_embeddings``, read back by transformers and ``rotary_from_config``."""
    import transformers

    model_config = job.loaded.model.config
    text = model_config.get_text_config()
    before = (text.rope_parameters, text.max_position_embeddings)
    quantization = getattr(model_config, "quantization_config", None)
    try:
        text.rope_parameters = setting.settings["rope_parameters"]
        text.max_position_embeddings = setting.settings["max_position_embeddings"]
        if quantization is not None:  # a GGUF's: the config goes with dequantized weights
            del model_config.quantization_config
        data = model_config.to_json_string(use_diff=True).encode("utf-8")
    finally:
        text.rope_parameters, text.max_position_embeddings = before
        if quantization is not None:
            model_config.quantization_config = quantization
    path = job.folder("transformers") / "config.json"
    atomic_write(path, data)
    try:
        back = transformers.AutoConfig.from_pretrained(path.parent).get_text_config()
        theirs = {t: rotary_from_config(back, layer_type=t) for t in job.loaded.layer_types}
        checked = _compare("transformers' config.json", job.measured, theirs, job.target, False)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return _record(job, setting, [path], checked)


def _keys_read(engine: str, table: Mapping[str, frozenset[str]], settings: Any) -> str:
    """Check every RoPE dict in ``settings`` holds only keys ``engine`` reads for its type."""
    found: list[Mapping[str, Any]] = []

    def walk(value: Any) -> None:
        if isinstance(value, Mapping):
            if "rope_type" in value or "type" in value:
                found.append(value)
            else:
                for item in value.values():
                    walk(item)

    walk(settings)
    if not found:
        raise PosEncError(f"{engine}'s setting holds no RoPE parameters to check")
    for rope in found:
        kind = str(rope.get("rope_type", rope.get("type")))
        extra = sorted(set(rope) - table.get(kind, frozenset()))
        if extra:
            raise PosEncError(
                f"{engine}'s setting has keys {extra} that {engine} does not read for rope "
                f"type {kind!r} (they would be dropped without a word)"
            )
    kinds = sorted({str(r.get("rope_type", r.get("type"))) for r in found})
    return f"every key one {engine} reads for rope type {', '.join(kinds)}"


#: The engines served from a model folder with JSON overrides: the setting's key that holds
#: them, the keys the engine reads per rope type, and the file they are written to.
_OVERRIDES = {
    "vllm": ("hf_overrides", _engines.VLLM_KEYS, "hf_overrides.json"),
    "sglang": ("json_model_override_args", _engines.SGLANG_KEYS, "override.json"),
}


def _overrides(job: _Job, setting: EngineSetting) -> dict[str, Any]:
    """vLLM's or SGLang's ``command.sh`` and its JSON overrides, each RoPE key in them one the
    engine reads."""
    key, table, name = _OVERRIDES[setting.engine]
    overrides = setting.settings[key]
    checked = _keys_read(setting.engine, table, overrides)
    folder = job.folder(setting.engine)
    files = [folder / "command.sh", folder / name]
    atomic_write(files[0], _script(job, setting))
    atomic_write(files[1], (json.dumps(_plain(overrides), indent=2) + "\n").encode())
    return _record(job, setting, files, checked)


def _llama_cpp(job: _Job, setting: EngineSetting) -> dict[str, Any]:
    path = job.folder("llama.cpp") / "command.sh"
    atomic_write(path, _script(job, setting, alternative=setting.settings.get("llama_cli")))
    checked = "flags not read back here: benchmarks/engines.py runs them in llama.cpp " + (
        "(the GGUF copy carries the same setting as keys, read back)"
        if job.map is None
        else "(group attention: llama.cpp moves the cached positions as it runs)"
    )
    return _record(job, setting, [path], checked)


def _gguf_copy(job: _Job) -> dict[str, Any]:
    """The GGUF copy (written once): the setting's metadata, read back by
    ``rotary_from_gguf`` before the copy is renamed into place."""
    if job.copy is not None:
        return job.copy
    from posenc.integrations.gguf import gguf_layer_types, rotary_from_gguf
    from posenc.integrations.gguf_write import write_scaled_gguf

    name = job.copy_name()
    setting = job.setting("gguf", job.model_for("gguf"))
    path = job.folder("gguf") / name
    checked: list[str] = []

    def check(tmp: Path) -> None:
        theirs = {
            t: rotary_from_gguf(tmp, layer=t, layout_for="transformers")
            for t in gguf_layer_types(tmp)
        }
        checked.append(_compare("the GGUF copy", job.measured, theirs, job.target, True))

    metadata, stale = _without_stale(job, setting.settings["metadata"])
    done = write_scaled_gguf(
        job.loaded.path,
        path,
        metadata,
        types=setting.settings.get("types"),
        overwrite=True,
        check=check,
    )
    removed = f"; the input's {', '.join(stale)} removed" if stale else ""
    job.copy = {
        "path": path,
        "setting": setting,
        "checked": f"{checked[0]}; tensor bytes equal to the input's (SHA-256 "
        f"{done['tensor_sha256']}){removed}",
        "tensor_sha256": done["tensor_sha256"],
    }
    return job.copy


def _without_stale(job: _Job, metadata: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``metadata`` with the input's other ``{arch}.rope.scaling.*`` keys removed (``None``)
    where it sets the scaling type: the copy says the chosen scaling and nothing else (a
    YaRN key left over from the input's own scaling would be read with the new type)."""
    from posenc.integrations.gguf import gguf_rope_metadata

    prefix = f"{job.arch}.rope.scaling."
    out = dict(metadata)
    if prefix + "type" not in out:
        return out, []  # the input's own scaling (Llama 3's, LongRoPE's tensors) kept
    stale = [k for k in gguf_rope_metadata(job.loaded.path) if k.startswith(prefix)]
    stale = [k for k in stale if k not in out]
    out.update(dict.fromkeys(stale))
    return out, stale


def _gguf(job: _Job, setting: EngineSetting) -> dict[str, Any]:
    copy = _gguf_copy(job)
    script = job.folder("gguf") / "command.sh"
    atomic_write(script, _script(job, setting))
    record = _record(job, setting, [copy["path"], script], copy["checked"])
    record["tensor_sha256"] = copy["tensor_sha256"]
    return record


def _ollama(job: _Job, setting: EngineSetting) -> dict[str, Any]:
    copy = _gguf_copy(job)
    folder = job.folder("ollama")
    path, script = folder / "Modelfile", folder / "command.sh"
    atomic_write(path, str(setting.settings["modelfile"]).encode("utf-8"))
    atomic_write(script, _script(job, setting))
    checked = f"FROM the GGUF copy, read back: {copy['checked']}"
    return _record(job, setting, [path, script, copy["path"]], checked)


#: The engines whose setting an engine's artifact needs (ollama: the GGUF copy's too).
_NEEDS = {"ollama": ("gguf", "ollama")}

_WRITERS: dict[str, Callable[[_Job, EngineSetting], dict[str, Any]]] = {
    "transformers": _transformers,
    "vllm": _overrides,
    "sglang": _overrides,
    "llama.cpp": _llama_cpp,
    "gguf": _gguf,
    "ollama": _ollama,
}


def write_emit(
    loaded: Loaded,
    scaling: str,
    factor: float,
    target: int,
    out: Path,
    engines: Sequence[str],
    *,
    strict: bool = False,
) -> dict[str, Any]:
    """Write scaling ``scaling`` at ``factor`` (for ``target`` tokens) of ``loaded`` in each
    engine's spelling under ``out/emit/<engine>/``; returns ``results["emit"]``: per
    engine ``{"files": [paths relative to out], "command", "settings", "warnings",
    "checked"}`` (the GGUF copy also ``"tensor_sha256"``), or ``{"refused": reason}`` where
    the engine cannot take the scaling (``strict``: raised instead).

    Raises:
        PosEncError: an unknown or repeated engine, ``gguf`` / ``ollama`` for a model folder,
            a scaling an engine cannot take (``strict`` only), an artifact that does not read
            back as the measured module (nothing of it is left written).
        OSError: the environment refuses a write (a read-only folder, a full disk).
    """
    names = _check_names(engines, loaded.path.is_file())
    check_choice("scaling", scaling, SCALING_NAMES)
    target = check_int("target", target, min=1)
    factor = check_float("factor", factor, min=1.0)
    job = _Job(loaded, scaling, factor, target, Path(out))
    results: dict[str, Any] = {}
    for name in names:
        try:  # ollama runs the GGUF copy: refused where the copy is
            settings = [job.setting(n, job.model_for(n)) for n in _NEEDS.get(name, (name,))]
        except PosEncError as error:
            if strict:
                raise
            reason = str(error)
            if name == "ollama" and "ollama" not in reason:
                reason = f"ollama runs the GGUF copy, which is refused: {reason}"
            results[name] = {"refused": reason}
            continue
        results[name] = _WRITERS[name](job, settings[-1])
    return results
