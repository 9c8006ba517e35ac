"""The plan and the run check each other: the planner's figures for exactly this config, printed at start,
then the measured ones beside them after a few steps, written to RUN_DIR/plan_vs_run.json."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..config import replaced
from ..files import write_atomic
from ..gpus import catalog_name
from ..machine import BUSY_CORES, BusyMeter, cores
from ..plan.hardware import peak_tflops as planners_peak
from ..precision import matmul_dtype
from ..units import GiB, nbytes

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig
    from ..distributed.runtime import Runtime


def config_for_device(config: ResolvedConfig, rt: Runtime) -> ResolvedConfig:
    """The run's config with the hardware the run really has: the detected GPU (or cpu), the world size."""
    hardware = {"gpu": "cpu"}
    if rt.device.type == "cuda":
        # A card the catalog lacks is not planned as the config's default: its own memory, its peak measured.
        hardware["gpu"] = catalog_name(torch.cuda.get_device_name(rt.device)) or "other-gpu"
        if hardware["gpu"] == "other-gpu" and config.hardware.memory_gb is None:
            hardware["memory_gb"] = torch.cuda.get_device_properties(rt.device).total_memory / 1e9
    return dataclasses.replace(
        config,
        hardware=dataclasses.replace(config.hardware, **hardware),
        parallel=dataclasses.replace(config.parallel, gpus=rt.world_size),
    )


def measured_hardware(device_config: ResolvedConfig, device: torch.device) -> tuple[dict[str, Any], str]:
    """(the hardware keys this run's plan needs beyond the config's, where its peak comes from): none when the
    planner has a peak (the catalog, hardware.profile, hardware.peak_tflops); on a CPU, this machine's own
    profile (hardware.profile: its matmul peak, the seconds of one eager op and its memory bandwidth, which the
    step-time model times a CPU step with: pretrain.plan.cpu_time); on a GPU the catalog lacks, its best matmul
    (hardware.peak_tflops). Both measured once and kept per machine, CPU, threads, torch and dtype, never probed
    inside each run (on a busy machine one read 10-100x low); a profile measured busy is measured again once
    the machine is idle."""
    planned, source = planners_peak(device_config.hardware, device_config.train.precision)
    if planned:
        return {}, source
    dtype = matmul_dtype(device_config.train.precision, device.type)
    if device.type == "cpu":
        path = cpu_profile_path(dtype)
        profile = read_json_or_empty(path)
        if not _usable(profile, dtype):
            from ..bench.cpu_profile import cpu_profile

            profile = cpu_profile(dtype)
            _keep(path, profile)
        hardware = {"hardware.profile": str(path)}
        kept = "this machine's own, measured once and kept (delete it to measure again)"
        with_profile = replaced(device_config, hardware)
        return hardware, f"{planners_peak(with_profile.hardware, with_profile.train.precision)[1]}; {kept}"
    return _gpu_peak(dtype, device)


def cpu_profile_path(dtype: str) -> Path:
    """This machine's CPU profile for `dtype` at torch's threads: one file per machine, CPU, threads and torch."""
    from ..bench.cpu_profile import processor

    key = f"{platform.node()} | {processor()} | {dtype} | {torch.get_num_threads()} threads | torch {torch.__version__}"
    name = re.sub(
        r"[^A-Za-z0-9.+-]+", "-", f"{platform.node()}-{dtype}-{torch.get_num_threads()}t-torch{torch.__version__}"
    )
    return _cache_dir() / "profiles" / f"{name}-{hashlib.sha1(key.encode()).hexdigest()[:8]}.json"


def _usable(profile: dict, dtype: str) -> bool:
    """A kept profile serves unless it lacks this dtype or was measured while other work ran and the machine is
    idle now (then it is measured again, on the idle machine)."""
    if not isinstance(profile.get("peak_tflops"), dict) or dtype not in profile["peak_tflops"]:
        return False
    if "op_seconds" not in profile:
        return False
    busy = profile.get("busy_cores")
    return not (isinstance(busy, (int, float)) and busy > BUSY_CORES and not busy_now())


