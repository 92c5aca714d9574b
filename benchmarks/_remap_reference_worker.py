"""The reference side of ``benchmarks/remap_reference.py``: runs INSIDE a reference venv
(transformers 4.38.2 for LongLM, 4.43.3 for STRING), never imports posenc.

    python _remap_reference_worker.py JOB.json

``JOB.json`` (written by ``remap_reference.py``) names the reference (``longlm`` or
``string``), its checkout, the shims folder, the model folder, the token ids and the cases;
the worker writes ``<out>/<reference>.npz`` (whole logits, float32 ``[tokens, vocab]`` per
entry) and ``<out>/<reference>.json`` (versions, what ran). The references are imported from
their checkout at run time; nothing of theirs is copied.

- ``build`` (LongLM's venv, once): the tiny random Llama, seeded, saved with safetensors.
- LongLM: ``plain`` (the model as loaded, eager attention), then per case its
  ``self_extend_forward`` bound to every ``LlamaAttention`` with ``group_size_1=G``,
  ``group_size_2=W`` (what its ``SelfExtend.apply`` does, eager path): ``prefill`` (one
  forward of all tokens) and ``decode`` (``decode_from`` tokens, then one token at a time
  through a ``DynamicCache``).
- STRING: ``plain`` first (``replace_with_string`` patches transformers' classes for the
  whole process), then per case ``replace_with_string(tokens, S, W)`` and per
  ``attention_factor`` (the module global as shipped, ``0.1 ln 2 + 1``, and 1.0): ``prefill``,
  and with 1.0 ``decode`` (``decode_from = S + 1`` tokens prefilled, then one at a time
  through its own cache, the ``fwd_kvcache`` path), of the model and of its first layer
  alone (``/1 layer``: the same weights, ``num_hidden_layers=1``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


def _setup(job: dict[str, Any]) -> None:
    sys.path[:0] = [job["shims"], job["checkout"]]


def _build(job: dict[str, Any]) -> None:
    import torch
    import transformers

    torch.manual_seed(job["seed"])
    config = transformers.LlamaConfig(**job["config"])
    model = transformers.LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(job["model"], safe_serialization=True)


def _load(job: dict[str, Any], layers: int | None = None) -> Any:
    """The saved model, eager attention; ``layers``: its first layers only."""
    import torch
    import transformers

    extra = {} if layers is None else {"num_hidden_layers": layers}
    model = transformers.LlamaForCausalLM.from_pretrained(
        job["model"], torch_dtype=torch.float32, attn_implementation="eager", **extra
    )
    return model.eval()


def _rows(logits: Any) -> np.ndarray:
    return logits[0].detach().float().numpy()


def _hf_prefill(model: Any, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return _rows(model(torch.tensor([ids])).logits)


def _hf_decode(model: Any, ids: list[int], start: int) -> np.ndarray:
    """Rows ``< start`` from one prefill, then each row from its own one-token step."""
    import torch
    from transformers.cache_utils import DynamicCache

    with torch.no_grad():  # 4.38 copies the cache it is given: carry the one it returns
        out = model(torch.tensor([ids[:start]]), past_key_values=DynamicCache(), use_cache=True)
        rows = [_rows(out.logits)]
        for p in range(start, len(ids)):
            out = model(
                torch.tensor([[ids[p]]]), past_key_values=out.past_key_values, use_cache=True
            )
            rows.append(_rows(out.logits))
    return np.concatenate(rows)


def _longlm(job: dict[str, Any]) -> dict[str, np.ndarray]:
    from functools import partial
    from types import MethodType

    import self_extend_patch  # noqa: F401 (the package, as SelfExtend.apply imports it)
    from self_extend_patch.Llama import self_extend_forward
    from transformers.models.llama.modeling_llama import LlamaAttention

    ids = job["ids"]
    out = {"plain": _hf_prefill(_load(job), ids)}
    for case in job["cases"]:
        forward = partial(
            self_extend_forward,
            group_size_1=case["group_size"],
            group_size_2=case["neighbor_window"],
        )
        model = _load(job)
        bound = 0
        for module in model.modules():
            if type(module) is LlamaAttention:  # SelfExtend.apply matches the class name
                module.forward = MethodType(forward, module)
                bound += 1
        if bound != model.config.num_hidden_layers:
            raise RuntimeError(f"bound self_extend_forward to {bound} attention layers")
        out[f"{case['name']}/prefill"] = _hf_prefill(model, ids)
        out[f"{case['name']}/decode"] = _hf_decode(model, ids, case["decode_from"])
    return out


def _string_decode(model: Any, ids: list[int], start: int) -> np.ndarray:
    """STRING's own cache (``flashdecoding_forward`` allocates it): ``start`` tokens
    prefilled, then one token at a time at its explicit position."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids[:start]]), use_cache=True)
        cache = out.past_key_values
        rows = [_rows(out.logits)]
        for p in range(start, len(ids)):
            out = model(
                torch.tensor([[ids[p]]]),
                position_ids=torch.tensor([[p]]),
                past_key_values=cache,
                use_cache=True,
            )
            rows.append(_rows(out.logits))
    return np.concatenate(rows)


def _string(job: dict[str, Any]) -> dict[str, np.ndarray]:
    import torch

    ids = job["ids"]
    out = {}
    for layers in (None, 1):  # before STRING patches transformers' classes
        out["plain" + _suffix(layers)] = _hf_prefill(_load(job, layers), ids)
    import string_for_llama

    for case in job["cases"]:
        for label, factor in (("shipped", None), ("factor1", 1.0)):
            string_for_llama.replace_with_string(
                max_test_length=len(ids),
                shifted_offset=case["shift"],
                small_local_value=case["local_window"],
            )
            if factor is not None:
                string_for_llama.attention_factor = factor
            job.setdefault("attention_factor", {})[label] = string_for_llama.attention_factor
            with torch.no_grad():
                prefill = _load(job)(torch.tensor([ids]), use_cache=True).logits
            out[f"{case['name']}/{label}/prefill"] = _rows(prefill)
            if label == "shipped":
                continue
            for layers in (None, 1):  # each a fresh model: a fresh cache
                decode = _string_decode(_load(job, layers), ids, case["decode_from"])
                out[f"{case['name']}/{label}/decode{_suffix(layers)}"] = decode
    return out


def _suffix(layers: int | None) -> str:
    return "" if layers is None else f"/{layers} layer"


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    import torch

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "numpy": np.__version__,
    }


def main(path: str) -> int:
    job = json.loads(Path(path).read_text())
    _setup(job)
    import torch

    torch.set_num_threads(job.get("threads", 1))
    out_dir = Path(job["out"])
    out_dir.mkdir(parents=True, exist_ok=True)
    if job.get("build"):
        _build(job)
    run = {"longlm": _longlm, "string": _string}[job["reference"]]
    logits = run(job)
    np.savez(out_dir / f"{job['reference']}.npz", **logits)
    record = {
        "reference": job["reference"],
        "versions": _versions(),
        "entries": sorted(logits),
        "attention_factor": job.get("attention_factor"),
    }
    (out_dir / f"{job['reference']}.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
