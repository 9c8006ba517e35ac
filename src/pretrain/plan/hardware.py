"""The hardware a plan runs on: the peak behind time and MFU (the catalog's data sheet, a profile measured by
`pretrain bench` that replaces it, or hardware.peak_tflops) and the memory of one card."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..files import read_json
from ..gpus import COMPUTE_DTYPE, gpu_spec
from ..machine import BUSY_CORES

if TYPE_CHECKING:
    from ..config.planner_sections import HardwareConfig


def load_profile(path: str | Path) -> dict[str, Any]:
    """A hardware profile JSON from `pretrain bench`: {"device", "peak_tflops": {dtype: best}, ...}."""
    path = Path(path)
    fix = "write one with `pretrain bench --out FILE`"
    profile = read_json(path, "hardware.profile", fix)
    # JSON: checked to be a mapping just here
    if not isinstance(profile, dict) or not isinstance(profile.get("peak_tflops"), dict):  # pyright: ignore[reportUnknownMemberType]
        raise ConfigError(f"hardware.profile: {path} has no 'peak_tflops' mapping; {fix}")
    # JSON: checked to be a mapping just here
    return profile  # pyright: ignore[reportUnknownVariableType]


def _measured_peak(path: str | Path, dtype: str, value: object) -> float:
    """A profile's figure (TFLOP/s, seconds per op, GB/s) must be a positive finite number: anything else would
    print negative or NaN time."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        name = dtype if dtype in ("op_seconds", "memory_bandwidth_gbps") else f"peak_tflops.{dtype}"
        raise ConfigError(
            f"hardware.profile: {path}: {name} is {value!r}, not a positive number; rerun `pretrain bench`"
        )
    return float(value)


def peak_tflops(hardware: HardwareConfig, precision: str) -> tuple[float | None, str]:
    """Peak TFLOP/s of one device for the run's compute dtype, and where the number comes from."""
    dtype = COMPUTE_DTYPE[precision]
    if hardware.peak_tflops:
        return hardware.peak_tflops, "hardware.peak_tflops"
    if hardware.profile:
        measured = load_profile(hardware.profile)["peak_tflops"]
        for key in (dtype, "fp32" if dtype == "tf32" else dtype):
            if measured.get(key) is not None:
                where = _measured_where(load_profile(hardware.profile))
                return _measured_peak(
                    hardware.profile, key, measured[key]
                ), f"measured {key} in {hardware.profile}{where}"
        raise ConfigError(f"hardware.profile: {hardware.profile} has no {dtype} figure; rerun `pretrain bench`")
    spec = gpu_spec(hardware.gpu)
    peaks = spec.peak_tflops
    if precision == "fp8" and peaks and "fp8" not in peaks:
        raise ConfigError(
            f"train.precision: {spec.name} has no float8 tensor cores (Hopper, Ada, Blackwell and "
            "MI300 have); use train.precision=bf16-mixed"
        )
    if not peaks:
        return None, f"{spec.name}: no data-sheet peak; set hardware.profile or hardware.peak_tflops"
    if dtype == "tf32" and "tf32" not in peaks:
        dtype = "fp32"
    if dtype not in peaks:
        fix = "fp16-mixed" if "fp16" in peaks else "fp32"
        raise ConfigError(f"train.precision: {spec.name} has no {dtype} support; use train.precision={fix}")
    return peaks[dtype], f"{spec.name} {dtype} dense peak ({spec.source})"


def _measured_where(profile: dict[str, Any]) -> str:
    """What a profile measured, as it says: the machine, CPU, threads, torch and date (pretrain bench's and the
    trainer's own profiles carry them; a profile without them says nothing more)."""
    label = {"threads": "threads {}", "torch": "torch {}", "date": "on {}"}
    said = [
        label.get(k, "{}").format(profile[k])
        for k in ("machine", "processor", "threads", "torch", "date")
        if profile.get(k) is not None
    ]
    busy = profile.get("busy_cores")
    if isinstance(busy, (int, float)) and busy > BUSY_CORES:  # measured while other work ran: said, not hidden
        said.append(f"while other processes kept {busy:.1f} cores busy")
    return f": {', '.join(said)}" if said else ""


def cpu_figures(hardware: HardwareConfig) -> tuple[float | None, float | None, dict[str, str]]:
    """(seconds per eager op, memory GB/s, where each came from) of a CPU: a profile's measured figures
    (pretrain.bench.cpu_profile), the bandwidth also from hardware.bandwidth_gbps; None where none is known."""
    profile = load_profile(hardware.profile) if hardware.profile else {}
    op_s, gbps = profile.get("op_seconds"), profile.get("memory_bandwidth_gbps")
    for name, value in (("op_seconds", op_s), ("memory_bandwidth_gbps", gbps)):
        if value is not None:
            _measured_peak(hardware.profile or "", name, value)  # a positive finite number, or one line
    how = {
        "ops": f"measured in {hardware.profile}" if op_s else "assumed: no measured op_seconds (hardware.profile)",
        "bandwidth": f"measured in {hardware.profile}" if gbps else "assumed: no measured bandwidth",
    }
    if gbps is None and hardware.bandwidth_gbps:
        gbps, how["bandwidth"] = hardware.bandwidth_gbps, "hardware.bandwidth_gbps"
    return op_s, gbps, how


def memory_bandwidth_gbps(hardware: HardwareConfig) -> float:
    """The card's data-sheet memory bandwidth, GB/s: hardware.bandwidth_gbps, else the catalog's (0: unknown)."""
    if hardware.bandwidth_gbps is not None:
        return hardware.bandwidth_gbps
    return gpu_spec(hardware.gpu).bandwidth_gbps


def device_memory_bytes(hardware: HardwareConfig) -> int | None:
    if hardware.memory_gb is not None:  # even a size that rounds to 0 bytes is a card nothing fits on
        return int(hardware.memory_gb * 1e9)
    return gpu_spec(hardware.gpu).memory_bytes or None
