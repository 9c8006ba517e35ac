"""Plan a pretraining run before renting GPUs: parameters, FLOPs, memory per GPU, data, steps and time.

  pretrain plan [CONFIG.yaml] [section.key=value ...] [--json] [--explain]
  pretrain plan [CONFIG.yaml] [section.key=value ...] --fit [--top N] [--json] [--explain]
  pretrain plan [CONFIG.yaml] [section.key=value ...] --serve [--port P]    the planner as a local web page

Examples:
  pretrain plan model.preset=llama-7b parallel.gpus=64 hardware.gpu=h100-sxm train.tokens=1e12
  pretrain plan configs/llama-7b-64xh100.yaml --explain
  pretrain plan model.preset=llama3-8b parallel.gpus=8 hardware.gpu=h100-sxm train.seq_len=8192 --fit
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import ResolvedConfig, replaced
from ..config_args import add_config_arguments, config_from_args
from ..units import GiB

if TYPE_CHECKING:
    import argparse

HELP = "plan a run: parameters, FLOPs, memory per GPU, tokens, steps, time"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON (keys documented in docs/plan.md)")
    p.add_argument("--explain", action="store_true", help="print each figure's formula with the numbers substituted")
    p.add_argument(
        "--fit",
        action="store_true",
        help="search micro-batch, recomputation, ZeRO, tensor and "
        "pipeline degrees and offload for the fastest layout that fits (global batch kept)",
    )
    p.add_argument("--top", type=int, default=10, metavar="N", help="--fit: candidates to keep (default 10)")
    p.add_argument("--list-gpus", action="store_true", help="list the accelerator catalog and exit")
    p.add_argument(
        "--serve",
        action="store_true",
        help="serve the planner as a local web page (docs/plan.md "
        '"The page"); the config and overrides given are its starting state',
    )
    p.add_argument(
        "--port",
        type=int,
        default=8765,
        metavar="P",
        help="--serve: the port on 127.0.0.1 (default 8765; 0 picks a free one)",
    )


def run(args: argparse.Namespace) -> int:
    if args.list_gpus:
        from ..gpus import CATALOG

        for spec in CATALOG.values():
            peaks = ", ".join(f"{k} {v:g}" for k, v in spec.peak_tflops.items()) or "measure with pretrain bench"
            links = (
                f"  in a node {spec.intra_node_gbps:g} GB/s, network {spec.inter_node_gbps:g} GB/s"
                if spec.intra_node_gbps
                else ""
            )
            print(f"{spec.name:10s} {spec.memory_bytes / GiB:6.1f} GiB {spec.bandwidth_gbps:6.0f} GB/s  {peaks}{links}")
        return 0
    if args.serve:
        from .serve import serve

        return serve(args.items, args.port)
    from . import plan_with_explain, planned_config
    from .answers import as_json
    from .table import render

    config = config_from_args(args)
    if args.fit:
        return _fit(config, args)
    result, explain = plan_with_explain(config)
    if args.json:
        print(as_json(result))
        return 0
    print(render(planned_config(config, result), result))  # budget mode: the chosen model's settings
    if args.explain:
        print()
        print(explain.render())
    return 0


def _fit(config: ResolvedConfig, args: argparse.Namespace) -> int:
    from . import plan_with_explain
    from .answers import as_json, fit_result
    from .fit import render
    from .fit_fp8 import lines

    config, result = fit_result(config, args.top)
    if args.json:
        print(as_json(result))
        return 0
    command = " ".join(["pretrain plan", *args.items])
    print("\n".join([render(config, result, command=command), *lines(config, result.get("fp8_vs_bf16"), command)]))
    if args.explain and result["candidates"]:
        print()
        print(plan_with_explain(replaced(config, result["candidates"][0]["overrides"]), advice=False)[1].render())
    return 0
