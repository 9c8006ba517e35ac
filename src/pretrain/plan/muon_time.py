"""Muon's optimizer step in the step time, and the plan's advice where it matters (pretrain.plan.muon says
what one rank orthogonalises; docs/train.md: Muon). The step of the busiest rank, none of it overlapped:
  Newton-Schulz  its matrices' FLOPs (plan.muon.newton_schulz_flops) at the matmul rate the step's GEMMs
                 reach, in bf16 (the run precision's rate x the bf16 / that precision's peak);
  exchange       FSDP2's owners: each rank's bf16 rows of every sharded matrix to its owner and back, two
                 all-to-alls over the data-parallel link (NVLink inside a node, else the network);
  gather         tensor parallelism: the parts of each matrix it orthogonalises, all-gathered over NVLink;
  update         memory-bound, as AdamW's: parameters, momentum (the matrices) or moments (the rest) read
                 and written, gradients read, and for a matrix its fp32 and bf16 update written and read.
Pure Python."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..units import GiB
from .collectives import bytes_per_value, hbm_gbps, links
from .hardware import peak_tflops
from .model_states import model_state_tensors

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig
    from .explain import Explain

ADVICE_SHARE = 0.1  # Newton-Schulz above this share of the step is worth a layout that spreads it
MATRIX_UPDATE_BYTES = 4 + 4 + 2 + 2  # a matrix's fp32 update written and read, its bf16 copy written and read


def muon_optimizer_time(c: ResolvedConfig, step: dict[str, Any], ex: Explain) -> dict[str, Any]:
    """{"optimizer_s": the Muon step's seconds, "muon": its terms}: `step` the step-time model's micro-batch
    terms so far (its achievable_tflops)."""
    load = model_state_tensors(c)["muon"]
    ns_rate = step["achievable_tflops"] * _bf16_over_run_peak(c) * 1e12
    ns_s = load["newton_schulz_flops"] / ns_rate if ns_rate else 0.0
    link, where = _data_link(c)
    exchange_s = load["exchange_bytes"] / (link * 1e9) if link else 0.0
    intra, _, _ = links(c)
    gather_s = load["tensor_gather_bytes"] / (intra * 1e9) if intra else 0.0
    grad_b, param_b = bytes_per_value(c.train)
    moved = load["matrix_elements"] * (4 * param_b + grad_b + MATRIX_UPDATE_BYTES)
    moved += load["other_elements"] * (6 * param_b + grad_b)
    hbm = hbm_gbps(c)
    update_s = moved / (hbm * 1e9) if hbm else 0.0
    seconds = ns_s + exchange_s + gather_s + update_s
    ex.add(
        "step_time",
        "optimizer_s",
        seconds,
        f"muon: Newton-Schulz {load['newton_schulz_flops']:.4g} FLOPs of {load['matrices']} matrices at "
        f"{ns_rate / 1e12:.4g} TFLOP/s {ns_s:.4g} + exchange {load['exchange_bytes']:.4g} bytes over {where} "
        f"{exchange_s:.4g} + tensor gather {load['tensor_gather_bytes']:.4g} bytes {gather_s:.4g} + update "
        f"{moved:.4g} bytes / HBM {update_s:.4g}",
    )
    terms = {"newton_schulz_s": ns_s, "exchange_s": exchange_s, "tensor_gather_s": gather_s, "update_s": update_s}
    return {"optimizer_s": seconds, "muon": {**load, **terms}}


def _bf16_over_run_peak(c: ResolvedConfig) -> float:
    """Newton-Schulz multiplies in bf16: its rate is the run precision's x bf16's peak over that precision's
    (1 where either is unknown, or one key gives both: a CPU's hardware.peak_tflops)."""
    try:
        bf16, _ = peak_tflops(c.hardware, "bf16")
        run, _ = peak_tflops(c.hardware, c.train.precision)
    except ConfigError:  # a card without bf16: Newton-Schulz at the run's own rate
        return 1.0
    return bf16 / run if bf16 and run else 1.0


def _data_link(c: ResolvedConfig) -> tuple[float, str]:
    """The data-parallel group's GB/s per GPU for the owners' all-to-all, and where it runs (collectives.py's
    rule: inside a node over NVLink, else one NIC per rank of the group in a node)."""
    par = c.parallel
    intra, inter, _ = links(c)
    dp = par.data_parallel
    if par.tensor * dp <= par.gpus_per_node:
        return intra, "NVLink"
    k = min(dp, max(1, par.gpus_per_node // par.tensor))
    return min(intra, k * inter), f"network, {k} NICs per node"


def advice(c: ResolvedConfig, plan: dict[str, Any]) -> list[str]:
    """Where Muon's step matters: Newton-Schulz taking a large share of the step (and the layout that would
    spread it over more ranks), and its temporaries taking a large share of the memory."""
    step: dict[str, Any] = plan.get("step_time") or {}
    terms: dict[str, Any] | None = step.get("muon")
    if c.train.optimizer != "muon" or not terms:
        return []
    out: list[str] = []
    share = terms["newton_schulz_s"] / step["seconds"] if step["seconds"] else 0.0
    par = c.parallel
    if share >= ADVICE_SHARE:
        spread = ""
        if par.data_parallel > 1 and par.zero_stage == 0:
            spread = (
                f"; each of the {par.data_parallel} data-parallel replicas orthogonalises every matrix: "
                "parallel.zero_stage=1 or 3 gives each matrix to one of them"
            )
        out.append(
            f"muon: Newton-Schulz takes {terms['newton_schulz_s']:.3g} s of the {step['seconds']:.3g} s step "
            f"({share:.0%}): {terms['matrices']} matrices, {terms['newton_schulz_flops']:.3g} FLOPs on the "
            f"busiest rank{spread}"
        )
    usable = plan.get("usable_memory_bytes")
    working = terms["working_bytes"]
    if usable and working >= ADVICE_SHARE * usable:
        out.append(
            f"muon: orthogonalising the largest matrix holds {working / GiB:.3g} GiB of bf16 temporaries at the "
            f"step, {working / usable:.0%} of the usable memory (the update, its result and Newton-Schulz's "
            "X X^T); tensor parallelism does not shrink it (each tensor rank orthogonalises the whole matrix)"
        )
    return out