def busy_now(seconds: float = 0.2) -> bool:
    """Whether other processes keep this machine's cores busy right now (a short look at the OS's counters)."""
    meter = BusyMeter()
    time.sleep(seconds)
    busy = meter.busy_cores()
    return busy is not None and busy > BUSY_CORES


def _keep(path: Path, profile: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(profile, indent=1))
    except OSError:  # a read-only home: measure again next time
        pass


def _gpu_peak(dtype: str, device: torch.device) -> tuple[dict[str, Any], str]:
    """A GPU the catalog lacks: its best matmul, measured once per machine, card, threads and torch."""
    what = torch.cuda.get_device_name(device)
    key = f"{platform.node()} | {what} | {dtype} | {torch.get_num_threads()} threads | torch {torch.__version__}"
    cache = _cache_dir() / "peak_tflops.json"
    known = read_json_or_empty(cache)
    if key not in known:
        from ..bench.matmul import summary, sweep

        known[key] = summary(sweep(dtype, device, budget=2.0, quick=True))[0]
        _keep(cache, known)
    return {"hardware.peak_tflops": known[key]}, (
        f"best {dtype} matmul of this {what}, measured once on {platform.node()} and kept in {cache} (delete it to "
        "measure again; `pretrain bench --out profile.json` + hardware.profile is steadier)"
    )


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pretrain"


