"""fp8 against bf16-mixed on a CPU, the trainer's own step on the same tiny model (hidden 128, every block
linear converted: train.fp8_min_features=16): tokens/s of each, their ratio, and where fp8's step goes (torch's
profiler, by op: torchao's casts to float8 and their scaling, the emulated GEMMs, the rest).

  python benchmarks/fp8_cpu.py [--threads N] [--steps 6]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

import torch

from pretrain.config import load_config
from pretrain.distributed.runtime import init_runtime
from pretrain.machine import BusyMeter, cores
from pretrain.sweep.synthetic import SyntheticTokens
from pretrain.train.trainer import Trainer

MODEL = ["model.preset=debug", "model.hidden_size=128", "model.intermediate_size=352", "model.num_heads=4"]
RUN = ["train.seq_len=64", "train.micro_batch_size=4", "train.grad_accum_steps=1", "train.fp8_min_features=16"]
RUN += ["train.device=cpu", "hardware.gpu=cpu", "hardware.peak_tflops=0.05", "run.progress=false"]
RUN += ["run.checkpoint_every=0", "train.max_steps=1000", "stability.spike_detection=false"]
# torch profiler op names -> what they are in torchao's float8 training (eager)
KINDS = {
    "cast": ("aten::copy_", "_ToFloat8ConstrFunc", "aten::mul", "aten::max", "aten::abs", "aten::clamp"),
    "gemm": ("aten::mm", "aten::addmm", "aten::_scaled_mm"),
}


def trainer(precision: str) -> Trainer:
    config = load_config(None, [*MODEL, *RUN, f"train.precision={precision}", f"run.dir={tempfile.mkdtemp()}/run"])
    loader = SyntheticTokens(config.model.vocab_size, config.train.seq_len, seed=0)
    made = Trainer(config, init_runtime("cpu"), loader=loader, quiet=True)
    for _ in range(3):
        made.step()
    return made


def breakdown(made: Trainer) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        made.step()
    seconds = {"cast": 0.0, "gemm": 0.0, "rest": 0.0}
    for e in prof.key_averages():
        kind = next((k for k, names in KINDS.items() if e.key.startswith(names)), "rest")
        seconds[kind] += e.self_cpu_time_total / 1e6
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    made = {p: trainer(p) for p in ("bf16-mixed", "fp8")}
    times: dict[str, list[float]] = {p: [] for p in made}
    meter = BusyMeter()
    for _ in range(args.steps):  # interleaved, step by step
        for precision, t in made.items():
            start = time.perf_counter()
            t.step()
            times[precision].append(time.perf_counter() - start)
    busy = meter.busy_cores()
    tokens = 4 * 64
    speed = {p: tokens / statistics.median(ts) for p, ts in times.items()}
    print(f"threads {args.threads}; other processes kept {busy or 0:.2f} of {cores()} cores busy")
    for precision, tps in speed.items():
        print(
            f"{precision:11} {tps:9,.0f} tokens/s   planned {made[precision].plan['time']['tokens_per_second']:9,.0f}"
        )
    print(f"fp8 / bf16-mixed step time: {speed['bf16-mixed'] / speed['fp8']:.2f}x")
    parts = breakdown(made["fp8"])
    total = sum(parts.values())
    print("fp8 step by op: " + ", ".join(f"{k} {v * 1e3:.1f} ms ({v / total:.0%})" for k, v in parts.items()))


if __name__ == "__main__":
    main()
