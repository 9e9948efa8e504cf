"""Data-parallel calibration under `torchrun`: who am I, my shard, and the reductions.

Every rank holds the current layer and a disjoint shard of the calibration windows
(`shard`); statistics are summed with `torch.distributed` (`all_reduce_sum`); each
linear has one owner rank (`owners`, balanced by in_features^2) that quantizes it and
`broadcast`s the result. gloo on CPU, nccl on CUDA. With one process every call is a
no-op, so single-process code paths are the same code.
"""

from __future__ import annotations

import dataclasses
import os

import torch


@dataclasses.dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def shard(self, ids: torch.Tensor) -> torch.Tensor:
        """This rank's calibration windows: every world-th row from the rank-th."""
        return ids[self.rank::self.world] if self.active else ids

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.active:
            import torch.distributed as dist

            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def sum_numbers(self, *values: float) -> tuple[float, ...]:
        """Python numbers summed across ranks (float64 on the backend's device)."""
        if not self.active:
            return tuple(float(v) for v in values)
        t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
        self.all_reduce_sum(t)
        return tuple(t.tolist())

    def all_reduce_min(self, value: int) -> int:
        if not self.active:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64, device=_comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def broadcast(self, t: torch.Tensor, src: int) -> torch.Tensor:
        if self.active:
            import torch.distributed as dist

            dist.broadcast(t, src=src)
        return t

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as dist

            dist.barrier()

    def owners(self, sizes: list[int]) -> list[int]:
        """Owner rank per item, greedily balancing the summed cost `sizes`."""
        load = [0] * self.world
        owner = [0] * len(sizes)
        for i in sorted(range(len(sizes)), key=lambda k: -sizes[k]):
            r = min(range(self.world), key=lambda q: (load[q], q))
            owner[i] = r
            load[r] += sizes[i]
        return owner


SINGLE = DistContext()  # the one-process context (immutable)


def _comm_device() -> torch.device:
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if (
        dist.get_backend() == "nccl") else torch.device("cpu")


def from_env(device: str) -> DistContext:
    """The context torchrun set up (WORLD_SIZE/RANK), initialising the process group once."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend)
    return DistContext(dist.get_rank(), dist.get_world_size())
