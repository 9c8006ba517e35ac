"""Which attention kernel runs grouped-query attention: one rule for the model and the planner.

SDPA's `enable_gqa=True` lets a fused kernel read each k/v head once for its whole group of query heads, but
only some kernels take it; the others fall back, silently, to the math kernel, which keeps the seq x seq
scores for backward (gigabytes at long sequences). Which kernels take it:
  - CUDA: flash attention (Ampere and later, fp16/bf16, head_dim <= 256) and cuDNN do; the memory-efficient
    kernel, the one fp32 runs on, does not.
  - CPU: the flash kernel does from torch 2.9 on (earlier ones run GQA on the math kernel).
Where no fused kernel takes it, the model repeats k and v to every query head first (as torchtitan does)
and a fused kernel still runs; the planner counts the repeated copies that SDPA then keeps.
Also which RMSNorm kernel runs (`fused_rms_norm`): what it keeps for backward depends on it.
Pure Python: the planner imports it without torch.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from importlib import metadata
from typing import TYPE_CHECKING

from ..config.schema import half_residual_enabled

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig

PRE_AMPERE_GPUS = ("v100-16gb", "v100-32gb", "t4")  # no flash attention in PyTorch before compute 8.0
CPU_GQA_TORCH = (2, 9)
CUDA_FUSED_RMS_NORM_TORCH = (2, 8)  # F.rms_norm's fused CUDA kernel (aten._fused_rms_norm)


def torch_version_tuple(version: str | None) -> tuple[int, int] | None:
    """'2.6.0+cu124' -> (2, 6); None when unknown."""
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match[1]), int(match[2])) if match else None


@functools.lru_cache(maxsize=1)
def installed_torch_version() -> str | None:
    """The installed torch's version, read from its metadata without importing it."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def native_gqa(device: str, half: bool, head_dim: int, torch_version: str | None, flash_gpu: bool = True) -> bool:
    """True: SDPA gets the grouped k/v heads (enable_gqa). False: the model repeats them to every query head.

    device 'cpu' or 'cuda'; half: the attention inputs are fp16/bf16; flash_gpu: the GPU has flash attention
    (compute capability 8.0 or later); an unknown torch version counts as a recent one."""
    if device == "cpu":
        version = torch_version_tuple(torch_version)
        return version is None or version >= CPU_GQA_TORCH
    return half and head_dim <= 256 and flash_gpu


def planned_native_gqa(cfg: ResolvedConfig) -> bool:
    """The rule for a planned config: its hardware, its precision, the torch installed here."""
    from ..gpus import gpu_spec

    name = gpu_spec(cfg.hardware.gpu).name
    device = "cpu" if name == "cpu" else "cuda"
    return native_gqa(
        device,
        cfg.train.precision != "fp32",
        cfg.model.head_dim,
        installed_torch_version(),
        flash_gpu=name not in PRE_AMPERE_GPUS,
    )


def planned_document_kernel(cfg: ResolvedConfig, compiled: bool = False) -> str | None:
    """The kernel of train.document_masking's attention, as the trainer picks it (pretrain.model.documents):
    None without masking; "mask" (a boolean mask) under train.attention eager or compiled on the CPU; "loop"
    (SDPA per document) on the CPU; "flex" on a GPU."""
    from ..gpus import gpu_spec

    if not cfg.train.document_masking:
        return None
    if cfg.train.attention == "eager":
        return "mask"
    if gpu_spec(cfg.hardware.gpu).name != "cpu":
        return "flex"
    return "mask" if compiled else "loop"


def fused_rms_norm(device: str, torch_version: str | None) -> bool:
    """Does F.rms_norm run a fused kernel that keeps only its (fp32) input and 1/rms for backward? On CUDA
    from torch 2.8 on. The CPU runs the composite, which also keeps the fp32 normalised x
    (tests/model/test_norm.py); an unknown torch version counts as a recent one."""
    if device != "cuda":
        return False
    version = torch_version_tuple(torch_version)
    return version is None or version >= CUDA_FUSED_RMS_NORM_TORCH


def planned_fused_norm(cfg: ResolvedConfig) -> bool:
    """The rule for a planned config: its hardware, the torch installed here."""
    return fused_rms_norm(planned_device(cfg), installed_torch_version())


def planned_device(cfg: ResolvedConfig) -> str:
    """'cpu' or 'cuda': the device a config's hardware.gpu names (the trainer plans with the one it runs on)."""
    from ..gpus import gpu_spec

    return "cpu" if gpu_spec(cfg.hardware.gpu).name == "cpu" else "cuda"


def planned_switches(cfg: ResolvedConfig) -> ResolvedConfig:
    """The config with train.half_residual's null resolved for the planned device, as the trainer resolves it
    for its own (config.half_residual_enabled): a new object, the given one unchanged."""
    t = cfg.train
    if t.half_residual is not None:
        return cfg
    return dataclasses.replace(
        cfg, train=dataclasses.replace(t, half_residual=half_residual_enabled(t, planned_device(cfg)))
    )
