"""Pipeline stages: which layers, and which parameters, each stage of `parallel.pipeline` holds.

The trainer splits the model this way (pretrain.distributed.pipeline) and the planner counts it this way: one
rule for both. Stage 0 holds the embedding and its blocks, the last stage its blocks, the final norm and the
output layer; every parameter keeps its whole-model name ("blocks.5.mlp.up.weight" on whichever stage holds
block 5), so a checkpoint written by any layout loads into any other.

Layers are split as evenly as they divide; when they do not, the later stages take one more each. Under
1F1B stage k holds up to p - k micro-batches of activations in flight (Narayanan et al. 2021, section 2.2.1:
the first stage p of them), so the extra layers go where fewer are in flight.

Interleaved 1F1B (section 2.2.2) splits the layers into v * p chunks and gives pipeline rank k the chunks
k, k + p, ..., k + (v - 1) p: the bubble shrinks to (p - 1) / (v m + p - 1) of the step, for v times the
point-to-point traffic and more activations in flight on the first rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .params import param_shapes

if TYPE_CHECKING:
    from ..config.job_sections import ParallelConfig
    from ..config.schema import ResolvedModelConfig


def stage_layers(num_layers: int, stages: int) -> list[range]:
    """The block indices of each stage, in order."""
    base, extra = divmod(num_layers, stages)
    sizes = [base + (1 if k >= stages - extra else 0) for k in range(stages)]
    starts = [sum(sizes[:k]) for k in range(stages)]
    return [range(start, start + size) for start, size in zip(starts, sizes)]


INTERLEAVED_CHUNKS = 2  # v: model chunks per pipeline rank under interleaved 1F1B


def chunks_per_stage(parallel: ParallelConfig) -> int:
    """v, the model chunks each pipeline rank runs: 2 under interleaved 1F1B, else 1."""
    interleaved = parallel.pipeline > 1 and parallel.pipeline_schedule == "interleaved_1f1b"
    return INTERLEAVED_CHUNKS if interleaved else 1


def chunk_indices(stage: int, stages: int, chunks: int) -> list[int]:
    """The model chunks pipeline rank `stage` of `stages` runs, of stages * chunks in all (one per rank
    without interleaving: its own index)."""
    return [stage + j * stages for j in range(chunks)]


def bubble_fraction(stages: int, micro_batches: int, chunks: int = 1) -> float:
    """Idle fraction of a pipelined step: (p - 1) / (v m + p - 1) (Narayanan et al. 2021, sections 2.2.1 and
    2.2.2: a bubble of (p - 1) / v micro-batch times beside m of work)."""
    return (stages - 1) / (chunks * micro_batches + stages - 1)


def in_flight(stage: int, stages: int, micro_batches: int) -> int:
    """Micro-batches whose activations stage `stage` holds at once under 1F1B: it runs p - stage forwards
    before its first backward (fewer when the step has fewer micro-batches)."""
    return min(stages - stage, micro_batches)


def chunks_in_flight(stage: int, stages: int, micro_batches: int, chunks: int) -> int:
    """(Chunk, micro-batch) activations pipeline rank `stage` holds at once under interleaved 1F1B: the
    forwards of its warm-up, (v - 1) rounds of micro-batches plus 2 (p - 1 - stage), and the one of its first
    backward (torch.distributed.pipelining's ScheduleInterleaved1F1B; the first rank's v p + p - 1 chunks are
    Narayanan et al.'s 1 + (p - 1) / (v p) times 1F1B's p stages)."""
    per_round = micro_batches // max(1, micro_batches // stages)
    warmup = (chunks - 1) * per_round + 2 * (stages - 1 - stage)
    return min(warmup + 1, chunks * micro_batches)


def stage_param_shapes(
    model_cfg: ResolvedModelConfig, stage: int, stages: int, chunks: int = 1
) -> list[tuple[str, tuple[Any, ...]]]:
    """(whole-model name, shape) of the parameters pipeline rank `stage` of `stages` holds (its `chunks`
    model chunks' under interleaved 1F1B), in the model's order."""
    shapes = param_shapes(model_cfg)
    if stages == 1:
        return shapes
    return [named for named, k in zip(shapes, param_stages(model_cfg, shapes, stages, chunks)) if k == stage]


def param_stages(model_cfg: ResolvedModelConfig, shapes: list[Any], stages: int, chunks: int = 1) -> list[int]:
    """The pipeline rank holding each of `shapes` (param_shapes(model_cfg)): its block's chunk's rank (chunk c
    runs on rank c mod p, chunk_indices), the embedding on the first, the final norm and output layer on the
    last. One pass over the model for all the stages at once (the planner sizes every stage of every layout)."""
    split = stage_layers(model_cfg.num_layers, stages * chunks)
    rank_of_layer = [c % stages for c, layers in enumerate(split) for _ in layers]

    def rank(name: str) -> int:
        if name.startswith("blocks."):
            return rank_of_layer[int(name.split(".")[1])]
        return 0 if name.startswith(("embed.", "pos_embed.")) else stages - 1

    return [rank(name) for name, _ in shapes]
