"""Muon in the plan (`train.optimizer: muon`; the trainer's side is distributed/muon.py, docs/train.md: Muon):
which tensors it orthogonalises and in which row blocks, its parameter groups and states (one momentum per
matrix; AdamW's two moments and step for the rest), the Newton-Schulz FLOPs of one update, and what one rank
orthogonalises and exchanges at the step, with the memory that takes. Pure Python."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .params import fused_rows, numel

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..config.job_sections import TrainConfig
    from ..config.schema import ResolvedConfig, ResolvedModelConfig

UPDATE_BYTES = 2  # the update is orthogonalised, and exchanged between ranks, in bf16


def is_muon_matrix(name: str, shape: Sequence[int]) -> bool:
    """A tensor Muon updates: a block's weight matrix (attention, MLP, shared and routed experts). AdamW takes
    the rest: the embedding and output layer (Muon's authors keep them on AdamW), norms, biases, routers."""
    return name.startswith("blocks.") and len(shape) >= 2 and ".mlp.router." not in name and not name.endswith("bias")


def adamw_like_lr(t: TrainConfig) -> float:
    """The peak lr to hold against AdamW's published ones: train.lr, but for Muon's original lr scale, whose
    matrices take a lr ~0.02 (Keller Jordan's): then the AdamW part's, train.adamw_lr."""
    return (t.adamw_lr or t.lr) if t.optimizer == "muon" and t.muon_lr_adjust == "original" else t.lr


def row_parts(name: str, shape: Sequence[int], m: ResolvedModelConfig) -> list[int] | None:
    """The row blocks of a Muon tensor orthogonalised apart, each its own matrix: q, k, v of a fused qkv; gate
    and up of a SwiGLU input (dense, shared experts, and each routed expert's); None for a whole matrix."""
    if ".mlp.experts." in name and name.endswith(".up"):
        return [shape[-2] // 2, shape[-2] // 2]
    return fused_rows(name, m)


def muon_groups(m: ResolvedModelConfig, shapes: Sequence[tuple[str, Sequence[int]]]) -> list[list[int]]:
    """The optimizer's parameter groups as indices into `shapes`: the Muon tensors, one group per kind of row
    blocks (whole matrices, [q, k, v], [gate, up], ...: a group's tensors split alike), then AdamW's decayed
    (embedding, output layer, routers) and undecayed ones (norms, biases, a tied embedding), as for AdamW."""
    kinds: dict[tuple[int, ...], list[int]] = {}
    decay: list[int] = []
    no_decay: list[int] = []
    for i, (name, shape) in enumerate(shapes):
        if is_muon_matrix(name, shape):
            kinds.setdefault(tuple(row_parts(name, shape, m) or ()), []).append(i)
        elif len(shape) >= 2 and not (m.tie_embeddings and name == "embed.weight"):
            decay.append(i)
        else:
            no_decay.append(i)
    return [g for g in (*kinds.values(), decay, no_decay) if g]


def state_numel(name: str, shape: tuple[int, ...]) -> int:
    """Elements of optimizer state of one tensor: Muon's momentum, or AdamW's two moments."""
    return numel(shape) if is_muon_matrix(name, shape) else 2 * numel(shape)


def newton_schulz_flops(shape: Sequence[int], parts: Sequence[int], steps: int) -> int:
    """FLOPs of orthogonalising one tensor's update: each of its matrices (leading dimensions: experts), each row
    block of r rows and c columns on its own, with m = min(r, c), n = max(r, c), each iteration
    S = X X^T (2 m^2 n), b S + c S^2 (2 m^3), a X + (..) X (2 m^2 n)."""
    batch = numel(tuple(shape[:-2]))
    cols = shape[-1]
    per_matrix = 0
    for rows in parts:
        small, large = min(rows, cols), max(rows, cols)
        per_matrix += steps * (4 * small * small * large + 2 * small**3)
    return batch * per_matrix


def newton_schulz_working(shape: Sequence[int], parts: Sequence[int], split: int = 1) -> int:
    """Bytes alive while one tensor is orthogonalised (distributed/muon.py's newton_schulz, in bf16): the update
    it starts from, the result when it is put together from row blocks, the tensor rank's part it was gathered
    from (`split` > 1), and inside one row block's iteration X, S = X X^T, b S + c S^2 and the new X."""
    batch, cols = numel(tuple(shape[:-2])), shape[-1]
    whole = numel(tuple(shape))
    block = max(batch * (2 * rows * cols + 2 * min(rows, cols) ** 2) for rows in parts)
    held = whole * (2 if len(parts) > 1 else 1) + (whole // split if split > 1 else 0)
    return UPDATE_BYTES * (held + block)


class Shard(Protocol):
    """What model_states' ZeRO shard says of a tensor: over how many ranks it is sharded, this rank's place
    among them, and on which dimension."""

    def group(self, name: str) -> int: ...

    def place(self, name: str) -> int: ...

    def dim(self, name: str, shape: tuple[int, ...]) -> int: ...


def step_load(
    cfg: ResolvedConfig,
    held: Sequence[tuple[str, tuple[int, ...]]],
    whole: dict[str, tuple[int, ...]],
    shard: Shard,
    sharded: bool,
) -> dict[str, Any]:
    """What one rank's Muon step does (distributed/muon_exchange.py): `held` the tensors it steps, each as it
    holds it (its tensor rank's part, E/ep experts), `whole` their shapes gathered over the tensor ranks, `shard`
    ZeRO's sharding of them (FSDP2 when `sharded`). Returns the matrices it orthogonalises, their Newton-Schulz
    FLOPs, the bytes it exchanges (the owners' all-to-alls, the tensor ranks' all-gathers) and the peak bytes
    of the step's temporaries."""
    m, t = cfg.model, cfg.train
    rounds: dict[tuple[int, str], list[str]] = {}
    mine: list[tuple[tuple[int, ...], list[int], int]] = []  # (matrix, row blocks, tensor ranks it spans)
    exchanged = 0
    elements = {True: 0, False: 0}  # of the Muon tensors and of the rest, as this rank holds them
    for name, shape in held:
        ranks = shard.group(name) if sharded else 1
        elements[is_muon_matrix(name, shape)] += -(-numel(shape) // ranks)
        if not is_muon_matrix(name, shape):
            continue
        full = whole[name]
        split = numel(full) // numel(shape)  # tensor parallelism's split of it (1: whole here)
        dim = shard.dim(name, shape)
        if ranks > 1 and dim >= len(shape) - 2:  # an owner assembles it (muon_exchange.py)
            rounds.setdefault((ranks, _owners(name, cfg)), []).append(name)
            exchanged += 2 * UPDATE_BYTES * numel(shape) * (ranks - 1) // ranks  # there and back
            continue
        if ranks > 1:  # routed experts sharded on dim 0: this rank's whole ones
            chunk = -(-full[0] // ranks)
            full = (max(0, min(chunk, full[0] - shard.place(name) * chunk)), *full[1:])
        mine.append((full, _parts(name, full, m), split))
    for (ranks, _), names in rounds.items():
        order = sorted(names, key=lambda n: -newton_schulz_flops(whole[n], _parts(n, whole[n], m), t.muon_ns_steps))
        for name in order[shard.place(names[0]) :: ranks]:
            mine.append((whole[name], _parts(name, whole[name], m), cfg.parallel.tensor if _split(name, cfg) else 1))
    return {
        "matrices": len(mine),
        "newton_schulz_flops": sum(newton_schulz_flops(f, parts, t.muon_ns_steps) for f, parts, _ in mine),
        "exchange_bytes": exchanged,
        "tensor_gather_bytes": sum(UPDATE_BYTES * numel(f) * (k - 1) // k for f, _, k in mine),
        "working_bytes": max((newton_schulz_working(f, parts, k) for f, parts, k in mine), default=0),
        "matrix_elements": elements[True],
        "other_elements": elements[False],
        "adamw_tensors": sum(not is_muon_matrix(n, s) for n, s in held),
    }


def _parts(name: str, full: tuple[int, ...], m: ResolvedModelConfig) -> list[int]:
    return row_parts(name, full, m) or [full[-2]]


def _owners(name: str, cfg: ResolvedConfig) -> str:
    """Which of the trainer's FSDP2 groups assigns this tensor to its owner: the routed experts' own
    (expert-data-parallel) group, an MoE layer's group of all ranks beside tensor parallelism (its shared
    experts), or the data-parallel one."""
    par = cfg.parallel
    if ".mlp.experts." in name and par.expert > 1:
        return "experts"
    folded = cfg.model.num_experts > 0 and par.tensor > 1 and par.expert_tensor == 1
    return "moe" if folded and ".mlp.shared." in name else "data"


def _split(name: str, cfg: ResolvedConfig) -> bool:
    """Whether tensor parallelism splits this Muon tensor (not an MoE layer's experts: whole on a tensor rank)."""
    return cfg.parallel.tensor > 1 and ".mlp.experts." not in name and ".mlp.shared." not in name
