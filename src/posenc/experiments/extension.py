"""Context extension of a trained RoPE model at evaluation time.

The encoding of a trained :class:`~posenc.models.TinyTransformer` is swapped by
editing its config: ``config["encoding"]["scaling"]`` gets a rotary scaling
(:mod:`posenc.rotary.frequencies`), a new model is built from the edited config
and the trained state dict is loaded into it (RoPE has no parameters, so the
weights fit exactly).

- ``pi``: position interpolation (Chen et al., 2023): every frequency divided by
  the factor, i.e. positions squeezed into the trained range.
- ``ntk``: NTK-aware scaling (bloc97, 2023): the base grows by
  ``factor^(d / (d - 2))``, so high frequencies stay and low ones interpolate.
- ``yarn``: YaRN (Peng et al., 2023): interpolate only the low frequencies, with a
  ramp between, and scale the logits by ``0.1 ln(factor) + 1``.
"""

from __future__ import annotations

import copy
from typing import Any

from posenc._errors import PosEncError, check_choice, check_float, check_int

__all__ = ["EXTENSIONS", "extended_config", "scaling_for"]

#: method name -> rotary scaling type
EXTENSIONS: dict[str, str] = {"pi": "linear", "ntk": "ntk", "yarn": "yarn"}


def scaling_for(method: str, factor: float, train_len: int) -> dict[str, Any]:
    """The rotary scaling config of ``method`` for a context ``factor`` times ``train_len``.

    Examples:
        >>> scaling_for("pi", 4.0, 64)
        {'type': 'linear', 'factor': 4.0}
        >>> scaling_for("yarn", 4.0, 64)
        {'type': 'yarn', 'factor': 4.0, 'original_max_position': 64}
    """
    check_choice("extend", method, tuple(EXTENSIONS))
    factor = check_float("extend factor", factor, min=1.0)
    train_len = check_int("train_len", train_len, min=1)
    scaling: dict[str, Any] = {"type": EXTENSIONS[method], "factor": factor}
    if method == "yarn":
        scaling["original_max_position"] = train_len
    return scaling


def extended_config(
    model_config: dict[str, Any], method: str, factor: float, train_len: int
) -> dict[str, Any]:
    """A copy of a TinyTransformer config whose RoPE encoding carries the scaling.

    Raises:
        PosEncError: the model's encoding is not ``rope``, or already has a scaling.
    """
    config = copy.deepcopy(model_config)
    encoding = config.get("encoding")
    if not isinstance(encoding, dict) or encoding.get("name") != "rope":
        name = encoding.get("name") if isinstance(encoding, dict) else encoding
        raise PosEncError(f"extend needs a model with the 'rope' encoding, got {name!r}")
    if encoding.get("scaling") is not None:
        raise PosEncError(
            f"extend needs an unscaled 'rope' encoding, got scaling {encoding['scaling']!r}"
        )
    encoding["scaling"] = scaling_for(method, factor, train_len)
    return config
