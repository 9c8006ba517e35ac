"""`pretrain plan --fit`: the fastest layout that fits, for the given model, GPUs, global batch and sequence.

The search, with the global batch (sequences per optimizer step) held fixed:
  tensor t    divides the heads and the key/value heads, at most a node (parallel.gpus_per_node): its
              all-reduces need NVLink;
  pipeline p  divides the layers, t x p divides the GPUs; data parallel d = GPUs / (t x p) divides the batch;
  ZeRO        0-3 (0 only when d = 1); sequence parallelism on whenever t > 1 (same traffic, less memory);
  recompute   none, selective, full;
  micro-batch b  a divisor of the d-rank's sequences, accumulation = sequences / (d x b);
  expert ep   MoE only: divides the experts and d x t (the experts split over ep of a stage's data x tensor
              ranks, whole experts: parallel.expert_tensor 1, what the trainer runs);
  offload     optimizer (any stage), optimizer+params (ZeRO-3): searched only when nothing fits without it,
              as crossing PCIe every step is always slower than a layout that fits on the GPUs.
  planned-only values of parallel.* (a DeepEP dispatcher, an overlapped dispatch, a balanced stage split) are
              set back to what the trainer runs in every candidate.
Trained: every layout passes the trainer's own check (config/trainable.py: check_trainable, what `pretrain
train` refuses with) before it is planned; a refused one is a rejected row with the trainer's reason, so every
candidate is one `pretrain train` runs (offload, ZeRO 2/3 per pipeline stage and a pipeline of tied embeddings
are planned, not trained: they lose here, saying so). A model the planner counts but the trainer does not build
(gpt-oss's attention sinks, DeepSeek-V3's latent attention: unbuilt_architecture) is ranked all the same, for
sizing the job, every layout checked as the built model's would be; the result says `not_trainable`, why.
Memory: one plan per layout at micro-batch 1 (`plan()`'s fits and largest micro-batch that fits, the
fragmentation allowance included); the micro-batches up to that largest one fit (a larger b means fewer
micro-batches in a pipeline, so no more memory). Memory falls with recomputation and with the ZeRO stage, so
a (t, p) that does not fit with ZeRO-3 and full recomputation is rejected whole, unplanned further.
Speed: pretrain.plan.step_time for every (layout, micro-batch); the fastest are planned again exactly with
their overrides, so a candidate's figures are what `pretrain plan CONFIG OVERRIDES` prints.
The work is bounded whatever the GPUs and the batch: at most (tensor degrees within a node) x (divisors of the
layers: at most 32 below the planner's 1,000) splits, each with at most 12 memory plans (4 ZeRO stages x 3
recomputations) and a step-time score per micro-batch that fits (divisors of the rank's sequences, found up to
the largest that fits). A plan costs O(layers), so the splits that divide the GPUs set the time: Llama-3-70B
on 512 GPUs has 20 (pipeline 1-16), on 640 all 40 (pipeline 1-80). An MoE multiplies them by at most
MOST_EXPERT_DEGREES expert-parallel degrees (`expert_degrees`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import TYPE_CHECKING, Any, cast

from ..config import ResolvedConfig, replaced
from ..config.checks import MOST_GPUS
from ..config.job_sections import RECOMPUTE
from ..config.trainable import check_trainable, unbuilt_architecture
from ..errors import ConfigError
from ..units import GiB
from .explain import Explain
from .flops import flops
from .hardware import peak_tflops
from .kernels import planned_switches
from .long_context import context_advice
from .memory import memory
from .params import count_params
from .step_time import step_time

if TYPE_CHECKING:
    from .params import ParamCounts

MOST_EXPERT_DEGREES = MOST_GPUS.bit_length()  # 21: 1, 2, 4, ..., 2^20, doublings up to the most GPUs a config takes
REFUSED = "`pretrain train` refuses it"  # a rejected row's why, before the trainer's own words
Scored = tuple[float, dict[str, Any], dict[str, Any]]  # a fitting layout: (seconds per step, overrides, step)


def _divisors(n: int, most: int | None = None) -> list[int]:
    """The divisors of n up to `most` (default n), ascending, in at most min(most, sqrt(n)) steps: the micro-batch
    sizes of a huge global batch (2^40 sequences) cost what the micro-batches that fit do."""
    most = n if most is None else min(n, most)
    if most * most <= n:
        return [k for k in range(1, most + 1) if n % k == 0]
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    large = [n // k for k in reversed(small) if n // k != k]
    return [k for k in small + large if k <= most]


def layouts(c: ResolvedConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(tensor, pipeline, data) splits the rules allow, and those refused with why."""
    m, par, t = c.model, c.parallel, c.train
    sequences = t.micro_batch_size * t.grad_accum_steps * par.data_parallel
    found: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    for tp in _divisors(math.gcd(m.num_heads, m.num_kv_heads), par.gpus_per_node):
        if par.gpus % tp:
            continue
        for pp in _divisors(m.num_layers):
            if par.gpus % (tp * pp):
                continue
            dp = par.gpus // (tp * pp)
            split = {"parallel.tensor": tp, "parallel.pipeline": pp}
            if sequences % dp:
                refused.append(
                    {
                        "overrides": split,
                        "why": f"the global batch of {sequences} sequences does not divide over data parallel {dp}",
                    }
                )
                continue
            layout = {"tensor": tp, "pipeline": pp, "data": dp, "per_rank": sequences // dp}
            if not m.num_experts:
                found.append(layout)
                continue
            # MoE: the experts split over ep of the data x tensor ranks (whole experts), ep dividing both
            found += [dict(layout, expert=ep) for ep in expert_degrees(math.gcd(m.num_experts, dp * tp))]
    return found, refused


def expert_degrees(n: int) -> list[int]:
    """The expert-parallel degrees searched for n = gcd(experts, data parallel): every divisor when there are at
    most MOST_EXPERT_DEGREES (all of them for any power of two the 2^20 GPUs a config takes allow: the published
    expert counts, 8 to 256), else a ladder of divisors each at least twice the one before, from 1 to n. The
    search stays bounded as a dense model's is: 720,720 experts on 720,720 GPUs have 240 divisors, and their
    splits took 46 s; the ladder keeps 20 of them, spaced as the power-of-two counts are."""
    degrees = _divisors(n)
    if len(degrees) <= MOST_EXPERT_DEGREES:
        return degrees
    ladder = [1]
    for d in degrees:
        if d >= 2 * ladder[-1]:
            ladder.append(d)
    return ladder if ladder[-1] == n else [*ladder, n]


def fit(config: ResolvedConfig, top: int = 10) -> dict[str, Any]:
    """{"candidates": [...] fastest first (at most `top`), "rejected": [{"overrides", "why"}, ...]}; every
    candidate is a layout `pretrain train` runs."""
    from . import plan_with_explain

    config = planned_switches(config)  # as plan_with_explain resolves them, for the step times below
    peak, source = peak_tflops(config.hardware, config.train.precision)
    if not peak:
        raise ConfigError(f"--fit ranks layouts by speed and needs a peak FLOP/s: {source}")
    counts = count_params(config.model)
    splits, rejected = layouts(config)
    scored: list[Scored] = []
    for split in splits:
        scored += _search(config, split, "none", counts, peak, rejected)
    if not scored:  # nothing fits on the GPUs: the same search with the states in host memory
        for split in splits:
            for offload in ("optimizer", "optimizer+params"):
                scored += _search(config, split, offload, counts, peak, rejected)
    scored.sort(key=lambda s: s[0])

    candidates: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    for _seconds, overrides, _step in scored:
        if len(candidates) >= top:
            break
        p = plan_with_explain(replaced(config, overrides), advice=False)[0]  # exactly what `pretrain plan` says
        if p["fits"] is False:
            rejected.append(
                {"overrides": overrides, "why": _no_fit(p["memory_bytes"]["total"], p["usable_memory_bytes"])}
            )
            continue
        st = p["step_time"]
        candidates.append(
            {
                "overrides": overrides,
                "memory_bytes": p["memory_bytes"],
                "fits": p["fits"],
                "tokens_per_s": st["tokens_per_second"],
                "mfu": st["mfu"],
                "step_time_s": st["seconds"],
            }
        )
        best = best or st
    # The others that fit, each layout once (at its fastest micro-batch): why they lost to the fastest.
    seen = {_layout_key(c["overrides"]) for c in candidates}
    for _seconds, overrides, step in scored:
        if _layout_key(overrides) not in seen and best is not None:
            seen.add(_layout_key(overrides))
            rejected.append(
                {
                    "overrides": overrides,
                    "why": f"slower: {step['tokens_per_second']:,.0f} tokens/s, "
                    f"{step['tokens_per_second'] / best['tokens_per_second']:.0%} of the fastest; "
                    f"{dominant_cost(step, best)}",
                }
            )
    advice = context_advice(config)
    unbuilt = unbuilt_architecture(config.model)  # ranked for sizing, labelled: `pretrain train` cannot run it
    return {
        "candidates": candidates,
        "rejected": rejected,
        **({"advice": advice} if advice else {}),
        **({"not_trainable": unbuilt} if unbuilt else {}),
    }


def _search(
    config: ResolvedConfig, split: dict[str, Any], offload: str, counts: ParamCounts, peak: float, rejected: list[Any]
) -> list[Scored]:
    """The fitting (ZeRO stage, recomputation, micro-batch) of one (tensor, pipeline) split, scored."""
    dp, per_rank = split["data"], split["per_rank"]
    shared = {
        "parallel.tensor": split["tensor"],
        "parallel.pipeline": split["pipeline"],
        "parallel.sequence_parallel": split["tensor"] > 1,
        "parallel.offload": offload,
        **_as_trained(config),
    }
    if "expert" in split:  # MoE: the expert-parallel degree is searched with the split
        shared["parallel.expert"] = split["expert"]
    stages = [3, 2, 1, 0] if dp > 1 else [0]
    if offload == "optimizer+params":  # parameters live on the host only under ZeRO-3 (config.validate)
        stages = [3] if dp > 1 else []
    out: list[Scored] = []
    for zero in stages:
        trained = False  # some recomputation of this stage is one the trainer runs
        for recompute in reversed(RECOMPUTE):  # full first: if it does not fit, nothing lighter does
            layout = {
                **shared,
                "parallel.zero_stage": zero,
                "train.activation_checkpointing": recompute,
                "train.micro_batch_size": 1,
                "train.grad_accum_steps": per_rank,
            }
            refused = _refused(config, layout)  # the trainer's check, with this candidate's own keys
            if refused:
                rejected.append(refused)
                continue
            trained = True
            try:
                c = replaced(config, layout)
            except ConfigError as e:  # a rule of the config's own (e.g. offload needs ZeRO-3)
                rejected.append({"overrides": layout, "why": str(e)})
                break
            mem = memory(c, counts, Explain())  # the plan's memory and fit, without the rest of the plan
            if mem["fit"]["fits"] is False:
                lighter = " (so neither does less recomputation)" if recompute != "none" else ""
                rejected.append(
                    {
                        "overrides": layout,
                        "why": _no_fit(mem["memory_bytes"]["total"], mem["fit"]["usable_bytes"]) + lighter,
                    }
                )
                break
            largest = mem["fit"]["max_micro_batch_size"]  # None: no memory limit (a CPU)
            fl = flops(c, counts, 1, Explain())
            for b in _divisors(per_rank, largest):
                overrides = {**layout, "train.micro_batch_size": b, "train.grad_accum_steps": per_rank // b}
                # a dict, not None: fit refused to search without a peak
                step = cast(dict[str, Any], step_time(replaced(c, overrides), counts, fl, peak))
                out.append((step["seconds"], overrides, step))
        if trained and not out:
            break  # the strongest stage the trainer runs does not fit with full recomputation: no lower stage does
    return out


def _as_trained(config: ResolvedConfig) -> dict[str, Any]:
    """The planned-only parallel.* values (a dispatcher, an overlap, a stage split the trainer does not run) set
    back to what `pretrain train` runs, so that every candidate is one it runs; offload is searched instead."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config.parallel):
        trains = f.metadata["trains"]
        if trains is not None and f.name != "offload" and getattr(config.parallel, f.name) not in trains:
            out[f"parallel.{f.name}"] = trains[0]
    return out


def _refused(config: ResolvedConfig, layout: dict[str, Any]) -> dict[str, Any] | None:
    """A rejected row if `pretrain train` refuses this layout (its own check, its own words), else None."""
    try:
        c = replaced(config, layout)
    except ConfigError:
        return None  # a rule of the config's own: the search says it in its words
    try:
        check_trainable(_as_built(c), needs_data=False)
    except ConfigError as e:
        return {"overrides": layout, "why": f"{REFUSED}: {e}"}
    return None


def _as_built(c: ResolvedConfig) -> ResolvedConfig:
    """`c` with each model key the trainer does not build yet (unbuilt_architecture names it) at its default:
    what the trainer checks of the layout once the model is built; `c` itself when it builds."""
    m = c.model
    while why := unbuilt_architecture(m):
        key = why.split(":", 1)[0].removeprefix("model.")
        default = next(f.default for f in dataclasses.fields(m) if f.name == key)
        m = dataclasses.replace(m, **{key: default})
    return c if m is c.model else dataclasses.replace(c, model=m)


def _layout_key(overrides: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(v for k, v in overrides.items() if k not in ("train.micro_batch_size", "train.grad_accum_steps"))


def _no_fit(total: int, usable: int) -> str:
    return f"does not fit: {total / GiB:.1f} GiB > {usable / GiB:.1f} GiB usable"


def command_line(overrides: dict[str, Any]) -> str:
    return " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items())


def render(config: ResolvedConfig, result: dict[str, Any], shown: int = 10, command: str = "pretrain plan ...") -> str:
    """The ranked table, then why the others lost (counted by reason)."""
    m, par, t = config.model, config.parallel, config.train
    name = m.preset or m.hf_config or "custom"
    sequences = t.micro_batch_size * t.grad_accum_steps * par.data_parallel
    lines = [
        f"pretrain plan --fit: {name} on {par.gpus} x {config.hardware.gpu}, global batch {sequences} x "
        f"{t.seq_len:,} tokens ({sequences * t.seq_len:,} per step), {t.precision}",
        "",
    ]
    moe = bool(m.num_experts)  # a Mixture-of-Experts model: its expert-parallel degree, a column of its own
    header = (
        f"  {'#':>2}  {'micro x accum':<13} {'recompute':<9} {'ZeRO':>4} {'TP':>3} {'PP':>3} {'DP':>4} "
        + (f"{'EP':>3} " if moe else "")
        + f"{'offload':<16} {'memory GiB':>10} {'tokens/s':>11} {'MFU':>6} {'step s':>8}"
    )
    if "not_trainable" in result:  # ranked for sizing the job: the plan counts it, the trainer cannot build it
        lines.insert(1, f"  ! not trainable here: {result['not_trainable']}; ranked as planned, for sizing")
    lines.append(header)
    for i, cand in enumerate(result["candidates"][:shown], 1):
        o = cand["overrides"]
        dp = par.gpus // (o["parallel.tensor"] * o["parallel.pipeline"])
        mb = f"{o['train.micro_batch_size']} x {o['train.grad_accum_steps']}"
        lines.append(
            f"  {i:>2}  {mb:<13} {o['train.activation_checkpointing']:<9} {o['parallel.zero_stage']:>4} "
            f"{o['parallel.tensor']:>3} {o['parallel.pipeline']:>3} {dp:>4} "
            + (f"{o.get('parallel.expert', par.expert):>3} " if moe else "")
            + f"{o['parallel.offload']:<16} {cand['memory_bytes']['total'] / GiB:>10.1f} "
            f"{cand['tokens_per_s']:>11,.0f} {cand['mfu']:>6.3f} {cand['step_time_s']:>8.3g}"
        )
    if not result["candidates"]:
        lines.append("  (none fits, or none is one `pretrain train` runs: see below)")
    reasons: dict[str, list[Any]] = {}
    for r in result["rejected"]:
        reason = r["why"].split(":")[0] if r["why"].startswith(("does not fit", "slower")) else r["why"]
        if r["why"].startswith("slower"):
            reason = "slower: " + r["why"].rsplit("; ", 1)[1]
        if r["why"].startswith(REFUSED):  # one line per refusal, whatever its figures (the data-parallel size)
            reason = re.sub(r"\d+", "#", r["why"])
        reasons.setdefault(reason, []).append(r)
    if reasons:
        lines += ["", "  Why the others lost:"]
        for reason, rs in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
            example = rs[0]["why"].removeprefix(f"{REFUSED}: ").split("; ")[0].removeprefix("slower: ")
            reason = REFUSED if reason.startswith(REFUSED) else reason
            lines.append(f"    {len(rs):>4} x {reason}; e.g. {_short(rs[0]['overrides'])}: {example}")
    lines += [""] * bool(result.get("advice")) + [f"  ! {line}" for line in result.get("advice", [])]
    if result["candidates"]:
        lines += [
            "",
            f"  The fastest, to plan{'' if 'not_trainable' in result else ' or train'}: {command} "
            + command_line(result["candidates"][0]["overrides"]),
            "  (step-time model: pretrain.plan.step_time; --explain prints its terms for the fastest)",
        ]
    return "\n".join(lines)


def _short(overrides: dict[str, Any]) -> str:
    keys = {
        "parallel.tensor": "TP",
        "parallel.pipeline": "PP",
        "parallel.zero_stage": "ZeRO",
        "train.activation_checkpointing": "recompute",
        "train.micro_batch_size": "micro",
        "parallel.offload": "offload",
        "parallel.expert": "EP",
    }
    return " ".join(f"{short} {overrides[k]}" for k, short in keys.items() if k in overrides)


def dominant_cost(step: dict[str, Any], best: dict[str, Any]) -> str:
    """Why a slower layout lost to the best: the part of its step that exceeds the best's by the most."""
    mine, theirs = _costs(step), _costs(best)
    return max(mine, key=lambda k: mine[k] - theirs[k])


def _costs(step: dict[str, Any]) -> dict[str, Any]:
    busiest = step.get("pipeline_busiest_stage", 1.0)
    slots = step["forward_backward_s"] / (step["micro_batch_s"] * busiest + step["pipeline_p2p_s"])
    compute = step["matmul_s"] + step["attention_s"]
    return {
        "TP all-reduce dominates": step["tensor_parallel_s"] * slots,
        "expert all-to-all": step.get("dispatch_exposed_s", 0.0) * slots,
        "pipeline bubble": step["pipeline_bubble"] * step["forward_backward_s"],
        "busiest pipeline stage (the output layer's)": (busiest - 1) * step["micro_batch_s"] * slots,
        "pipeline point-to-point": step["pipeline_p2p_s"] * slots,
        "data-parallel communication": step["data_parallel_exposed_s"],
        "optimizer step (offload)": step["optimizer_s"],
        "memory-bound micro-batch (weight reads)": max(0.0, step["weight_read_s"] - compute) * slots,
        "activation traffic": (step["activation_traffic_s"] + step["gemm_operand_s"]) * slots,
        "per-kernel overhead of small micro-batches": step["kernel_overhead_s"] * slots,
        "recomputation / small-matmul compute": compute * slots,
    }
