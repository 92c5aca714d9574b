"""The model ``posenc extend`` measures: loaded through transformers (a model folder, or a
``.gguf`` file through its GGUF reader), identified by hash, and its RoPE scaled by
:func:`posenc.integrations.transformers.patch`.

A scaling ``name`` at ``factor`` is posenc's scaling dataclass for that name
(:func:`scaling_for`); models whose RoPE parameters differ per layer type (Gemma 3: local
layers at base 1e4 with a sliding window, global layers at 1e6) scale only the layer type
that sees the whole sequence (``full_attention``), since a sliding window never sees a
distance past its width.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from posenc._errors import PosEncError
from posenc._files import open_regular
from posenc.extend.settings import (
    CONFIG,
    FACTOR_SCALINGS,
    NONE,
    SCALING_NAMES,
    check_model,
    trained_fields,
)
from posenc.integrations.transformers import patch, rope_layer_types, rotary_from_config, unpatch

__all__ = ["Loaded", "file_sha256", "load_model", "scaled", "scaling_for"]

_WEIGHTS = (".safetensors", ".bin", ".pt", ".gguf", ".json", ".model", ".txt")


@dataclasses.dataclass
class Loaded:
    """A loaded model and what ``posenc extend`` needs to know of it."""

    model: Any
    tokenizer: Any
    path: Path  # the folder or .gguf file given
    identity: dict[str, Any]  # name, model_type, files and their SHA-256
    trained: int  # the trained context L
    layer_types: list[str | None]  # the RoPE layer types (None: one set of parameters)
    scaled_types: list[str | None]  # the layer types a scaling applies to
    configured: Any  # the config's own scaling dataclass (None: none)
    head_dim: int


def file_sha256(path: Path) -> str:
    """The SHA-256 of the regular file ``path`` (its size as ``fstat`` gives it, read in
    blocks; a FIFO or a device is refused, not read for ever)."""
    digest = hashlib.sha256()
    fd = open_regular(path, what="model file")
    with os.fdopen(fd, "rb") as file:
        left = os.fstat(fd).st_size
        while left > 0:
            block = file.read(min(left, 1 << 22))
            if not block:
                break
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_file() and p.suffix in _WEIGHTS)


@contextlib.contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    """transformers' loading progress bars and warnings off (posenc extend draws its own
    progress, and an error must be the one line on stderr), restored after."""
    logging = transformers.utils.logging
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def _from_pretrained(path: Path, dtype: str, device: str) -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as error:
        raise ImportError(
            "posenc extend needs transformers: pip install 'posenc[extend]'"
        ) from error
    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
    if device == "auto":
        kwargs["device_map"] = "auto"
    folder, gguf = (path.parent, {"gguf_file": path.name}) if path.is_file() else (path, {})
    if gguf:
        try:
            import gguf as _gguf  # noqa: F401  (transformers' GGUF reader needs it)
        except ImportError as error:
            raise ImportError(
                "reading a .gguf file needs gguf: pip install 'posenc[gguf]'"
            ) from error
    try:
        with _quiet(transformers):
            model = transformers.AutoModelForCausalLM.from_pretrained(folder, **gguf, **kwargs)
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder, **gguf)
    except (OSError, ValueError, KeyError, TypeError) as error:
        what = "GGUF file" if gguf else "model folder"
        message = " ".join(str(error).split())[:300]
        raise PosEncError(
            f"model {str(path)!r}: transformers cannot read this {what}: {message}"
        ) from None
    if device not in ("cpu", "auto"):
        cast(Any, model).to(torch.device(device))  # in place (transformers types .to oddly)
    return model.eval(), tokenizer


def load_model(
    model: str | os.PathLike[str], *, dtype: str, device: str, context: int | None
) -> Loaded:
    """Load ``model`` (a folder with a transformers config, or a ``.gguf`` file) and read
    its RoPE; refused (``PosEncError``, one line) if it is neither, cannot be read, or has
    no rotary embedding."""
    path = Path(check_model(model))
    if path.is_dir() and not (path / "config.json").is_file():
        raise PosEncError(f"model folder {str(path)!r} has no config.json")
    loaded, tokenizer = _from_pretrained(path, dtype, device)
    config = loaded.config.get_text_config()
    model_type = str(getattr(config, "model_type", "?"))
    layer_types = rope_layer_types(config)
    try:
        unpatch(patch(loaded))  # the family, its rotary modules and attention: patchable
        ropes = {t: rotary_from_config(config, layer_type=t) for t in layer_types}
    except PosEncError as error:
        raise PosEncError(
            f"model {str(path)!r} ({model_type}): no RoPE to scale: {error}"
        ) from None
    trained = context or getattr(config, "max_position_embeddings", None)
    if not isinstance(trained, int) or trained < 16:
        raise PosEncError(f"model {str(path)!r}: no trained context in its config; pass --context")
    scaled = [t for t in layer_types if t in (None, "full_attention")] or list(layer_types)
    first = ropes[scaled[0]].scaling
    if path.is_file() and first is None:
        first = _gguf_scaling(path, scaled[0])
    identity = {
        "path": str(path),
        # a .gguf file's name (transformers' _name_or_path is then only its folder)
        "name": path.stem
        if path.is_file()
        else str(getattr(loaded.config, "_name_or_path", "") or path.name),
        "model_type": model_type,
        "parameters": sum(p.numel() for p in loaded.parameters()),
        "files": {p.name: file_sha256(p) for p in _files(path)},
    }
    return Loaded(
        model=loaded,
        tokenizer=tokenizer,
        path=path,
        identity=identity,
        trained=int(trained),
        layer_types=layer_types,
        scaled_types=scaled,
        configured=first,
        head_dim=ropes[scaled[0]].rotary_dim,
    )


def _gguf_scaling(path: Path, layer_type: str | None) -> Any:
    """The scaling the GGUF file itself carries (llama.cpp's ``rope.scaling.*`` keys or its
    ``rope_freqs`` tensor), which transformers' GGUF reader drops: a Llama 3.1 file loads
    unscaled, and ``config`` puts its own scaling back. None where it has none or its
    metadata cannot be read by :func:`posenc.integrations.gguf.rotary_from_gguf`."""
    from posenc.integrations.gguf import rotary_from_gguf

    try:
        return rotary_from_gguf(path, layer=layer_type, layout_for="transformers").scaling
    except PosEncError:
        return None


def scaling_for(name: str, factor: float, loaded: Loaded) -> Any:
    """Scaling ``name`` at ``factor`` (the target length over ``L``) for ``loaded``, in
    posenc's spelling (what :func:`~posenc.integrations.transformers.patch` takes):
    ``None`` for ``none`` and for any scaling at factor 1; ``config`` is the model's own
    (its scaling dataclass, or None); a registered scaling of
    :data:`~posenc.extend.settings.FACTOR_SCALINGS` gets ``factor``, and ``L`` in the
    fields that take it."""
    if name == CONFIG:
        return loaded.configured
    if name not in FACTOR_SCALINGS and name != NONE:
        raise PosEncError(f"scaling must be one of {', '.join(SCALING_NAMES)}, got {name!r}")
    if name == NONE or factor <= 1.0:
        return None
    return {
        "type": name,
        "factor": factor,
        **dict.fromkeys(trained_fields(name), loaded.trained),
    }


def scaled(loaded: Loaded, scaling: Any) -> Any:
    """``loaded.model`` patched with ``scaling`` on its scaled layer types (the other layer
    types keep the config's); :func:`posenc.integrations.transformers.unpatch` undoes it."""
    if loaded.scaled_types == [None]:
        return patch(loaded.model, scaling=scaling if scaling is not None else {"type": "default"})
    spec = {t: scaling if scaling is not None else {"type": "default"} for t in loaded.scaled_types}
    return patch(loaded.model, scaling=spec)
