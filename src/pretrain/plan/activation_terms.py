"""A tensor kept for backward as the planner counts it (`Term`: its bytes, the formula they come from, whether
tensor parallelism splits it), the bytes per element it is counted in (`COMPUTE_BYTES` of the compute dtype,
`residual_bytes` of the residual stream) and one tensor rank's share of a list of them (`rank_bytes`).

Its own module because the block's terms (pretrain.plan.activations), the loss's (pretrain.plan.loss_terms) and
a Mixture-of-Experts block's (pretrain.plan.moe_activations) are all counted in these units, as are the step
time's communication volumes; kept below all of them, no two import each other for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..gpus import mixed_precision

if TYPE_CHECKING:
    from ..config.job_sections import ParallelConfig
    from ..config.schema import ResolvedTrainConfig

COMPUTE_BYTES = {"fp32": 4, "fp16-mixed": 2, "bf16-mixed": 2, "bf16": 2, "fp8": 2}
AddTerm = Callable[..., None]  # add(name, nbytes, formula, sharded=True): one Term of a layer


def residual_bytes(t: ResolvedTrainConfig, parallel: ParallelConfig) -> int:
    """Bytes per element of the residual stream. Autocast leaves the embedding output, and so every residual
    add, in fp32; pure bf16, FSDP's mixed precision (which casts the parameters) and train.half_residual (the
    embedding's output cast) keep it in bf16."""
    if t.precision == "bf16" or (mixed_precision(t.precision) and (parallel.fsdp or t.half_residual)):
        return 2
    return 4


@dataclass
class Term:
    name: str
    bytes: int
    formula: str
    sharded: bool  # divided by the tensor-parallel degree (norm terms only with sequence parallelism)


def rank_bytes(terms: list[Term], tensor: int, sequence_parallel: bool) -> int:
    """One tensor rank's bytes of `terms`: the sharded ones (all of them under sequence parallel) split tensor ways."""
    return sum(x.bytes // tensor if (x.sharded or sequence_parallel) else x.bytes for x in terms)
