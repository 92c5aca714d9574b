"""The rotary engines: one plain twin, three engines proven equal to it, one plan per call shape.

RoPE is memory bound: the least it can cost is one read and one write of q and k.

- ``plain``: :func:`~posenc.rotary.kernels.plain.apply_rotary_torch`, the formula and the
  twin; every engine below computes its bits (products rounded before the sum, math in
  float32 for bf16/fp16/fp32 inputs, float64 for float64);
- ``torch_engine``: the optimised torch rotation, ``backend="torch"`` (float64 cos/sin
  with gradients, meta tensors, tracing, no compiler);
- ``cpu``: a C loop with OpenMP (``rope_cpu.c``), the default for CPU tensors where a C
  compiler exists (built on first use by :mod:`posenc._native`; off with
  :func:`enable_cpu_fast_path` or ``POSENC_CPU_FAST_PATH=0``);
- ``triton_rope``: a Triton kernel for CUDA tensors when ``triton`` is installed (off with
  :func:`enable_triton` or ``POSENC_TRITON=0``).

The fused engines take both layouts, partial rotary, per-token positions, packed
sequences, GQA, any strides and an in-place mode; they are torch custom ops with a
backward, kept in the graph by ``torch.compile``. The package, bottom to top: ``plain``,
``checks``, and the engines ``torch_engine``, ``cpu``, ``triton_rope`` (none imports
another module of the package) <- ``ops`` (the launch, its check, the custom ops; it
imports ``cpu`` and ``triton_rope`` on their first launch) <- ``backends`` (the switches)
<- ``dispatch`` (:func:`fused_rotary`, validated; ``dispatch_rotary``) <- ``planned`` (a
checked call shape in one launch: the module's common call and the patched transformers
apply; it imports ``cpu`` for its argument slots). Nothing here imports the code that
calls it.
"""

from posenc.rotary.kernels.backends import (
    BACKENDS,
    cpu_fast_path_enabled,
    enable_cpu_fast_path,
    enable_triton,
    select_backend,
)
from posenc.rotary.kernels.dispatch import dispatch_rotary as dispatch_rotary  # the modules' entry
from posenc.rotary.kernels.dispatch import fused_rotary

__all__ = [
    "BACKENDS",
    "cpu_fast_path_enabled",
    "enable_cpu_fast_path",
    "enable_triton",
    "fused_rotary",
    "select_backend",
]
