"""FIRE (Li et al., 2023, "Functional Interpolation for Relative Positions Improves Long
Context Transformers"): a small MLP of the progressively normalised distance.

``bias[h, i, j] = f_theta( psi(i - j) / psi(max(L, i)) )[h]`` with ``psi(x) = log(c x + 1)``,
a learned ``c > 0``, a learned threshold ``L`` and ``f_theta: R -> R^h`` an MLP (one hidden
ReLU layer). Dividing by ``psi(i)`` maps every causal distance ``0 <= i - j <= i`` into
``[0, 1]`` whatever the sequence length (the interpolation); the threshold keeps short
prefixes from being stretched over the whole range.

Shapes: positions ``[q]`` / ``[k]`` (or ``[b, q]`` / ``[b, k]``) -> bias ``[h, q, k]``
(or ``[b, h, q, k]``), float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from posenc._errors import (
    PosEncError,
    check_alloc,
    check_factory,
    check_float,
    check_int,
    check_same_device,
)
from posenc.bias._common import PositionBias, check_pair, distance, pairs, renamed

__all__ = ["FIREBias", "fire_bias", "fire_normalized_distance"]


# Bounds of the numbers c and threshold: |c| * max(threshold, position) stays finite in
# float32 (where the formula is evaluated) for positions up to ~1e22.
LIMITS = {"c": 1e4, "threshold": 1e12, "init_c": 1e4, "init_threshold": 1e12}


def _as_scalar(name: str, value: float | torch.Tensor) -> torch.Tensor | float:
    if isinstance(value, torch.Tensor):
        if value.device.type == "meta":
            raise PosEncError(f"{name} must hold values, got a tensor on the meta device")
        if value.numel() != 1 or not value.is_floating_point():
            raise PosEncError(
                f"{name} must be a number or a one-element floating tensor, got "
                f"shape {tuple(value.shape)} dtype {value.dtype}"
            )
        return value.reshape(())
    return check_float(name, value, min=-LIMITS[name], max=LIMITS[name])


def _normalized(
    qp: torch.Tensor, kp: torch.Tensor, c: torch.Tensor | float, threshold, eps: float
) -> torch.Tensor:
    """``psi(|i - j|) / (psi(max(L, i)) + eps)``, ``psi(x) = log(|c| x + 1)``, in float32.

    The one formula of both the materialised bias and the score_mod. Keys after the query
    (hidden by the causal mask) use the distance ``|i - j|``, as in the paper's code.
    """
    c = c.abs().float() if isinstance(c, torch.Tensor) else abs(c)
    limit = threshold.abs().float() if isinstance(threshold, torch.Tensor) else abs(threshold)
    d = distance(qp, kp).abs()
    normalizer = torch.log1p(c * torch.clamp(qp.to(torch.float32), min=limit)) + eps
    return torch.log1p(c * d) / normalizer


def fire_normalized_distance(
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    *,
    c: float | torch.Tensor = 0.1,
    threshold: float | torch.Tensor = 512.0,
    eps: float = 1e-6,
) -> torch.Tensor:
    """FIRE's normalised distance ``psi(|i - j|) / (psi(max(L, i)) + eps)``, the MLP's input.

    With ``psi(x) = log(|c| x + 1)``. In ``[0, 1)`` for every causal pair
    ``0 <= j <= i`` (non-negative positions).

    Args:
        q_positions: query positions ``[q]`` or ``[b, q]``, integer or floating.
        k_positions: key positions ``[k]`` or ``[b, k]``.
        c: the log scale (its absolute value is used).
        threshold: ``L``, the smallest normaliser position (its absolute value is used).
        eps: added to the normaliser.

    Shape:
        ``[q, k]`` (or ``[b, q, k]``), float32.

    Examples:
        >>> import torch
        >>> from posenc.bias import fire_normalized_distance
        >>> fire_normalized_distance(torch.tensor([4]), torch.arange(5), c=1.0, threshold=1.0)
        tensor([[1.0000, 0.8614, 0.6826, 0.4307, 0.0000]])
    """
    qpos, kpos = check_pair(q_positions, k_positions)
    c = _as_scalar("c", c)
    threshold = _as_scalar("threshold", threshold)
    for name, t in (("c", c), ("threshold", threshold)):
        if isinstance(t, torch.Tensor):
            check_same_device(("q_positions", name), qpos, t)
    eps = check_float("eps", eps, min=0.0)
    return _normalized_pairs(qpos, kpos, c, threshold, eps)


def _normalized_pairs(
    qpos: torch.Tensor,
    kpos: torch.Tensor,
    c: torch.Tensor | float,
    threshold: torch.Tensor | float,
    eps: float,
) -> torch.Tensor:
    """:func:`fire_normalized_distance` of checked arguments: ``[q, k]`` or ``[b, q, k]``."""
    device = c.device if isinstance(c, torch.Tensor) else qpos.device
    qp, kp = pairs(qpos, kpos, device)
    return _normalized(qp, kp, c, threshold, eps)


def fire_bias(
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    mlp: Callable[[torch.Tensor], torch.Tensor],
    *,
    c: float | torch.Tensor = 0.1,
    threshold: float | torch.Tensor = 512.0,
    eps: float = 1e-6,
) -> torch.Tensor:
    """The FIRE bias: ``mlp`` applied to :func:`fire_normalized_distance`, heads in front.

    Args:
        q_positions, k_positions, c, threshold, eps: as in :func:`fire_normalized_distance`.
        mlp: maps ``[..., 1]`` to ``[..., h]`` (e.g. ``FIREBias.mlp``).

    Shape:
        ``[h, q, k]`` float32, or ``[b, h, q, k]`` when either position tensor is batched.

    Examples:
        >>> import torch
        >>> from posenc.bias import fire_bias
        >>> mlp = lambda x: torch.cat([x, -x], dim=-1)  # two "heads"
        >>> fire_bias(torch.tensor([2]), torch.arange(3), mlp, c=1.0, threshold=1.0)
        tensor([[[ 1.0000,  0.6309,  0.0000]],
        <BLANKLINE>
                [[-1.0000, -0.6309, -0.0000]]])
    """
    x = fire_normalized_distance(q_positions, k_positions, c=c, threshold=threshold, eps=eps)
    out = mlp(x.unsqueeze(-1))  # [.., q, k, h]
    if out.ndim != x.ndim + 1 or out.shape[:-1] != x.shape:
        raise PosEncError(
            f"mlp must map [..., 1] to [..., h], got shape {tuple(out.shape)} from "
            f"{tuple(x.unsqueeze(-1).shape)}"
        )
    return _heads_first(out)


def _heads_first(out: torch.Tensor) -> torch.Tensor:
    """The MLP's ``[.., q, k, h]`` as the bias ``[.., h, q, k]``, float32."""
    return out.to(torch.float32).movedim(-1, -3)


