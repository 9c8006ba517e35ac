"""The CPU plan against the CPU run over several model sizes: tokens/s the step-time model plans for this
machine (its profile measured first, as the trainer measures and keeps it: pretrain.bench.cpu_profile) beside
the tokens/s the trainer's own step reaches, median of interleaved rounds, with the cores other processes kept
busy meanwhile (the plan is an idle machine's: a busy figure says so).

  python benchmarks/cpu_plan_vs_run.py [--threads N] [--steps 8] [--rounds 3] [--cases demo,debug,...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from pretrain.bench.cpu_profile import cpu_profile
from pretrain.config import load_config
from pretrain.distributed.runtime import init_runtime
from pretrain.machine import BusyMeter, cores
from pretrain.plan import make_plan
from pretrain.sweep.synthetic import SyntheticTokens
from pretrain.train.trainer import Trainer

LLAMA = ["model.family=llama", "model.vocab_size=2048", "model.max_seq_len=256", "model.tie_embeddings=true"]
CASES = {  # name: overrides; from the tests' tiny run to the demo
    "tiny (tests)": ["model.preset=debug", "train.seq_len=32", "train.micro_batch_size=4", "train.grad_accum_steps=2"],
    "debug 8x128": ["model.preset=debug", "train.seq_len=128", "train.micro_batch_size=8", "train.grad_accum_steps=1"],
    "moe-debug": ["model.preset=moe-debug", "train.seq_len=32", "train.micro_batch_size=4"],
    "2x128": [*LLAMA, "model.hidden_size=128", "model.intermediate_size=344", "model.num_layers=2"]
    + ["model.num_heads=4", "model.num_kv_heads=2", "train.seq_len=128", "train.micro_batch_size=8"],
    "demo 4x256": [*LLAMA, "model.hidden_size=256", "model.intermediate_size=688", "model.num_layers=4"]
    + ["model.num_heads=8", "model.num_kv_heads=4", "train.seq_len=256", "train.micro_batch_size=16"],
}
COMMON = ["train.precision=fp32", "train.device=cpu", "hardware.gpu=cpu", "train.grad_accum_steps=1"]
COMMON += ["train.max_steps=1000", "run.progress=false", "stability.spike_detection=false", "run.checkpoint_every=0"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--steps", type=int, default=8, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    profile_path = Path(tempfile.mkdtemp()) / "profile.json"
    profile = cpu_profile("fp32")
    profile_path.write_text(json.dumps(profile))
    print(
        f"profile ({args.threads} threads): fp32 peak {profile['peak_tflops']['fp32']:.4g} TFLOP/s, one op "
        f"{profile['op_seconds'] * 1e6:.2f} us, copy {profile['memory_bandwidth_gbps']:.3g} GB/s, other processes "
        f"{profile['busy_cores']:.2f} of {cores()} cores"
    )
    rt = init_runtime("cpu")
    names = args.cases.split(",")
    trainers = {name: _trainer(CASES[name], profile_path, rt) for name in names}
    times: dict[str, list[float]] = {name: [] for name in names}
    busy: list[float] = []
    for _ in range(args.rounds):  # interleaved: a busy spell slows every case alike
        for name, trainer in trainers.items():
            meter = BusyMeter()
            start = time.perf_counter()
            for _ in range(args.steps):
                trainer.step()
            times[name].append((time.perf_counter() - start) / args.steps)
            busy.append(meter.busy_cores() or 0.0)
    print(f"{'case':14} {'params':>9} {'tokens/step':>11} {'planned tok/s':>14} {'measured':>10} {'error':>7}")
    for name, trainer in trainers.items():
        t = trainer.config.train
        tokens = t.micro_batch_size * t.seq_len * t.grad_accum_steps
        measured = tokens / statistics.median(times[name])
        planned = trainer.plan["time"]["tokens_per_second"]
        error = 100 * (measured - planned) / planned
        params = trainer.plan["params"]["total"]
        print(f"{name:14} {params:>9,} {tokens:>11,} {planned:>14,.0f} {measured:>10,.0f} {error:>+6.1f}%")
        trainer.batches.close()
    print(
        f"other processes kept {statistics.median(busy):.2f} cores busy (median of the timed rounds, "
        f"max {max(busy):.2f})"
    )


def _trainer(overrides: list[str], profile: Path, rt) -> Trainer:
    config = load_config(
        None, [*COMMON, *overrides, f"hardware.profile={profile}", f"run.dir={tempfile.mkdtemp()}/run"]
    )
    t = config.train
    trainer = Trainer(config, rt, loader=SyntheticTokens(config.model.vocab_size, t.seq_len, seed=0), quiet=True)
    assert trainer.plan["time"]["tokens_per_second"] == make_plan(config)["time"]["tokens_per_second"]
    for _ in range(3):  # warm-up: the optimizer's states, the allocator
        trainer.step()
    return trainer


if __name__ == "__main__":
    main()
