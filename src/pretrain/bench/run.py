"""`pretrain bench` as a function: measure this machine and return its hardware profile (a JSON-ready dict)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ..config import Config, load_config
from ..distributed.runtime import resolve_device
from ..errors import UsageError
from ..files import write_atomic
from ..plan.flops import mfu
from ..plan.hardware import peak_tflops
from ..precision import matmul_dtype
from . import DTYPES, matmul
from .bandwidth import device_copy_gbps, host_to_device_gbps
from .block import block_throughput
from .cpu_profile import op_seconds
from .timing import NOISY_SPREAD_PCT, check_rounds, check_threads, cpu_threads, spread, torch_threads

# Seconds of measurement; small shapes finish early. On 2 CPU cores the default run took 24 s in all
# (docs/bench.md, "Measured").
DEFAULT_SECONDS = {"cpu": 25.0, "cuda": 120.0}
QUICK_SECONDS = {"cpu": 6.0, "cuda": 30.0}
# How the budget is shared: the matmul sweep (split evenly over the dtypes) is the main result.
SHARE = {"matmul": 0.7, "copy": 0.05, "host_to_device": 0.05, "block": 0.2}

# With no config: the block of TinyLlama 1.1B (H=2048, H'=5632, 32 query and 4 key/value heads), a small
# model of the current (Llama) architecture; shorter sequences on a CPU so a step takes well under a second.
DEFAULT_MODEL = ["model.preset=tinyllama-1.1b"]
DEFAULT_TRAIN = {"cuda": {"seq_len": 2048, "micro_batch_size": 4}, "cpu": {"seq_len": 256, "micro_batch_size": 1}}


def parse_dtypes(dtypes) -> list[str]:
    """A list or comma-separated string of dtypes, checked; None = all of them."""
    if dtypes is None:
        return list(DTYPES)
    names = [d.strip().lower() for d in (dtypes.split(",") if isinstance(dtypes, str) else dtypes) if d.strip()]
    unknown = [d for d in names if d not in DTYPES]
    if unknown or not names:
        raise UsageError(
            f"--dtypes: unknown dtype {', '.join(unknown) or '(none given)'}; choose from {','.join(DTYPES)}"
        )
    return names


def bench_config(path=None, overrides=(), device: torch.device = torch.device("cpu")) -> Config:
    """The run's config; with no file, the default block (DEFAULT_MODEL, DEFAULT_TRAIN) under the overrides."""
    if path is not None:
        return load_config(path, overrides)
    given = {item.split("=", 1)[0].strip() for item in overrides}
    defaults = [] if any(k.startswith("model.") for k in given) else list(DEFAULT_MODEL)
    defaults += [f"train.{k}={v}" for k, v in DEFAULT_TRAIN[device.type].items() if f"train.{k}" not in given]
    return load_config(None, defaults + list(overrides))


