"""Plan a pretraining run before renting GPUs: parameters, FLOPs, memory per GPU, data, steps and time.

  pretrain plan [CONFIG.yaml] [section.key=value ...] [--json] [--explain]
  pretrain plan [CONFIG.yaml] [section.key=value ...] --fit [--top N] [--json] [--explain]

Examples:
  pretrain plan model.preset=llama-7b parallel.gpus=64 hardware.gpu=h100-sxm train.tokens=1e12
  pretrain plan configs/llama-7b-64xh100.yaml --explain
  pretrain plan model.preset=llama3-8b parallel.gpus=8 hardware.gpu=h100-sxm train.seq_len=8192 --fit
"""

from __future__ import annotations

import json

from ..config import replaced
from ..config_args import add_config_arguments, config_from_args
from ..units import GiB

HELP = "plan a run: parameters, FLOPs, memory per GPU, tokens, steps, time"


def add_arguments(p):
    add_config_arguments(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON (keys documented in docs/plan.md)")
    p.add_argument("--explain", action="store_true", help="print each figure's formula with the numbers substituted")
    p.add_argument("--fit", action="store_true", help="search micro-batch, recomputation, ZeRO, tensor and "
                   "pipeline degrees and offload for the fastest layout that fits (global batch kept)")
    p.add_argument("--top", type=int, default=10, metavar="N", help="--fit: candidates to keep (default 10)")
    p.add_argument("--list-gpus", action="store_true", help="list the accelerator catalog and exit")


def run(args) -> int:
    if args.list_gpus:
        from ..gpus import CATALOG

        for spec in CATALOG.values():
            peaks = ", ".join(f"{k} {v:g}" for k, v in spec.peak_tflops.items()) or "measure with pretrain bench"
            links = (f"  in a node {spec.intra_node_gbps:g} GB/s, network {spec.inter_node_gbps:g} GB/s" if spec.intra_node_gbps
                     else "")
            print(f"{spec.name:10s} {spec.memory_bytes / GiB:6.1f} GiB {spec.bandwidth_gbps:6.0f} GB/s  {peaks}"
                  f"{links}")
        return 0
    from . import plan_with_explain, planned_config
    from .table import render

    config = config_from_args(args)
    if args.fit:
        return _fit(config, args)
    result, explain = plan_with_explain(config)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(render(planned_config(config, result), result))  # budget mode: the chosen model's settings
    if args.explain:
        print()
        print(explain.render())
    return 0


def _fit(config, args) -> int:
    from ..errors import UsageError
    from . import make_plan, plan_with_explain, planned_config
    from .fit import fit, render

    if args.top < 1:
        raise UsageError(f"--top: must be at least 1, got {args.top}")
    if "budget" in (first := make_plan(config)):  # budget mode: the layouts of the model the budget buys
        config = planned_config(config, first)
    result = fit(config, top=args.top)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(render(config, result, command=" ".join(["pretrain plan", *args.items])))
    if args.explain and result["candidates"]:
        print()
        print(plan_with_explain(replaced(config, result["candidates"][0]["overrides"]), advice=False)[1].render())
    return 0
