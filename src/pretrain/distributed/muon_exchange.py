"""Each of Muon's matrices orthogonalised whole, wherever a layout puts its rows and columns (muon.py's step).

  tensor parallelism  ("tp": q/k/v and gate/up split by rows, the output projections by columns) the parts are
                      all-gathered over the tensor ranks; each orthogonalises the whole matrix and keeps its
                      part (Megatron-Core's Muon does the same by default): a tensor group is a few GPUs of one
                      node, and its gather is one block's matrices over NVLink.
  FSDP2               (ZeRO 2/3: "dp"; routed experts sharded on dim 1 over "edp"; an MoE layer's shared experts
                      over all ranks) each whole matrix is assigned to one rank of the group, which receives the
                      other ranks' rows of it, orthogonalises it and sends each its rows back: one all-to-all
                      each way per round of as many matrices as ranks, the costliest first (Microsoft's Dion
                      repository's Muon for FSDP2, which torchtitan and OLMo-core take up; nanochat's DistMuon
                      assigns matrices to ranks alike). The group shares the Newton-Schulz work, 1/d each,
                      for two exchanges of the bf16 update: gathering it to every rank would make each rank
                      orthogonalise every matrix, which at 70B costs more than the step's forward and
                      backward (docs/train.md: Muon).
  ZeRO-1              each rank steps only the whole matrices it owns and broadcasts them: already one rank a
                      matrix. DDP and pipeline replicas orthogonalise every matrix of theirs, as one process.
  expert parallelism  a rank holds whole experts (and FSDP2 shards E/ep experts on dim 0 while they last):
                      orthogonalised where they are.
Under FSDP2 over tensor parallelism the owner first assembles its tensor rank's part over the data ranks, then
gathers the other parts from the owners of the same matrix in its tensor group. The exchanged update is the
bf16 tensor Newton-Schulz starts from, so a matrix gets the bits one process gives it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ..plan.muon import newton_schulz_flops

Orthogonalise = Callable[[torch.Tensor, int], torch.Tensor]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


@dataclass(frozen=True)
class Spread:
    """A tensor dimension `dim` split over a process group of `size` ranks, this one `rank`."""

    group: Any
    size: int
    rank: int
    dim: int


class Matrix:
    """One Muon parameter at the step: where its local tensor lies in the whole matrix (`owners`: the group that
    assigns it to one rank, FSDP2's; `tensor`: tensor parallelism's split), its update, and the update applied."""

    def __init__(self, p: torch.Tensor, momentum: torch.Tensor, group: dict, lr_scale: Callable[..., float]):
        self.p, self.momentum, self.group, self.lr_scale = p, momentum, group, lr_scale
        self.local = _local(p.data)
        self.shape = tuple(p.shape)  # the whole tensor's (a DTensor's global shape)
        self.parts: list[int] = group["row_parts"] or [self.shape[-2]]
        self.owners: Spread | None = None
        self.tensor: Spread | None = None
        if isinstance(p, DTensor):
            mesh, names = p.device_mesh, p.device_mesh.mesh_dim_names or ()
            for i, placement in enumerate(p.placements):
                dim = getattr(placement, "dim", None)  # Shard and FSDP2's _StridedShard over a tensor split
                if dim is None or mesh.size(i) == 1:
                    continue
                spread = Spread(mesh.get_group(i), mesh.size(i), mesh.get_local_rank(i), dim % p.dim())
                if i < len(names) and names[i] == "tp":
                    self.tensor = spread
                elif spread.dim >= p.dim() - 2:  # a matrix dimension; on dim 0 of experts, whole ones a rank
                    self.owners = spread
        # What the owners assemble: the whole tensor but for tensor parallelism's split.
        assembled = list(self.shape)
        if self.tensor:
            assembled[self.tensor.dim] //= self.tensor.size
        self.assembled = tuple(assembled)
        self.flops = newton_schulz_flops(self.shape, self.parts, group["ns_steps"])

    def update(self) -> torch.Tensor:
        """The momentum advanced by this step's gradient and the Nesterov update from it, in bf16 (this rank's
        part): torch.optim.Muon's `buf.lerp_(grad, 1 - mu)`, `grad.lerp(buf, mu)`."""
        assert self.p.grad is not None  # muon.py's step takes the parameters with a gradient only
        g, m, mu = _local(self.p.grad), _local(self.momentum), self.group["momentum"]
        m.lerp_(g, 1 - mu)
        u = g.lerp(m, mu) if self.group["nesterov"] else m
        return u.to(torch.bfloat16, copy=True)

    def owner_rows(self, rank: int) -> int:
        """Rows (along the owners' dimension) rank `rank` of the owners holds: FSDP2's torch.chunk split."""
        assert self.owners is not None
        whole = self.assembled[self.owners.dim]
        chunk = -(-whole // self.owners.size)
        return max(0, min(chunk, whole - rank * chunk))

    def owner_shape(self, rank: int) -> tuple[int, ...]:
        assert self.owners is not None
        shape = list(self.assembled)
        shape[self.owners.dim] = self.owner_rows(rank)
        return tuple(shape)

    def orthogonalised(self, x: torch.Tensor, ns: Orthogonalise) -> torch.Tensor:
        """x (the assembled update: whole but for tensor parallelism's split) orthogonalised whole, part by part;
        this tensor rank's part of the result."""
        full = self._gather_tensor_parts(x) if self.tensor else x
        steps = self.group["ns_steps"]
        if len(self.parts) == 1:
            out = ns(full, steps)
        else:
            out = torch.empty_like(full)
            for start, stop in _spans(self.parts, 1):
                out[..., start:stop, :] = ns(full[..., start:stop, :], steps)
        return self._own_tensor_part(out) if self.tensor else out

    def _gather_tensor_parts(self, x: torch.Tensor) -> torch.Tensor:
        """The whole matrix from every tensor rank's part, rows in the model's order: a rank holds 1/t of each
        fused part (tensor_parallel.py's rank order), so each part is put together from every rank's slice."""
        assert self.tensor is not None
        pieces = [torch.empty_like(x) for _ in range(self.tensor.size)]
        dist.all_gather(pieces, x.contiguous(), group=self.tensor.group)
        if self.tensor.dim == len(self.shape) - 1:
            return torch.cat(pieces, dim=-1)
        return torch.cat(
            [piece[..., a:b, :] for a, b in _spans(self.parts, self.tensor.size) for piece in pieces], dim=-2
        )

    def _own_tensor_part(self, full: torch.Tensor) -> torch.Tensor:
        assert self.tensor is not None
        t, r = self.tensor.size, self.tensor.rank
        if self.tensor.dim == len(self.shape) - 1:
            return full.chunk(t, dim=-1)[r]
        spans = [(a + r * (b - a) // t, a + (r + 1) * (b - a) // t) for a, b in _spans(self.parts, 1)]
        return torch.cat([full[..., a:b, :] for a, b in spans], dim=-2)

    def apply(self, update: torch.Tensor) -> None:
        """W <- W (1 - lr wd) - lr s O on this rank's part, s per part (its rows and the matrix's columns)."""
        lr, adjust, cols = self.group["lr"], self.group["lr_adjust"], self.shape[-1]
        w = self.local
        w.mul_(1 - lr * self.group["weight_decay"])
        runs = self._row_runs()
        if len(runs) == 1:
            w.add_(update, alpha=-lr * self.lr_scale(runs[0][2], cols, adjust))
            return
        for start, stop, rows in runs:
            w[..., start:stop, :].add_(update[..., start:stop, :], alpha=-lr * self.lr_scale(rows, cols, adjust))

    def _row_runs(self) -> list[tuple[int, int, int]]:
        """(first local row, last + 1, rows of its part) for each stretch of this rank's rows in one part."""
        rows_dim = len(self.shape) - 2
        split = self.tensor.size if self.tensor and self.tensor.dim == rows_dim else 1
        runs = [(a, b, part) for (a, b), part in zip(_spans(self.parts, split), self.parts)]
        if self.owners and self.owners.dim == rows_dim:
            chunk = -(-self.assembled[rows_dim] // self.owners.size)
            lo = self.owners.rank * chunk
            hi = lo + self.local.shape[rows_dim]
            runs = [(max(a, lo) - lo, min(b, hi) - lo, part) for a, b, part in runs if min(b, hi) > max(a, lo)]
        return runs


def _spans(parts: list[int], split: int) -> list[tuple[int, int]]:
    """[start, stop) of each part's rows when each part is cut `split` ways and this is one cut of each."""
    spans, at = [], 0
    for rows in parts:
        spans.append((at, at + rows // split))
        at += rows // split
    return spans


def orthogonalise_all(matrices: list[Matrix], ns: Orthogonalise) -> None:
    """Orthogonalise and apply every matrix's update: the FSDP2-sharded ones group by group in rounds (one
    matrix per rank a round), then the rest where they are. Every rank of a group holds the same parameters in
    the same order, so all of them run the same collectives in the same order."""
    groups: dict[Any, list[Matrix]] = {}
    here = []
    for m in matrices:
        (groups.setdefault(m.owners.group, []) if m.owners else here).append(m)
    for members in groups.values():
        size = members[0].owners.size if members[0].owners else 1
        order = sorted(members, key=lambda m: -m.flops)  # stable: the parameters' order among equals
        for start in range(0, len(order), size):
            _round(order[start : start + size], ns)
    for m in here:
        m.apply(m.orthogonalised(m.update(), ns))


def _round(items: list[Matrix], ns: Orthogonalise) -> None:
    """One matrix for each of the first len(items) ranks of the group: every rank sends the owner of each its
    rows of the update, the owner orthogonalises the assembled matrix, and sends each rank its rows back."""
    spread = items[0].owners
    assert spread is not None
    me = spread.rank
    updates = [m.update() for m in items]
    sizes = [u.numel() for u in updates] + [0] * (spread.size - len(items))
    send = torch.cat([u.reshape(-1) for u in updates])
    del updates
    mine = items[me] if me < len(items) else None
    assert mine is None or mine.owner_rows(me) == mine.local.shape[spread.dim], "FSDP2's split is torch.chunk's"
    owned = [0] * spread.size
    if mine is not None:
        per_row = _numel(mine.assembled) // mine.assembled[spread.dim]
        owned = [mine.owner_rows(s) * per_row for s in range(spread.size)]
    recv = send.new_empty(sum(owned))
    dist.all_to_all_single(recv, send, owned, sizes, group=spread.group)
    del send
    back = recv.new_empty(0)
    if mine is not None:
        pieces = [piece.view(mine.owner_shape(s)) for s, piece in enumerate(recv.split(owned))]
        assembled = torch.cat(pieces, dim=spread.dim)
        del recv, pieces
        result = mine.orthogonalised(assembled, ns)
        del assembled
        rows = [mine.owner_rows(s) for s in range(spread.size)]
        back = torch.cat([part.reshape(-1) for part in result.split(rows, dim=spread.dim)])
        del result
    returned = back.new_empty(sum(sizes))
    dist.all_to_all_single(returned, back, sizes, owned, group=spread.group)
    for m, piece in zip(items, returned.split(sizes[: len(items)])):
        m.apply(piece.view(m.local.shape))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
