"""Distributed plumbing: the same study in one process or under ``torchrun``.

Under ``torchrun --nproc_per_node=N`` (environment variables ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) a study joins
the process group (gloo on CPU, nccl on CUDA) and wraps the model in
``DistributedDataParallel``. Every rank draws the same global batch from the
step's seed and keeps the rows ``rank::world_size`` (:mod:`.seeding`), so the
data is sharded by rank and the global batch is the same at any world size.
Rank 0 writes checkpoints and results.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
import torch.distributed as dist

from posenc._errors import PosEncError, check_choice

__all__ = ["Dist", "resolve_device", "setup"]

DEVICES = ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class Dist:
    """Where this process stands: ``rank`` of ``world_size`` on ``device``."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    owns_group: bool = False  # this process initialised the group and must destroy it

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, rows: int) -> torch.Tensor:
        """This rank's rows of a global batch of ``rows``: ``rank, rank + world, ...``."""
        return torch.arange(self.rank, rows, self.world_size)

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum ``values`` (float64 on CPU) over ranks; identity in one process."""
        if not self.enabled:
            return values
        moved = values.to(self.device)
        dist.all_reduce(moved, op=dist.ReduceOp.SUM)
        return moved.cpu()

    def gather_objects(self, obj: Any) -> list[Any]:
        """``obj`` of every rank, in rank order."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self) -> None:
        """Leave the process group if this process joined it."""
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def resolve_device(device: str) -> torch.device:
    """``"cpu"`` or ``"cuda"`` (the latter only where CUDA is available)."""
    check_choice("device", device, DEVICES)
    if device == "cuda" and not torch.cuda.is_available():
        raise PosEncError("device 'cuda' is not available on this machine (no CUDA device found)")
    return torch.device(device)


def setup(device: str = "cpu") -> Dist:
    """Join the process group when launched by ``torchrun`` (``WORLD_SIZE > 1``).

    Uses nccl for CUDA and gloo for CPU; each CUDA rank takes ``cuda:LOCAL_RANK``.
    In a single process this only resolves the device.
    """
    resolved = resolve_device(device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(device=resolved)
    rank = int(os.environ["RANK"])
    if resolved.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        resolved = torch.device("cuda", local)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group(backend="nccl" if resolved.type == "cuda" else "gloo")
    return Dist(rank=rank, world_size=world, device=resolved, owns_group=owns)