def read_json_or_empty(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def summary(p: dict) -> str:
    m = p["memory_bytes"]
    tps = p["time"].get("tokens_per_second")
    lines = [
        f"plan: {p['params']['total']:,} parameters; per device: weights {m['weights'] / GiB:.3f} GiB, "
        f"gradients {m['gradients'] / GiB:.3f}, optimizer {m['optimizer'] / GiB:.3f}, activations "
        f"{m['activations'] / GiB:.3f}, buffers {m['buffers'] / GiB:.3f}, total {m['total'] / GiB:.3f} GiB"
    ]
    context = p["flops"].get("attention_context")
    if context is not None:  # train.document_masking: said at the start, as every other switch of the attention
        lines.append(
            f"plan: document masking on: each token attends within its own document of the window, positions "
            f"restarting; attention priced at {context:,.1f} keys per query"
        )
    if tps:
        lines.append(
            f"plan: {tps:,.0f} tokens/s for the job at MFU {p['time']['utilisation']:.3g} "
            f"({p['time']['basis']}) of {p['hardware']['peak_tflops']:g} TFLOP/s "
            f"({p['hardware']['peak_source']})"
        )
    return "\n".join(lines)


def _row(name: str, planned: float | None, measured: float | None, unit: str) -> dict:
    error = None
    if planned not in (None, 0) and measured is not None:
        error = round(100.0 * (measured - planned) / planned, 2)
    return {"name": name, "planned": planned, "measured": measured, "unit": unit, "error_pct": error}


def compare(
    p: dict,
    states: dict,
    saved: dict | None,
    peak_allocated: int | None,
    tokens_per_s: float,
    mfu: float | None,
    planned_mfu: float | None,
    device: str,
) -> dict:
    """Rows of planned vs measured. Model states are exact on every device; activations are the tensors
    autograd saved (hook-counted); on CUDA the allocator's peak is compared with the planned total."""
    ms = p["model_states"]
    rows = [_row(k, ms[k], states[k], "bytes") for k in ("parameters", "gradients", "optimizer_states")]
    if saved is not None:
        rows.append(_row("working_copies", ms["working_copies"], saved["working_copies"], "bytes"))
        rows.append(_row("activations", p["memory_bytes"]["activations"], saved["activations"], "bytes"))
        planned_total = sum(ms.values()) + p["memory_bytes"]["activations"]
        measured_total = sum(states.values()) + saved["working_copies"] + saved["activations"]
        rows.append(_row("model states + activations", planned_total, measured_total, "bytes"))
    if peak_allocated is not None:
        planned_peak = p["memory_bytes"]["total"] - p["memory_bytes"]["cuda_context"]
        rows.append(_row("peak allocated", planned_peak, peak_allocated, "bytes"))
    rows.append(_row("tokens_per_s", p["time"].get("tokens_per_second"), tokens_per_s, "tokens/s"))
    rows.append(_row("mfu", planned_mfu, mfu, "fraction"))
    st = p.get("step_time") or {}
    if st.get("mfu_mixed_peak"):  # fp8: the same speed against the peak of the GEMM mix (plan/fp8.py)
        to_mixed = st["mfu_mixed_peak"] / st["mfu"]
        rows.append(
            _row("mfu_mixed_peak", planned_mfu * to_mixed, mfu * to_mixed if mfu is not None else None, "fraction")
        )
    for key, planned in (st.get("moe_mfu") or {}).items():  # MoE: the same speed under each FLOP convention
        scale = planned / st["mfu"] if planned is not None and st.get("mfu") else None
        rows.append(
            _row(
                f"mfu_{key.removeprefix('per_token_')}",
                planned_mfu * scale if scale is not None and planned_mfu is not None else None,
                mfu * scale if scale is not None and mfu is not None else None,
                "fraction",
            )
        )
    notes = []
    if mfu is not None and mfu > 1:
        hw = p["hardware"]
        notes.append(
            f"measured MFU {mfu:.2f} > 1: the peak {hw['peak_tflops']:.4g} TFLOP/s ({hw['peak_source']}) is "
            f"below what this run achieved, so it was measured on a busy machine or set too low; measure "
            f"it on an idle one (`pretrain bench --out profile.json`, then hardware.profile=profile.json)"
        )
    return {
        "device": device,
        "rows": rows,
        "notes": notes,
        "advice": p.get("advice", []),
        "plan": {k: p[k] for k in ("params", "memory_bytes", "model_states", "hardware", "flops")},
    }


def mark_busy(report: dict, busy_cores: float | None, threads: int) -> dict:
    """A CPU run timed while other processes kept `busy_cores` of the machine's cores busy: its speed is the
    share it got, not what the plan (an idle machine's) predicts. The speed rows keep the measured figure but
    no error ("busy"), and a note says why; `report` as it was on an idle machine."""
    if busy_cores is None or busy_cores <= BUSY_CORES:
        return report
    for row in report["rows"]:
        if row["unit"] in ("tokens/s", "fraction"):  # tokens/s and the MFUs made of it
            row["error_pct"], row["busy"] = None, True
    report["busy_cores"] = busy_cores
    report["notes"].append(
        f"not compared: other processes kept {busy_cores:.1f} of this machine's {cores()} cores busy while the "
        "speed was measured, and the plan is an idle machine's ("
        + (
            f"torch's {threads} threads wait for each other at every op, so a shared core slows a step 2-20x"
            if threads > 1
            else "a core shared with other work gives this run a share of it"
        )
        + "); measure on an idle machine, or with OMP_NUM_THREADS=1 on a busy one"
    )
    return report


def render(report: dict) -> str:
    lines = [f"plan vs run on {report['device']}:", f"  {'':28} {'planned':>14} {'measured':>14} {'error':>8}"]
    for r in report["rows"]:

        def show(v):
            if v is None:
                return "n/a"
            if r["unit"] == "bytes":  # noqa: B023 (called within the iteration that defines it)
                return nbytes(v)
            if r["unit"] == "fraction":  # noqa: B023 (likewise)
                return f"{v:.3f}"
            return f"{v:,.0f}"

        err = "busy" if r.get("busy") else "" if r["error_pct"] is None else f"{r['error_pct']:+.1f}%"
        lines.append(f"  {r['name']:28} {show(r['planned']):>14} {show(r['measured']):>14} {err:>8}")
    lines += [f"  ! {note}" for note in report.get("notes", [])]  # the plan's advice was said at start
    return "\n".join(lines)


def write(run_dir: Path, report: dict, name: str = "plan_vs_run.json") -> Path:
    path = Path(run_dir) / name
    return write_atomic(path, json.dumps(report, indent=1))
