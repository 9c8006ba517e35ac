"""The data-parallel and optimizer terms of the step-time model (pretrain.plan.step_time, whose docstring gives
the model and its sources): the links a collective runs over, a ring's time, DDP / ZeRO-1 / FSDP traffic and what
of it the compute hides, and the optimizer's update. Pure Python."""

from __future__ import annotations

from ..gpus import gpu_spec, mixed_precision
from .activations import COMPUTE_BYTES
from .expert_parallel import rank_params
from .explain import Explain
from .hardware import memory_bandwidth_gbps

BANDWIDTH_EFFICIENCY = 0.8  # of a data-sheet HBM / NVLink / network rate
DDP_BUCKET_BYTES = 25 * 1024**2  # torch DDP's default bucket_cap_mb
OVERLAP_SLOWDOWN = 0.189  # compute beside an overlapped collective: 18.9% slower (arXiv 2507.03114)
PCIE_GBPS = 25.0  # host <-> GPU, PCIe Gen4 x16 per direction as reached by pinned copies
HOST_GBPS_PER_GPU = 20.0  # a two-socket host's ~160 GB/s of memory bandwidth shared by 8 GPU processes


def links(c) -> tuple[float, float, str]:
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


def hbm_gbps(c) -> float:
    return memory_bandwidth_gbps(c.hardware) * BANDWIDTH_EFFICIENCY


def bytes_per_value(t) -> tuple[int, int]:
    """(gradient, parameter) bytes: as pretrain.plan.memory holds them."""
    mixed = mixed_precision(t.precision)
    grad_b = 2 if t.precision == "bf16" or (mixed and t.grad_dtype == "same") else 4
    return grad_b, 2 if t.precision == "bf16" else 4


def data_parallel_time(c, counts, step: dict, ex: Explain) -> dict:
    """The data-parallel traffic of a step, and what of it the compute does not hide."""
    t, par = c.train, c.parallel
    tp, pp = par.tensor, par.pipeline
    dp = par.gpus // (tp * pp)
    zero = par.zero_stage if dp > 1 else 0
    if dp == 1:
        return {"data_parallel_s": 0.0, "data_parallel_exposed_s": 0.0}
    intra, inter, link_how = links(c)
    inside = tp * dp <= par.gpus_per_node  # tensor ranks adjacent, then data: Megatron's rank order
    # Across nodes NCCL runs one ring per NIC (rail-aligned, one NIC per GPU): each of the group's k ranks in a
    # node carries 1/k of the data over its own NIC, so the group's bus bandwidth is k NICs', NVLink's at most
    # (a DGX node's 8 x 200 Gb/s NICs give its rings 200 GB/s together, not one NIC's 25; the NCCL docs'
    # NCCL_CROSS_NIC describes the rail-aligned rings).
    k = min(dp, max(1, par.gpus_per_node // tp))
    link, where = (intra, "NVLink") if inside else (min(intra, k * inter), f"network, {k} NICs per node")
    params = rank_params(c, counts) / (tp * pp)  # on one GPU before ZeRO (a stage's share, taken as even)
    grad_b, param_b = bytes_per_value(t)
    a, micro = COMPUTE_BYTES[t.precision], t.grad_accum_steps
    after_s = hidden_gather_s = 0.0
    if zero == 0:
        total_s = ring(grad_b * params, dp, link, 2)
        last_s = ring(min(DDP_BUCKET_BYTES, grad_b * params), dp, link, 2)
        window = 2 / 3 * (step["matmul_s"] + step["attention_s"])  # the last micro-batch's backward
        what = f"all-reduce 2 x ({dp}-1)/{dp} x {grad_b * params:.4g} gradient bytes"
        how = "overlapped with the last micro-batch's backward except the last 25 MB bucket"
    elif zero == 1:
        compute = step["matmul_s"] + step["attention_s"]
        scatter_s = ring(grad_b * params, dp, link, 1)
        gather_s = ring(a * params, dp, link, 1)
        last_s = ring(min(DDP_BUCKET_BYTES, grad_b * params), dp, link, 1)
        last_gather_s = ring(min(DDP_BUCKET_BYTES, a * params), dp, link, 1)
        window = 2 / 3 * compute
        after_s = max(gather_s - compute / 3, last_gather_s)  # behind the next step's first forward
        total_s, hidden_gather_s = scatter_s, gather_s - after_s
        what = (
            f"reduce-scatter ({dp}-1)/{dp} x {grad_b * params:.4g} gradient bytes; then "
            f"the all-gather of {a * params:.4g} parameter bytes, {gather_s:.4g} s, of "
            f"which {after_s:.4g} s not behind the next forward"
        )
        how = "the reduce-scatter overlapped with the last micro-batch's backward except the last 25 MB bucket"
    else:
        syncs = micro if par.grad_sync == "micro_batch" else 1
        gathers = 2 if zero == 3 else 1
        total_s = syncs * ring(grad_b * params, dp, link, 1) + micro * gathers * ring(a * params, dp, link, 1)
        last_s = total_s / (micro * -(-c.model.num_layers // pp))
        window = step["forward_backward_s"]
        what = (
            f"{syncs} reduce-scatter(s) of {grad_b * params:.4g} gradient bytes + {micro} x {gathers} "
            f"all-gather(s) of {a * params:.4g} parameter bytes, each ({dp}-1)/{dp} of it"
        )
        how = "prefetched behind the micro-batches' compute except one block's worth"
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
    exposed_s += contention_s
    return {"data_parallel_s": total_s + hidden_gather_s + after_s, "data_parallel_exposed_s": exposed_s}


def optimizer_time(c, counts, ex: Explain) -> dict:
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
