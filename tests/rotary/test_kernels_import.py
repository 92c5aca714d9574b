"""The CPU fast path's decision is marked constant for dynamo without importing it."""

from __future__ import annotations

import subprocess
import sys

import torch

from posenc.rotary.kernels import backends


def test_the_constant_marker_is_torchs_own() -> None:
    def probe() -> bool:
        return True

    marked = torch.compiler.assume_constant_result(probe)
    assert marked is probe
    assert vars(probe) == {"_dynamo_marked_constant": True}
    assert vars(backends._cpu_decided) == vars(probe)


def test_import_posenc_does_not_import_dynamo() -> None:
    # torch._dynamo takes seconds to import: the CLI and every study worker would pay it
    code = "import sys, posenc, posenc.experiments.parallel; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