def run_bench(
    config: Config | str | Path | dict | None = None,
    overrides=(),
    dtypes=None,
    seconds: float | None = None,
    device: str | None = None,
    quick: bool = False,
    progress=None,
    rounds: int = 3,
    threads: int | None = None,
) -> dict:
    """Measure matmul TFLOP/s per dtype, memory and host-to-device bandwidth, and one block of `config`.

    `config`: a Config, a YAML path or a dict (with `overrides`), or None for the default small model.
    `seconds`: the measurement budget (default DEFAULT_SECONDS, or QUICK_SECONDS with `quick`).
    `rounds`: everything is measured this many times in turn (round 1 measures every figure once, then
      round 2 ...), a 1/rounds share of the budget each; each figure is the median of its rounds, with
      their spread in `spread_pct` and a warning above timing.NOISY_SPREAD_PCT.
    `threads`: torch's CPU threads; None: the free cores (timing.cpu_threads).
    `progress(done, total, description)` is called as the work advances.
    """
    dev = resolve_device(device, "--device")
    wanted = parse_dtypes(dtypes)
    _check_arguments(seconds, rounds, threads)
    budget = seconds or (QUICK_SECONDS if quick else DEFAULT_SECONDS)[dev.type]
    cfg = config if isinstance(config, Config) else bench_config(config, overrides, dev)
    started = time.perf_counter()

    skipped, measured = _dtypes_to_measure(wanted, dev)

    advance = _progress_counter(progress, total=rounds * (len(measured) * len(matmul.shapes(dev, quick)) + 3))
    n_threads, chosen_as = cpu_threads(threads) if dev.type == "cpu" or threads else (None, None)
    with torch_threads(n_threads or torch.get_num_threads()):
        runs = _rounds(cfg, dev, budget, quick, measured, rounds, advance)
    shapes = _median_shapes(runs)
    peaks, medians = _peaks(shapes, measured, wanted, dev)
    noise = _spreads(runs, measured)
    h2d = [run["host_to_device"] for run in runs]
    # The block of the median round (median_low: a round that ran, with its own step time), its MFU against
    # the peaks of all rounds.
    block = sorted((run["block"] for run in runs), key=lambda b: b["tokens_per_s"])[(rounds - 1) // 2]
    block = _block(cfg, dev, peaks, block)

    return {
        "device": _device_name(dev),
        "device_type": dev.type,
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "threads": n_threads,
        "threads_chosen_as": chosen_as,
        "rounds": rounds,
        "budget_seconds": budget,
        "elapsed_seconds": time.perf_counter() - started,
        "peak_tflops": _in_order(peaks),
        "median_tflops": _in_order(medians),
        "skipped": skipped,
        "shapes": shapes,
        "memory_bandwidth_gbps": statistics.median(run["copy"] for run in runs),
        # a CPU's eager op, what a small model's step is made of (pretrain.plan.cpu_time reads it)
        "op_seconds": op_seconds(budget * SHARE["copy"], peaks.get("fp32") or 0.1)[0] if dev.type == "cpu" else None,
        "host_to_device_gbps": None if h2d[0] is None else statistics.median(h2d),
        "block": block,
        "spread_pct": noise,
        "warnings": _noise_warnings(noise, rounds),
    }


def _progress_counter(progress, total: int):
    """advance(description): one more of the `total` measurements done, told to `progress` (from 0 of total)."""
    done = 0

    def advance(description: str):
        nonlocal done
        done += 1
        if progress:
            progress(done, total, description)

    if progress:
        progress(0, total, "matmul")
    return advance


def _noise_warnings(noise: dict, rounds: int) -> list[str]:
    """One line per figure whose rounds differ by more than NOISY_SPREAD_PCT."""
    return [
        f"warning: {name}: spread {pct:.0f}% over {rounds} rounds, above {NOISY_SPREAD_PCT:.0f}%: the "
        "machine is busy; measure on a quiet one"
        for name, pct in _flat(noise)
        if pct > NOISY_SPREAD_PCT
    ]


def _check_arguments(seconds, rounds, threads) -> None:
    if seconds is not None and not seconds > 0:
        raise UsageError(f"--seconds: must be a positive number of seconds, got {seconds}")
    check_rounds(rounds)
    check_threads(threads)


def _rounds(
    cfg: Config, dev: torch.device, budget: float, quick: bool, measured: list[str], rounds: int, advance
) -> list[dict]:
    """`rounds` rounds of every figure, a 1/rounds share of the budget each. Round 1 chooses the shapes its
    budget pays for; the later rounds measure the same ones."""
    runs: list[dict] = []
    for r in range(rounds):
        runs.append(
            _round(
                cfg,
                dev,
                budget / rounds,
                quick,
                measured,
                runs[0]["shapes"] if runs else None,
                advance,
                f" (round {r + 1})" if rounds > 1 else "",
            )
        )
    return runs


def _dtypes_to_measure(wanted, dev: torch.device) -> tuple[dict, list[str]]:
    """({dtype: why not} for the device, the dtypes to measure in DTYPES order). On a CPU tf32 is fp32 (there
    are no TF32 units): fp32 is measured once and reported under both names."""
    skipped = {d: reason for d in wanted if (reason := matmul.unavailable(d, dev))}
    measured = [d for d in DTYPES if d in wanted and d not in skipped]
    if dev.type == "cpu" and "tf32" in measured:
        measured = [d for d in measured if d != "tf32"]
        if "fp32" not in measured:
            measured.insert(0, "fp32")
    return skipped, measured


def _peaks(shapes: list[dict], measured: list[str], wanted, dev: torch.device) -> tuple[dict, dict]:
    """Each measured dtype's best and median TFLOP/s over its shapes; tf32 as fp32 on a CPU."""
    peaks, medians = {}, {}
    for dtype in measured:
        peaks[dtype], medians[dtype] = matmul.summary([s for s in shapes if s["dtype"] == dtype])
    if dev.type == "cpu" and "tf32" in wanted:
        peaks["tf32"], medians["tf32"] = peaks["fp32"], medians["fp32"]
    return peaks, medians


def _median_shapes(runs: list[dict]) -> list[dict]:
    """Each matmul shape of round 1 at its median time over the rounds (a later round's budget may have stopped
    short of a shape: its rounds only)."""
    shapes = []
    for first in runs[0]["shapes"]:
        seconds = statistics.median(s["seconds"] for run in runs for s in run["shapes"] if _shape(s) == _shape(first))
        flops = 2 * first["m"] * first["n"] * first["k"]
        shapes.append({**first, "seconds": seconds, "tflops": flops / seconds / 1e12})
    return shapes


def _round(
    cfg: Config,
    dev: torch.device,
    budget: float,
    quick: bool,
    dtypes: list[str],
    first: list | None,
    advance,
    label: str,
) -> dict:
    """One measurement of every figure within `budget` seconds; the matmuls over `first`'s shapes if given."""
    shapes = []
    for dtype in dtypes:
        todo = [(s["m"], s["n"], s["k"]) for s in first if s["dtype"] == dtype] if first else None
        shapes += matmul.sweep(
            dtype,
            dev,
            budget * SHARE["matmul"] / len(dtypes),
            quick,
            todo=todo,
            on_shape=lambda result, d=dtype: advance(f"matmul {d}{label}"),
        )
    copy = device_copy_gbps(dev, budget * SHARE["copy"])
    advance(f"device memory bandwidth{label}")
    h2d = host_to_device_gbps(dev, budget * SHARE["host_to_device"])
    advance(f"host-to-device bandwidth{label}")
    block = block_throughput(cfg, dev, budget * SHARE["block"], None)  # its MFU comes with all rounds' peaks
    advance(f"transformer block{label}")
    return {"shapes": shapes, "copy": copy, "host_to_device": h2d, "block": block}


def _shape(result: dict) -> tuple:
    return result["dtype"], result["m"], result["n"], result["k"]


def _spreads(runs: list[dict], dtypes: list[str]) -> dict:
    """(max - min) / median in % over the rounds, of each dtype's best TFLOP/s, each bandwidth, the block."""

    def pct(values):
        return None if values[0] is None else spread(values)["spread_pct"]  # None for one round

    return {
        "peak_tflops": {
            d: pct([max(s["tflops"] for s in run["shapes"] if s["dtype"] == d) for run in runs]) for d in dtypes
        },
        "memory_bandwidth_gbps": pct([run["copy"] for run in runs]),
        "host_to_device_gbps": pct([run["host_to_device"] for run in runs]),
        "block_tokens_per_s": pct([run["block"]["tokens_per_s"] for run in runs]),
    }


def _flat(noise: dict) -> list[tuple[str, float]]:
    pairs = [(f"{d} matmul", p) for d, p in noise["peak_tflops"].items()]
    pairs += [
        (name, noise[key])
        for name, key in (
            ("memory copy", "memory_bandwidth_gbps"),
            ("host to device", "host_to_device_gbps"),
            ("block", "block_tokens_per_s"),
        )
    ]
    return [(name, p) for name, p in pairs if p is not None]


def _block(cfg: Config, dev: torch.device, peaks: dict, result: dict) -> dict:
    """The block's figures, with its MFU against this run's best of the compute dtype, else the catalog."""
    dtype = matmul_dtype(cfg.train.precision, dev.type)
    if dtype in peaks:
        peak, source = peaks[dtype], f"measured {dtype} best, this run"
    else:  # on a CPU no GPU's data sheet applies, whatever hardware.gpu says
        hardware = cfg.hardware if dev.type == "cuda" else dataclasses.replace(cfg.hardware, gpu="cpu")
        peak, source = peak_tflops(hardware, cfg.train.precision)
    t = cfg.train
    return {
        **result,
        "mfu": mfu(result["tokens_per_s"], result["flops_per_token"], 1, peak),
        "peak_tflops": peak,
        "peak_source": source,
        "compute_dtype": dtype,
        "config": {
            "model": dataclasses.asdict(cfg.model),
            "seq_len": t.seq_len,
            "micro_batch_size": t.micro_batch_size,
            "precision": t.precision,
            "attention": t.attention,
        },
    }


def _in_order(by_dtype: dict) -> dict:
    return {d: by_dtype[d] for d in DTYPES if d in by_dtype}


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or platform.machine() or "cpu"


PROFILE_BYTES = 64 * 1024  # a profile's JSON is a few KiB; the probe writes more than that


def check_profile_path(path: str | Path) -> None:
    """Before the minutes of measuring: --out must be a file that can be written."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"--out {path}: is a directory; give a writable file path")
    try:  # a probe file where the profile's temporary file will go, as large as a profile: a full disk fails here
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent) as probe:
            probe.write(bytes(PROFILE_BYTES))
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as e:
        raise UsageError(f"--out {path}: cannot write there ({e.strerror}); give a writable file path") from None


def write_profile(profile: dict, path: str | Path) -> None:
    """Write the profile where `pretrain plan hardware.profile=PATH` reads it."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(profile, indent=2) + "\n")  # a failed write keeps the old profile
    except OSError as e:
        raise UsageError(f"--out {path}: cannot write it ({e.strerror}); give a writable file path") from None
