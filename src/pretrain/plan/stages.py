"""Pipeline stages: which layers, and which parameters, each stage of `parallel.pipeline` holds.

The trainer splits the model this way (pretrain.distributed.pipeline) and the planner counts it this way: one
rule for both. Stage 0 holds the embedding and its blocks, the last stage its blocks, the final norm and the
output layer; every parameter keeps its whole-model name ("blocks.5.mlp.up.weight" on whichever stage holds
block 5), so a checkpoint written by any layout loads into any other.

Layers are split as evenly as they divide; when they do not, the later stages take one more each. Under
1F1B stage k holds up to p - k micro-batches of activations in flight (Narayanan et al. 2021, section 2.2.1:
the first stage p of them), so the extra layers go where fewer are in flight.
"""

from __future__ import annotations

from .params import param_shapes


def stage_layers(num_layers: int, stages: int) -> list[range]:
    """The block indices of each stage, in order."""
    base, extra = divmod(num_layers, stages)
    sizes = [base + (1 if k >= stages - extra else 0) for k in range(stages)]
    starts = [sum(sizes[:k]) for k in range(stages)]
    return [range(start, start + size) for start, size in zip(starts, sizes)]


def in_flight(stage: int, stages: int, micro_batches: int) -> int:
    """Micro-batches whose activations stage `stage` holds at once under 1F1B: it runs p - stage forwards
    before its first backward (fewer when the step has fewer micro-batches)."""
    return min(stages - stage, micro_batches)


def stage_param_shapes(model_cfg, stage: int, stages: int) -> list[tuple[str, tuple]]:
    """(whole-model name, shape) of the parameters stage `stage` of `stages` holds, in the model's order."""
    shapes = param_shapes(model_cfg)
    if stages == 1:
        return shapes
    layers = stage_layers(model_cfg.num_layers, stages)[stage]
    first, last = stage == 0, stage == stages - 1

    def held(name: str) -> bool:
        if name.startswith("blocks."):
            return int(name.split(".")[1]) in layers
        if name.startswith(("embed.", "pos_embed.")):
            return first
        return last  # the final norm and the output layer

    return [(name, shape) for name, shape in shapes if held(name)]
