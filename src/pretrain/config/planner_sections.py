"""The planner's sections: `hardware:` (the machine, and overrides of its data sheet), `measured:` (figures
measured on it), `flops:` (what FLOPs time and MFU count), `plan:` (how memory is accounted) and `budget:` (what
a budget buys): the questions `pretrain plan` answers about a machine, apart from the job's sections that the
trainer runs."""

from __future__ import annotations

from dataclasses import dataclass

from .key_doc import doc


@dataclass(frozen=True)
class HardwareConfig:
    gpu: str = doc(
        "a100-80gb",
        "accelerator from the catalog (`pretrain plan --list-gpus` lists it), cpu, or "
        "other-gpu (a card not listed: give memory_gb and peak_tflops)",
    )
    mfu: float | None = doc(
        None,
        "explicit override of the step-time model: an assumed model FLOPs utilisation "
        "(fraction of peak); when set, time = model FLOPs / (gpus x peak x mfu)",
    )
    hfu: float | None = doc(
        None,
        "explicit override of the step-time model: an assumed hardware FLOPs "
        "utilisation; when set, time = hardware FLOPs (recomputation included) / (gpus x peak "
        "x hfu)",
    )
    peak_tflops: float | None = doc(None, "override the catalog's dense peak TFLOP/s for the compute dtype")
    memory_gb: float | None = doc(None, "override the card's memory (GB, 1e9 bytes)")
    bandwidth_gbps: float | None = doc(
        None,
        "override the card's data-sheet memory bandwidth (GB/s), which sets "
        "the step-time model's memory-bound terms: a variant of a catalog card "
        "(an H100 with 96 GB of HBM2e: 2400) or an other-gpu",
    )
    profile: str | None = doc(
        None, "a hardware profile JSON written by `pretrain bench`: its achievable TFLOP/s replaces the data-sheet peak"
    )
    price_per_gpu_hour: float | None = doc(None, "price of one GPU-hour, for a cost estimate")
    intra_node_gbps: float | None = doc(
        None,
        "step-time model: GB/s per GPU per direction between GPUs of a node, "
        "as measured (nccl-tests bus bandwidth); default the catalog's NVLink / "
        "PCIe figure x 0.8 (h100-sxm 450, a100 300)",
    )
    inter_node_gbps: float | None = doc(
        None,
        "step-time model: GB/s per GPU per direction between nodes, as "
        "measured; default the catalog's network x 0.8 (one 400 Gb/s NIC per "
        "H100 = 50, 200 Gb/s per A100 = 25)",
    )
    cuda_context_gb: float = doc(1.3, "memory taken by the CUDA context and kernels (GB)")
    fragmentation: float = doc(0.1, "fraction of the card kept free for allocator fragmentation")


@dataclass(frozen=True)
class MeasuredConfig:
    tokens_per_second: float | None = doc(None, "measured throughput of the whole job")
    iterations_per_second: float | None = doc(None, "measured optimizer steps per second")
    step_time_seconds: float | None = doc(None, "measured seconds per optimizer step")


@dataclass(frozen=True)
class FlopsConfig:
    causal_attention: bool = doc(False, "count the attention term halved (causal) instead of PaLM's full")
    convention: str = doc(
        "palm",
        "FLOPs behind time and MFU: palm (6 x non-embedding N + attention) | "
        "6n (6 x all parameters; 8 x with full recomputation)",
        ("palm", "6n"),
    )


@dataclass(frozen=True)
class PlanConfig:
    framework: str = doc(
        "pretrain",
        "memory accounting of `pretrain plan`: pretrain (what our trainer holds) | "
        "megatron | deepspeed | zero-paper (each framework's published formulas, added to the plan "
        "as `framework`; sources in --explain)",
        ("pretrain", "megatron", "deepspeed", "zero-paper"),
    )
    routing_imbalance: float = doc(
        1.72,
        "MoE: the busiest expert's tokens over the mean; under expert parallelism the busiest "
        "rank's load follows from it (its experts' mean), for the routed tokens' activations, the "
        "exchanges and the expert GEMMs' time; 1.72 = 1 + MaxVio_global 0.72 of the "
        "auxiliary-loss-balanced 1B MoE of Wang et al. 2024 (arXiv 2408.15664, table 2); "
        "1 = perfectly balanced (docs/moe.md)",
    )


@dataclass(frozen=True)
class BudgetConfig:
    gpu_hours: float | None = doc(
        None,
        "planner budget mode: GPU-hours to spend. No model given: the plan chooses "
        "the Chinchilla-optimal model and tokens for that compute; a model given "
        "(model.preset, model.hf_config or a shape key away from its default): it keeps "
        "that model and sets train.tokens to what the budget buys at the plan's own time; "
        "train.tokens, max_steps or examples beside a budget are refused (docs/plan.md: "
        "Budget mode)",
    )
    days: float | None = doc(None, "budget mode: days of parallel.gpus GPUs (as budget.gpu_hours)")
    cost: float | None = doc(None, "budget mode: money to spend, at hardware.price_per_gpu_hour (as budget.gpu_hours)")
