"""How fast the planner answers: `make_plan` (advice included) and `--fit`, in process, CPU seconds and wall
seconds, median of a few rounds. The planner is meant to answer as a user types (the `plan --serve` page asks
< 300 ms for a plan and < 2 s for --fit of Llama-3-70B on 512 GPUs).

  python benchmarks/plan_speed.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from pretrain.config import load_config
from pretrain.plan import make_plan
from pretrain.plan.fit import fit

CASES = [
    ("llama-65b on 8 GPUs (advice: nothing fits)", ["model.preset=llama-65b", "parallel.gpus=8"]),
    ("llama3-70b on 512 H100s", ["model.preset=llama3-70b", "parallel.gpus=512", "hardware.gpu=h100-sxm"]),
    ("qwen3-30b-a3b on 64 H100s", ["model.preset=qwen3-30b-a3b", "parallel.gpus=64", "hardware.gpu=h100-sxm"]),
    # 240 expert-parallel degrees divide 720,720: the search's bound on them (plan/fit.py: expert_degrees)
    (
        "720,720 experts on 720,720 GPUs",
        ["model.preset=mixtral-8x7b", "model.num_experts=720720", "parallel.gpus=720720"],
    ),
]


def timed(fn, rounds: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds) of `fn()` over `rounds` calls after one warm-up."""
    fn()
    wall, cpu = [], []
    for _ in range(rounds):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for name, overrides in CASES:
        config = load_config(overrides=overrides)
        plan_wall, plan_cpu = timed(lambda c=config: make_plan(c), args.rounds)
        fit_wall, fit_cpu = timed(lambda c=config: fit(c, top=5), max(1, args.rounds // 2))
        print(
            f"{name:45s} plan {plan_wall:6.3f} s wall {plan_cpu:6.3f} s CPU   "
            f"--fit {fit_wall:6.2f} s wall {fit_cpu:6.2f} s CPU"
        )


if __name__ == "__main__":
    main()
