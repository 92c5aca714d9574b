"""Fast paths for rotary embeddings: one fused pass over q and k, on GPU and CPU.

RoPE is memory bound: the least it can cost is one read and one write of q and k. The
plain torch path (:func:`posenc.rotary.kernels.plain.apply_rotary_torch`) makes several passes
and temporaries; the fused paths make one, loading each token's cos/sin row once and
reusing it for every head of q and of k:

- ``"triton"``: a Triton kernel (:mod:`posenc.rotary.kernels.triton_rope`), used
  automatically for CUDA tensors when ``triton`` is installed (``pip install
  'posenc[triton]'``); disable with :func:`enable_triton` or ``POSENC_TRITON=0``;
- ``"cpu"``: a C loop with OpenMP (:mod:`posenc.rotary.kernels.cpu`), the default for
  CPU tensors wherever a C compiler exists: built on the first CPU call (a second or two,
  under a file lock, then cached in a private directory and checked before every load).
  Without a compiler the plain path runs and one ``logging`` line (logger ``"posenc"``)
  says why. Off with :func:`enable_cpu_fast_path` or ``POSENC_CPU_FAST_PATH=0``;
- ``"torch"``: the plain twin (:mod:`posenc.rotary.kernels.plain`), everywhere else
  (float64 cos/sin with gradients, meta tensors, ...).

All three compute the same function bit for bit (products rounded before the sum, math
in float32 for bf16/fp16/fp32 inputs, float64 for float64). Both fused paths handle
both layouts, partial rotary, per-token positions ``[b, s]``, packed sequences, GQA (q
and k with different head counts), any strides (``[b, s, h, d]`` views are not copied)
and an in-place mode; they are torch custom ops, so ``torch.compile(fullgraph=True)``
keeps them in the graph, and they have a backward (the inverse rotation).

The package, bottom to top: ``plain`` (the twin and the checks every path shares) <-
``ops`` (the launch, its check and the custom ops; ``cpu`` and ``triton_rope``, the
launchers, imported when first used) <- ``backends`` (the switches, which path a call
takes) <- ``dispatch`` (:func:`dispatch_rotary`, :func:`fused_rotary`) <- ``planned``
(:func:`~posenc.rotary.kernels.planned.rotate_planned`: a call shape ``fused_rotary``
has checked before, in one lookup and one launch; the patched transformers apply's). This ``__init__``
only re-exports; no module of the package imports it. The package imports only torch,
triton, :mod:`posenc._errors` and :mod:`posenc.rotary.layout`: the code that calls it
(:mod:`posenc.rotary.apply`, the modules) sits above it, never the other way round.
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
