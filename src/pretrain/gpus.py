"""Accelerator catalog: dense peak TFLOP/s per dtype, memory, bandwidth and links, from vendor data sheets.

Peaks are dense (no 2:4 sparsity). `tf32` is what fp32 matmuls run at when TF32 is allowed, which `pretrain
train` does on CUDA (`torch.set_float32_matmul_precision("high")`). Memory is what `nvidia-smi` reports as
total. Pure data on the ground floor: the config checks hardware.gpu against it, the planner reads it, the
trainer names its device with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

from .errors import ConfigError
from .units import MiB


@dataclass(frozen=True)
class GpuSpec:
    name: str
    peak_tflops: dict[str, float] = field(default_factory=dict)  # dtype -> dense TFLOP/s
    memory_bytes: int = 0
    bandwidth_gbps: float = 0.0  # device memory, GB/s
    source: str = "vendor data sheet"
    intra_node_gbps: float = 0.0  # GPU to GPU in a node (NVLink, else PCIe), per GPU per direction, GB/s
    inter_node_gbps: float = 0.0  # the network per GPU per direction (InfiniBand / RoCE), GB/s


def _spec(name, memory_mib, bandwidth, **peaks) -> GpuSpec:
    return GpuSpec(name=name, peak_tflops=peaks, memory_bytes=memory_mib * MiB, bandwidth_gbps=bandwidth)


CATALOG: dict[str, GpuSpec] = {
    s.name: s
    for s in [
        # NVIDIA V100 SXM2 (Volta): fp16 tensor cores only, no bf16 and no tf32.
        _spec("v100-16gb", 16 * 1024, 900, fp32=15.7, fp16=125.0),
        _spec("v100-32gb", 32 * 1024, 900, fp32=15.7, fp16=125.0),
        _spec("t4", 15 * 1024, 320, fp32=8.1, fp16=65.0),
        # Ampere.
        _spec("a10", 24 * 1024, 600, fp32=31.2, tf32=62.5, fp16=125.0, bf16=125.0),
        _spec("a100-40gb", 40 * 1024, 1555, fp32=19.5, tf32=156.0, fp16=312.0, bf16=312.0),
        _spec("a100-80gb", 80 * 1024, 2039, fp32=19.5, tf32=156.0, fp16=312.0, bf16=312.0),
        _spec("a800-80gb", 80 * 1024, 2039, fp32=19.5, tf32=156.0, fp16=312.0, bf16=312.0),
        _spec("rtx3090", 24 * 1024, 936, fp32=35.6, tf32=35.6, fp16=71.0, bf16=71.0),
        # Ada and Hopper (fp8 dense with fp32 accumulation).
        _spec("rtx4090", 24 * 1024, 1008, fp32=82.6, tf32=82.6, fp16=165.2, bf16=165.2, fp8=330.3),
        _spec("l40s", 46068, 864, fp32=91.6, tf32=183.0, fp16=362.05, bf16=362.05, fp8=733.0),
        _spec("h100-pcie", 81559, 2000, fp32=51.0, tf32=378.0, fp16=756.0, bf16=756.0, fp8=1513.0),
        _spec("h100-sxm", 81559, 3350, fp32=67.0, tf32=494.7, fp16=989.4, bf16=989.4, fp8=1978.9),
        _spec("h800", 81559, 3350, fp32=67.0, tf32=494.7, fp16=989.4, bf16=989.4, fp8=1978.9),
        _spec("h200", 143771, 4800, fp32=67.0, tf32=494.7, fp16=989.4, bf16=989.4, fp8=1978.9),
        _spec("b200", 183359, 8000, fp32=80.0, tf32=1100.0, fp16=2250.0, bf16=2250.0, fp8=4500.0),
        # AMD Instinct MI300X.
        _spec("mi300x", 192 * 1024, 5300, fp32=163.4, tf32=653.7, fp16=1307.4, bf16=1307.4, fp8=2614.9),
        # A CPU has no data-sheet peak here: measure it with `pretrain bench` (hardware.profile) or set
        # hardware.peak_tflops; memory is the host's.
        GpuSpec(name="cpu", peak_tflops={}, memory_bytes=0, bandwidth_gbps=0.0, source="measure with pretrain bench"),
        # A GPU the catalog lacks: give hardware.memory_gb and hardware.peak_tflops (or a profile). `pretrain
        # train` on such a card takes its memory from the device and measures its matmul peak at start.
        GpuSpec(
            name="other-gpu", peak_tflops={}, memory_bytes=0, bandwidth_gbps=0.0, source="measure with pretrain bench"
        ),
    ]
}

# Links per GPU per direction, GB/s, from the data sheets: NVLink's total bidirectional figure halved (V100 300
# -> 150, A100 600 -> 300, A800 400 -> 200, H100/H200 900 -> 450, H800 400 -> 200, B200 1,800 -> 900, MI300X
# Infinity Fabric 896 -> 448), PCIe x16 for cards without it (Gen3 16, Gen4 32, Gen5 64); the network is one
# NIC per GPU as in NVIDIA's DGX systems (DGX-1 100 Gb/s EDR 12.5, DGX A100 200 Gb/s HDR 25, DGX H100 / B200
# 400 Gb/s NDR 50), 100 Gb/s Ethernet for PCIe cards.
LINKS = {
    "v100-16gb": (150, 12.5),
    "v100-32gb": (150, 12.5),
    "t4": (16, 12.5),
    "a10": (32, 12.5),
    "a100-40gb": (300, 25),
    "a100-80gb": (300, 25),
    "a800-80gb": (200, 25),
    "rtx3090": (32, 12.5),
    "rtx4090": (32, 12.5),
    "l40s": (32, 12.5),
    "h100-pcie": (64, 50),
    "h100-sxm": (450, 50),
    "h800": (200, 50),
    "h200": (450, 50),
    "b200": (900, 50),
    "mi300x": (448, 50),
}
CATALOG = {
    name: (replace(spec, intra_node_gbps=LINKS[name][0], inter_node_gbps=LINKS[name][1]) if name in LINKS else spec)
    for name, spec in CATALOG.items()
}

ALIASES = {"h100": "h100-sxm", "a100": "a100-80gb", "v100": "v100-32gb", "a800": "a800-80gb"}
# What each training precision multiplies in (the catalog's peaks are per dtype).
# fp8: the converted linears multiply in e4m3 (their peak is the catalog's fp8), everything else in bf16: the
# peak behind time and MFU is bf16's, the comparable figure (docs/train.md: FP8 training).
COMPUTE_DTYPE = {"fp32": "tf32", "fp16-mixed": "fp16", "bf16-mixed": "bf16", "bf16": "bf16", "fp8": "bf16"}


def mixed_precision(precision: str) -> bool:
    """fp32 master weights with autocast: the *-mixed precisions, and fp8, whose other ops autocast to bf16."""
    return precision.endswith("-mixed") or precision == "fp8"


class _TrainKeys(Protocol):
    """The train.* keys read here (config/job_sections.py's TrainConfig: the catalog sits below the config)."""

    @property
    def cache_weight_casts(self) -> bool: ...
    @property
    def precision(self) -> str: ...


class _ParallelKeys(Protocol):
    """The parallel.* keys read here (config/job_sections.py's ParallelConfig)."""

    @property
    def fsdp(self) -> bool: ...
    @property
    def tensor(self) -> int: ...
    @property
    def pipeline(self) -> int: ...


def caches_weight_casts(train: _TrainKeys, parallel: _ParallelKeys) -> bool:
    """train.cache_weight_casts where the trainer applies it: autocast does the casting (a *-mixed precision
    or fp8; FSDP's policy casts instead) and the parameters are plain tensors of one stage (no tensor or
    pipeline parallelism), so one autocast context can span a step's micro-batches."""
    return (
        train.cache_weight_casts
        and mixed_precision(train.precision)
        and not parallel.fsdp
        and parallel.tensor == 1
        and parallel.pipeline == 1
    )


def gpu_spec(name: str) -> GpuSpec:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in CATALOG:
        raise ConfigError(f"hardware.gpu: unknown accelerator {name!r}; choose one of {', '.join(CATALOG)}")
    return CATALOG[key]


def catalog_name(device_name: str) -> str | None:
    """The catalog entry for a `torch.cuda.get_device_name()` string, e.g. 'NVIDIA H100 80GB HBM3'."""
    name = device_name.upper()
    rules = [
        ("H100", "PCIE", "h100-pcie"),
        ("H100", "", "h100-sxm"),
        ("H200", "", "h200"),
        ("H800", "", "h800"),
        ("A100", "80GB", "a100-80gb"),
        ("A100", "", "a100-40gb"),
        ("A800", "", "a800-80gb"),
        ("L40S", "", "l40s"),
        ("4090", "", "rtx4090"),
        ("3090", "", "rtx3090"),
        ("V100", "32GB", "v100-32gb"),
        ("V100", "", "v100-16gb"),
        ("A10", "", "a10"),
        ("T4", "", "t4"),
        ("MI300X", "", "mi300x"),
        ("B200", "", "b200"),
    ]
    for model, variant, key in rules:
        if model in name and variant in name:
            return key
    return None
