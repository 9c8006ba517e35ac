"""The process grid of a run: pipeline x data x tensor ranks, and the DeviceMesh that names them.

Ranks are numbered with the tensor dimension fastest, then data, then pipeline (Megatron-LM's order,
Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters"): a tensor-parallel
group is neighbouring ranks, so one node's GPUs on NVLink, since it exchanges activations inside every layer;
pipeline stages, which send only one activation tensor per micro-batch across their boundary, are furthest
apart and may sit on different nodes. `init_device_mesh` numbers a mesh of shape (pipeline, data, tensor)
row-major, which is this order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

DIMS = ("pp", "dp", "tp")  # the mesh's dimension names: pipeline, data, tensor


class Degrees(Protocol):
    """What says a layout's tensor and pipeline degrees: the config's `parallel` section, or a Runtime."""

    @property
    def tensor(self) -> int: ...

    @property
    def pipeline(self) -> int: ...


@dataclass(frozen=True)
class Coords:
    """Where one rank sits in the grid."""

    pipeline: int
    data: int
    tensor: int


@dataclass(frozen=True)
class Layout:
    pipeline: int
    data: int
    tensor: int

    @classmethod
    def of(cls, parallel: Degrees, world_size: int) -> Layout:
        """The grid of `world_size` ranks under parallel.tensor and parallel.pipeline (the rest is data)."""
        return cls(parallel.pipeline, world_size // (parallel.tensor * parallel.pipeline), parallel.tensor)

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.pipeline, self.data, self.tensor

    def coords(self, rank: int) -> Coords:
        return Coords(rank // (self.data * self.tensor), rank // self.tensor % self.data, rank % self.tensor)

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """The DeviceMesh over all ranks (needs the process group); sub-meshes by name: mesh["dp"]."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, self.shape, mesh_dim_names=DIMS)
