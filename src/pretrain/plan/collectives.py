"""The data-parallel and optimizer terms of the step-time model (pretrain.plan.step_time, whose docstring gives
the model and its sources): the links a collective runs over, a ring's time, DDP / ZeRO-1 / FSDP traffic and what
of it the compute hides, and the optimizer's update. Pure Python."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..gpus import gpu_spec, mixed_precision
from .activation_terms import COMPUTE_BYTES
from .expert_parallel import rank_params
from .explain import Explain
from .hardware import memory_bandwidth_gbps

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig, ResolvedTrainConfig
    from .params import ParamCounts

BANDWIDTH_EFFICIENCY = 0.8  # of a data-sheet HBM / NVLink / network rate
DDP_BUCKET_BYTES = 25 * 1024**2  # torch DDP's default bucket_cap_mb
OVERLAP_SLOWDOWN = 0.189  # compute beside an overlapped collective: 18.9% slower (arXiv 2507.03114)
PCIE_GBPS = 25.0  # host <-> GPU, PCIe Gen4 x16 per direction as reached by pinned copies
HOST_GBPS_PER_GPU = 20.0  # a two-socket host's ~160 GB/s of memory bandwidth shared by 8 GPU processes


def links(c: ResolvedConfig) -> tuple[float, float, str]:
    """(intra-node, inter-node) GB/s per GPU per direction, and where they come from."""
    hw, spec = c.hardware, gpu_spec(c.hardware.gpu)
    intra = hw.intra_node_gbps if hw.intra_node_gbps is not None else spec.intra_node_gbps * BANDWIDTH_EFFICIENCY
    inter = hw.inter_node_gbps if hw.inter_node_gbps is not None else spec.inter_node_gbps * BANDWIDTH_EFFICIENCY
    how = (
        (
            "hardware.intra_node_gbps"
            if hw.intra_node_gbps is not None
            else f"{spec.name} {spec.intra_node_gbps:g} GB/s x {BANDWIDTH_EFFICIENCY}"
        )
        + ", "
        + (
            "hardware.inter_node_gbps"
            if hw.inter_node_gbps is not None
            else f"network {spec.inter_node_gbps:g} GB/s x {BANDWIDTH_EFFICIENCY}"
        )
    )
    return intra, inter, how


def ring(nbytes: float, ranks: int, gbps: float, factor: float) -> float:
    """Seconds for a ring collective moving factor x (ranks-1)/ranks x nbytes per GPU (all-reduce: 2)."""
    if ranks <= 1 or nbytes == 0:
        return 0.0
    if not gbps:
        return 0.0  # no bandwidth known for this device (a CPU): not modelled, said in --explain
    return factor * (ranks - 1) / ranks * nbytes / (gbps * 1e9)


def hbm_gbps(c: ResolvedConfig) -> float:
    return memory_bandwidth_gbps(c.hardware) * BANDWIDTH_EFFICIENCY


def bytes_per_value(t: ResolvedTrainConfig) -> tuple[int, int]:
    """(gradient, parameter) bytes: as pretrain.plan.memory holds them."""
    mixed = mixed_precision(t.precision)
    grad_b = 2 if t.precision == "bf16" or (mixed and t.grad_dtype == "same") else 4
    return grad_b, 2 if t.precision == "bf16" else 4


def data_parallel_time(c: ResolvedConfig, counts: ParamCounts, step: dict[str, Any], ex: Explain) -> dict[str, Any]:
    """The data-parallel traffic of a step, and what of it the compute does not hide."""
    par = c.parallel
    dp = par.gpus // (par.tensor * par.pipeline)
    if dp == 1:
        return {"data_parallel_s": 0.0, "data_parallel_exposed_s": 0.0}
    zero = par.zero_stage
    link, where, link_how = _data_parallel_link(c, dp)
    sync = Sync(c, counts, dp, link)
    if zero == 0:
        traffic = _ddp(sync, step)
    elif zero == 1:
        traffic = _zero1(sync, step)
    elif par.pipeline > 1:
        traffic = _fsdp_stage(c, sync, step)
    else:
        traffic = _fsdp(c, sync, step)
    total_s, last_s, window, after_s, hidden_gather_s, what, how = traffic
    exposed_s = max(total_s - window, last_s) + after_s
    hidden_s = total_s + hidden_gather_s - (exposed_s - after_s)  # what runs beside the compute
    contention_s = OVERLAP_SLOWDOWN * hidden_s
    ex.add(
        "step_time",
        "data_parallel_s",
        total_s + hidden_gather_s + after_s,
        f"{what}, over {where} {link:.4g} GB/s ({link_how})",
    )
    ex.add(
        "step_time",
        "data_parallel_exposed_s",
        exposed_s + contention_s,
        f"{how}: max({total_s:.4g} - "
        f"{window:.4g}, {last_s:.4g}) + {after_s:.4g}, + {OVERLAP_SLOWDOWN} x the {hidden_s:.4g} s hidden "
        "behind compute, which runs that much slower beside it (arXiv 2507.03114)",
    )
    return {"data_parallel_s": total_s + hidden_gather_s + after_s, "data_parallel_exposed_s": exposed_s + contention_s}


def _data_parallel_link(c: ResolvedConfig, dp: int) -> tuple[float, str, str]:
    """The data-parallel group's bus bandwidth per GPU, where it runs, and where the figure comes from."""
    par = c.parallel
    intra, inter, link_how = links(c)
    inside = par.tensor * dp <= par.gpus_per_node  # tensor ranks adjacent, then data: Megatron's rank order
    # Across nodes NCCL runs one ring per NIC (rail-aligned, one NIC per GPU): each of the group's k ranks in a
    # node carries 1/k of the data over its own NIC, so the group's bus bandwidth is k NICs', NVLink's at most
    # (a DGX node's 8 x 200 Gb/s NICs give its rings 200 GB/s together, not one NIC's 25; the NCCL docs'
    # NCCL_CROSS_NIC describes the rail-aligned rings).
    k = min(dp, max(1, par.gpus_per_node // par.tensor))
    if inside:
        return intra, "NVLink", link_how
    return min(intra, k * inter), f"network, {k} NICs per node", link_how


def _expert_data_parallel(c: ResolvedConfig, counts: ParamCounts, dp: int) -> tuple[float, int, float]:
    """(the routed experts' share of a rank's parameters, the ranks that hold the same experts, their link).
    Those ranks are dp x t / ep of the stage's (expert tensor parallelism 1: Megatron's and torchtitan's
    expert-data-parallel group), one in every ep consecutive ranks: only gpus_per_node / ep of them share a node,
    so an expert group as wide as a node leaves one rank of theirs per node, one NIC each (Megatron-Bridge's
    gpt-oss-120b at ep 8 on 64 B200s syncs its experts' gradients over 8 NICs, one per node)."""
    par = c.parallel
    ep = par.expert
    if ep == 1 or not counts.routed_experts:
        return 0.0, dp, 0.0
    share = (counts.routed_experts // ep) / rank_params(c, counts)
    edp = max(1, dp * par.tensor // ep)
    intra, inter, _ = links(c)
    per_node = max(1, par.gpus_per_node // ep)  # the group's ranks in one node
    if edp <= per_node:
        return share, edp, intra
    return share, edp, min(intra, per_node * inter)


class Sync:
    """One data-parallel group's collectives: the bytes of a rank's gradients and parameters, and the ring
    time of a reduce-scatter or all-gather of them (an all-reduce is both)."""

    def __init__(self, c: ResolvedConfig, counts: ParamCounts, dp: int, link: float):
        self.dp, self.link, self.micro = dp, link, c.train.grad_accum_steps
        params = rank_params(c, counts) / (c.parallel.tensor * c.parallel.pipeline)  # a stage's share, even
        grad_b, _ = bytes_per_value(c.train)
        self.grad_bytes, self.param_bytes = grad_b * params, COMPUTE_BYTES[c.train.precision] * params
        self.expert_share, self.edp, self.edp_link = _expert_data_parallel(c, counts, dp)

    def time(self, nbytes: float, factor: float = 1) -> float:
        """A ring over the group; with expert parallelism the routed experts' share over their own group."""
        if not self.expert_share:
            return ring(nbytes, self.dp, self.link, factor)
        share = self.expert_share
        return ring(nbytes * (1 - share), self.dp, self.link, factor) + ring(
            nbytes * share, self.edp, self.edp_link, factor
        )

    def last_bucket(self, nbytes: float, factor: float = 1) -> float:
        return self.time(min(DDP_BUCKET_BYTES, nbytes), factor)


def _ddp(sync: Sync, step: dict[str, Any]) -> tuple[Any, ...]:
    return (
        sync.time(sync.grad_bytes, 2),
        sync.last_bucket(sync.grad_bytes, 2),
        2 / 3 * (step["matmul_s"] + step["attention_s"]),  # the last micro-batch's backward
        0.0,
        0.0,
        f"all-reduce 2 x ({sync.dp}-1)/{sync.dp} x {sync.grad_bytes:.4g} gradient bytes",
        "overlapped with the last micro-batch's backward except the last 25 MB bucket",
    )


def _zero1(sync: Sync, step: dict[str, Any]) -> tuple[Any, ...]:
    compute = step["matmul_s"] + step["attention_s"]
    gather_s = sync.time(sync.param_bytes)
    after_s = max(gather_s - compute / 3, sync.last_bucket(sync.param_bytes))  # behind the next first forward
    return (
        sync.time(sync.grad_bytes),
        sync.last_bucket(sync.grad_bytes),
        2 / 3 * compute,
        after_s,
        gather_s - after_s,
        f"reduce-scatter ({sync.dp}-1)/{sync.dp} x {sync.grad_bytes:.4g} gradient bytes; then "
        f"the all-gather of {sync.param_bytes:.4g} parameter bytes, {gather_s:.4g} s, of "
        f"which {after_s:.4g} s not behind the next forward",
        "the reduce-scatter overlapped with the last micro-batch's backward except the last 25 MB bucket",
    )


def _fsdp(c: ResolvedConfig, sync: Sync, step: dict[str, Any]) -> tuple[Any, ...]:
    micro = sync.micro
    syncs = micro if c.parallel.grad_sync == "micro_batch" else 1
    gathers = 2 if c.parallel.zero_stage == 3 else 1
    total_s = syncs * sync.time(sync.grad_bytes) + micro * gathers * sync.time(sync.param_bytes)
    return (
        total_s,
        total_s / (micro * c.model.num_layers),
        step["forward_backward_s"],
        0.0,
        0.0,
        f"{syncs} reduce-scatter(s) of {sync.grad_bytes:.4g} gradient bytes + {micro} x {gathers} "
        f"all-gather(s) of {sync.param_bytes:.4g} parameter bytes, each ({sync.dp}-1)/{sync.dp} of it",
        "prefetched behind the micro-batches' compute except one block's worth",
    )


def _fsdp_stage(c: ResolvedConfig, sync: Sync, step: dict[str, Any]) -> tuple[Any, ...]:
    """FSDP2 per pipeline stage as torch.distributed.pipelining runs it (PipelineStage's backward and its
    REDUCE_GRAD action): no gradient sync and no resharding after the backward of any but the step's last
    micro-batch, then one reduce-scatter after the last backward, behind nothing. So ZeRO-2 gathers the
    parameters once a step (the first forward, prefetched but for one block) and ZeRO-3, resharding after each
    forward, once more for every micro-batch's forward and the backward that follows it."""
    micro, blocks = sync.micro, -(-c.model.num_layers // c.parallel.pipeline)
    gathers = 1 if c.parallel.zero_stage == 2 else 2 * micro
    scatter_s, gather_s = sync.time(sync.grad_bytes), gathers * sync.time(sync.param_bytes)
    return (
        gather_s,
        gather_s / (gathers * blocks),
        step["forward_backward_s"],
        scatter_s,
        0.0,
        f"{gathers} all-gather(s) of {sync.param_bytes:.4g} parameter bytes, then one reduce-scatter of "
        f"{sync.grad_bytes:.4g} gradient bytes after the last backward, each ({sync.dp}-1)/{sync.dp} of it",
        "the gathers prefetched behind the micro-batches' compute except one block's worth; the reduce-scatter "
        "after the last micro-batch's backward (pipelining's REDUCE_GRAD)",
    )


def optimizer_time(c: ResolvedConfig, counts: ParamCounts, ex: Explain) -> dict[str, Any]:
    """The update: memory-bound on the GPU, or on the host with offload (ZeRO-Offload, Ren et al. 2021)."""
    t, par = c.train, c.parallel
    shard = par.tensor * par.pipeline
    dp = par.gpus // shard
    params = rank_params(c, counts) / shard
    owned = params / (dp if dp > 1 and par.zero_stage >= 1 else 1)
    grad_b, param_b = bytes_per_value(t)
    states = {"adamw": 2, "sgd": 1 if t.momentum else 0, "adafactor": 0}[t.optimizer]
    update = owned * (2 * param_b * (1 + states) + grad_b)  # parameters and states read and written, gradients read
    if par.offload == "none":
        hbm = hbm_gbps(c)
        seconds = update / (hbm * 1e9) if hbm else 0.0
        ex.add(
            "step_time",
            "optimizer_s",
            seconds,
            f"{owned:.4g} parameters x (2 x {param_b} x (1 + {states} states) + {grad_b}) bytes / HBM",
        )
        return {"optimizer_s": seconds}
    a = COMPUTE_BYTES[t.precision]
    moved = owned * (grad_b + a)
    fetched = t.grad_accum_steps * 2 * a * params / dp if par.offload == "optimizer+params" else 0.0
    seconds = (moved + fetched) / (PCIE_GBPS * 1e9) + update / (HOST_GBPS_PER_GPU * 1e9)
    ex.add(
        "step_time",
        "optimizer_s",
        seconds,
        f"offload: gradients down and parameters up {moved:.4g} bytes"
        + (f" + parameter shards fetched per micro-batch {fetched:.4g}" if fetched else "")
        + f" over PCIe {PCIE_GBPS:g} GB/s + the update's {update:.4g} bytes at {HOST_GBPS_PER_GPU:g} GB/s of "
        "host memory per GPU",
    )
    return {"optimizer_s": seconds}
