"""Process layout under torchrun (RANK, WORLD_SIZE, LOCAL_RANK) or a plain single process.

Multi-GPU and multi-node runs are launched with `torchrun`; this module only reads its environment and
opens the process group: NCCL between GPUs, gloo on CPU (what the tests use).
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..errors import ConfigError

if TYPE_CHECKING:
    from .mesh import Layout


@dataclass
class Runtime:
    """This process's place: its rank among world_size, its device, and the run's tensor and pipeline degrees."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    tensor: int = 1  # parallel.tensor and parallel.pipeline of the run (the trainer sets them): they say
    pipeline: int = 1  # which ranks hold the same model shard, and so which ranks split the batch

    @property
    def layout(self) -> Layout:
        from .mesh import Layout

        return Layout.of(self, self.world_size)  # this runtime's tensor and pipeline degrees

    @property
    def data_rank(self) -> int:
        """This rank's place among the data-parallel ranks: the tensor ranks of one group read the same batch."""
        return self.layout.coords(self.rank).data

    @property
    def data_size(self) -> int:
        """Data-parallel ranks (world / (tensor x pipeline)): the number of different batches per micro-step."""
        return self.layout.data

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_runtime(device: str = "auto") -> Runtime:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, "train.device", local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if dev.type == "cuda" else "gloo", device_id=dev if dev.type == "cuda" else None
        )
    return Runtime(rank=rank, world_size=world, local_rank=local_rank, device=dev)


def resolve_device(name: str | None, setting: str, local_rank: int = 0) -> torch.device:
    """auto | cpu | cuda | cuda:N, checked against what this machine has; `setting` names it in errors
    (train.device, --device). Plain cuda is this process's own GPU: under torchrun its local rank's (a launcher
    that gives each process only its own GPU, as SLURM's binding does, makes it device 0 of one)."""
    name = (name or "auto").strip().lower()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if name != "cuda" and not (name.startswith("cuda:") and name[5:].isdigit()):
        raise ConfigError(f"{setting} {name!r} is not a device pretrain runs on; use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        give = "=" if setting.startswith("train.") else " "
        raise ConfigError(
            f"{setting} {name}: no CUDA GPU is visible to torch {torch.__version__}; use {setting}{give}cpu (or auto)"
        )
    count = torch.cuda.device_count()
    index = int(name[5:]) if ":" in name else local_rank % count
    if index >= count:
        raise ConfigError(f"{setting} {name}: this machine has {count} CUDA GPU(s); use cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", index)


def all_reduce_mean(value: float, rt: Runtime) -> float:
    """Mean of a float over all ranks (the loss every rank logs is the global batch's)."""
    if not rt.distributed:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=rt.device)
    dist.all_reduce(t)
    return float(t.item()) / rt.world_size


def all_reduce_max(value: float, rt: Runtime) -> float:
    if not rt.distributed:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=rt.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def all_reduce_sum(values: list[float], rt: Runtime) -> list[float]:
    """Element-wise sums over all ranks, in float64 (counts and sums of squares stay exact)."""
    if not rt.distributed:
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=rt.device)
    dist.all_reduce(t)
    return t.tolist()


def barrier(rt: Runtime) -> None:
    if rt.distributed:
        dist.barrier()


def gather_to_main(value: Any, rt: Runtime) -> list | None:
    """Every rank's `value` (any picklable object) on rank 0, in rank order; None on the other ranks."""
    if not rt.distributed:
        return [value]
    gathered = [None] * rt.world_size if rt.is_main else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


def first_of_ranks(value: Any, rt: Runtime) -> Any:
    """The first rank's value that is not None (rank order), the same on every rank; None if all are."""
    if not rt.distributed:
        return value
    gathered: list[Any] = [None] * rt.world_size
    dist.all_gather_object(gathered, value)
    return next((v for v in gathered if v is not None), None)


def shutdown(rt: Runtime) -> None:
    if rt.distributed and dist.is_initialized():
        # The trainer sits in reference cycles (modules, hooks): free its sharded tensors and gloo's last work
        # objects now, while their group exists. Left to interpreter shutdown, freeing them can abort a
        # finished rank ("terminate called without an active exception").
        gc.collect()
        dist.barrier()  # no rank tears the group down while another still uses it
        dist.destroy_process_group()