class FIREBias(PositionBias):
    """FIRE attention bias: a per-layer MLP of the progressively normalised distance.

    Parameters: ``mlp`` (``Linear(1, mlp_width)``, ReLU, ``Linear(mlp_width, num_heads)``),
    ``c`` (initialised to ``init_c``) and ``threshold_scale`` (``L = |threshold_scale| *
    init_threshold``, initialised to 1). The defaults follow the paper's implementation.
    FIRE is meant for causal attention; keys after the query get the value of the same
    distance before it (the causal mask hides them).

    Args:
        num_heads: number of attention heads, ``>= 1``.
        mlp_width: hidden units of the MLP, ``>= 1``.
        init_c: initial ``c > 0`` of ``psi(x) = log(c x + 1)``.
        init_threshold: initial threshold ``L > 0`` of the normaliser ``psi(max(L, i))``.
        eps: added to the normaliser, ``>= 0``.
        device, dtype: of the parameters.

    Shape:
        ``bias(q_len, k_len)`` -> ``[h, q_len, k_len]``; with ``[b, s]`` positions
        ``[b, h, q_len, k_len]``. When ``q_len < k_len`` and no positions are given the
        queries are the last ``q_len`` positions.

    Examples:
        >>> import posenc
        >>> fire = posenc.FIREBias(4)
        >>> fire.bias(5).shape
        torch.Size([4, 5, 5])
        >>> sorted(name for name, _ in fire.named_parameters())
        ['c', 'mlp.0.bias', 'mlp.0.weight', 'mlp.2.bias', 'mlp.2.weight', 'threshold_scale']
    """

    name: ClassVar[str] = "fire"

    def __init__(
        self,
        num_heads: int,
        *,
        mlp_width: int = 32,
        init_c: float = 0.1,
        init_threshold: float = 512.0,
        eps: float = 1e-6,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        device, dtype = check_factory(device, dtype)
        self.num_heads = check_int("num_heads", num_heads, min=1)
        self.mlp_width = check_int("mlp_width", mlp_width, min=1)
        name = "mlp_width" if self.mlp_width > self.num_heads else "num_heads"
        value = max(self.mlp_width, self.num_heads)
        shape = (self.mlp_width + 2, self.num_heads + 2)
        check_alloc(name, value, shape, dtype or torch.float32, device)
        self.init_c = check_float(
            "init_c", init_c, min=0.0, min_exclusive=True, max=LIMITS["init_c"]
        )
        self.init_threshold = check_float(
            "init_threshold",
            init_threshold,
            min=0.0,
            min_exclusive=True,
            max=LIMITS["init_threshold"],
        )
        self.eps = check_float("eps", eps, min=0.0)
        self.mlp = nn.Sequential(
            nn.Linear(1, self.mlp_width, device=device, dtype=dtype),
            nn.ReLU(),
            nn.Linear(self.mlp_width, self.num_heads, device=device, dtype=dtype),
        )
        self.c = nn.Parameter(torch.empty((), device=device, dtype=dtype))
        self.threshold_scale = nn.Parameter(torch.empty((), device=device, dtype=dtype))
        self.reset_parameters()
        self._set_config(
            num_heads=self.num_heads,
            mlp_width=self.mlp_width,
            init_c=self.init_c,
            init_threshold=self.init_threshold,
            eps=self.eps,
        )

    def reset_parameters(self) -> None:
        for layer in self.mlp:
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()
        nn.init.constant_(self.c, self.init_c)
        nn.init.constant_(self.threshold_scale, 1.0)

    @property
    def threshold(self) -> torch.Tensor:
        """The learned threshold ``L = |threshold_scale| * init_threshold`` (0-d tensor)."""
        return self.threshold_scale.abs() * self.init_threshold

    @property
    def _device(self) -> torch.device:
        return self.c.device

    def _position_bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """The MLP of the normalised distances of resolved positions."""
        c, threshold = self.c.reshape(()), self.threshold.reshape(())
        x = _normalized_pairs(q_positions, k_positions, c, threshold, self.eps)
        return _heads_first(self._mlp(x.unsqueeze(-1)))  # MLP: [.., q, k, 1] -> [.., q, k, h]

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x.to(self.c.dtype))

    def _linear(self, index: int) -> nn.Linear:
        """Layer ``index`` of :attr:`mlp`, which the score_mod writes out unit by unit."""
        layer = self.mlp[index]
        if not isinstance(layer, nn.Linear):
            raise PosEncError(
                f"mlp[{index}] must be an nn.Linear for score_mod (it writes out FIRE's "
                f"Linear-ReLU-Linear MLP), got {type(layer).__name__}"
            )
        return layer

    def score_mod_at(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> Callable[..., torch.Tensor]:
        """:meth:`score_mod` of positions already resolved (no validation): the normalised
        distance of one pair, then the MLP written out unit by unit (``mlp_width`` scalar
        terms). Equals :meth:`bias` up to float32 summation order."""
        q_at, k_at = self._index_positions(q_positions, k_positions)
        first, last = self._linear(0), self._linear(2)
        width, eps = self.mlp_width, self.eps
        c, scale, init_threshold = self.c, self.threshold_scale, self.init_threshold

        def fire_score_mod(score, b, h, q_idx, kv_idx):
            qp = q_at(b, q_idx)
            x = _normalized(qp, k_at(b, kv_idx), c, scale.abs() * init_threshold, eps)
            out = last.bias[h].float()
            for u in range(width):
                hidden = torch.relu(first.weight[u, 0].float() * x + first.bias[u].float())
                out = out + last.weight[h, u].float() * hidden
            return score + out.to(score.dtype)

        return fire_score_mod


def __getattr__(name: str) -> Any:
    return renamed(__name__, name, {"FIRE": FIREBias})
