"""The plan as a table a person reads: one figure per row, the model behind it in the note column."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..gpus import mixed_precision
from ..units import GiB
from ..units import human as count
from .length import token_dtype

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig, ResolvedModelConfig


def si_bytes(n: float) -> str:
    """Disk sizes in SI units, as disks are sold (1 TB = 1e12 bytes)."""
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 60:.1f} minutes"


def duration_range(low: float, high: float) -> str:
    """ "2.6-4.5 days", or "20.0 hours to 2.3 days" across units."""
    a, b = duration(low), duration(high)
    return f"{a.split()[0]}-{b}" if a.split()[1] == b.split()[1] else f"{a} to {b}"


def render(config: ResolvedConfig, p: dict[str, Any]) -> str:
    m, t, par, hw = config.model, config.train, p["parallel"], p["hardware"]
    rows = _size_rows(m, p) + _time_rows(m, p)
    name = m.preset or m.hf_config or "custom"
    lines = [
        f"pretrain plan: {name} ({m.family}, {p['params']['total'] / 1e9:.3g}B), {par['world']} x {hw['gpu']} "
        f"(data {par['data']}, tensor {par['tensor']}, pipeline {par['pipeline']}, "
        + (f"expert {par['expert']}, " if "expert" in par else "")
        + f"ZeRO-{par['zero_stage']}), "
        f"{t.precision}, {t.optimizer}, recompute {t.activation_checkpointing}",
        "",
    ]
    width = max(len(r[1]) for r in rows)
    for label, value, note in rows:
        lines.append(f"  {label:<18} {value:>{width}}   {note}")
    lines.append("")
    lines += _memory_lines(config, p)
    if "budget" in p:  # budget mode: what the budget buys, above the plan of the chosen model
        lines = budget_lines(p["budget"]) + lines
    for advice in p.get("advice", []):
        lines.append(f"  ! {advice}")
    return "\n".join(lines)


def _size_rows(m: ResolvedModelConfig, p: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, value, note) rows of the model's and the data's sizes."""
    pa, tok = p["params"], p["tokens"]
    active = "active " if "routed_experts" in pa else ""  # an MoE's tokens count per active parameter
    rows = [
        (
            "Parameters",
            f"{pa['total']:,}",
            f"{count(pa['total'])}; embedding {pa['embedding']:,}, non-embedding {pa['non_embedding']:,}",
        )
    ]
    if "routed_experts" in pa:  # Mixture-of-Experts (pretrain.plan.params)
        rows.append(
            (
                "Active parameters",
                f"{pa['active']:,}",
                f"{count(pa['active'])} per token: "
                f"{m.experts_per_token} of {m.num_experts} routed experts; {pa['active_no_embedding']:,} "
                "without the embedding",
            )
        )
    rows.append(
        (
            "Training tokens",
            f"{tok['total']:,}",
            f"{tok['per_parameter']:.1f} per {active}parameter; "
            f"Chinchilla-optimal {count(tok['chinchilla'])} (20 per {active}parameter)",
        )
    )
    rows.append(("Tokens on disk", si_bytes(p["storage_bytes"]), f"{token_dtype(m.vocab_size)} ids"))
    if "data" in p:  # data.raw_bytes or a prepared data.dir (pretrain.plan.corpus)
        d = p["data"]
        rows.append(
            (
                "Corpus tokens",
                f"{d['tokens_available']:,}",
                f"{si_bytes(d['raw_bytes'])} of text at "
                f"{d['bytes_per_token']:.3g} bytes/token; the run reads it {d['epochs']:.3g} times",
            )
        )
    for src in p.get("mixture", {}).get("sources", []):  # data.mixture (pretrain.plan.mixture)
        if src["tokens_available"] is None:
            rows.append(
                (f"Source {src['name']}", "n/a", f"weight {src['weight']:.3g}; {src['dir']} is not prepared yet")
            )
            continue
        cap = (
            f", max_epochs {src['max_epochs']:g}" + (" (reached)" if src["capped"] else "") if src["max_epochs"] else ""
        )
        rows.append(
            (
                f"Source {src['name']}",
                f"{src['tokens_available']:,}",
                f"tokens available, "
                f"{si_bytes(src['storage_bytes'])} on disk; weight {src['weight']:.3g}: the run draws "
                f"{src['tokens_planned']:,}, {src['epochs']:.3g} epochs{cap}",
            )
        )
    rows.append(("One checkpoint", si_bytes(p["checkpoint_bytes"]), "parameters + optimizer states"))
    return rows


def _time_rows(m: ResolvedModelConfig, p: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, value, note) rows of the steps, FLOPs and time."""
    rows = _steps_and_flops_rows(p) + _wall_clock_rows(p)
    if "eval_tasks" in p:  # run.eval_tasks
        rows.append(_eval_tasks_row(p["eval_tasks"]))
    if "measured" in p:
        ms = p["measured"]
        util = f"MFU {ms['mfu']:.3f}, HFU {ms['hfu']:.3f}" if ms["mfu"] is not None else "no peak to compare"
        rows.append(
            (
                "Measured",
                f"{ms['achieved_tflops_per_gpu']:.1f} TFLOP/s",
                f"per GPU at {ms['tokens_per_second']:,.0f} tok/s; {util}",
            )
        )
    return rows


def _eval_tasks_row(ev: dict[str, Any]) -> tuple[str, str, str]:
    """run.eval_tasks: the time of its evaluations, and any task file that could not be read (not counted)."""
    unread = (
        f"{', '.join(ev['unread'])}: not found or unreadable (not written yet?), not counted" if "unread" in ev else ""
    )
    if not ev["tasks"]:
        return ("Eval tasks", "n/a", unread)
    share = f", {ev['share_of_run']:.1%} of the run" if ev["share_of_run"] is not None else ""
    return (
        "Eval tasks",
        duration(ev["seconds"]),
        f"{ev['evaluations']:,} evaluations x {ev['tokens_per_evaluation']:,} tokens ({', '.join(ev['tasks'])}), "
        f"forward only{share}" + (f"; {unread}" if unread else ""),
    )


def _steps_and_flops_rows(p: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The optimizer steps, the FLOPs per token by each convention, and the run's FLOPs."""
    st, fl = p["steps"], p["flops"]
    rows = [
        (
            "Optimizer steps",
            f"{st['total']:,}",
            f"{st['tokens_per_step']:,} tokens per step ({count(st['tokens_per_step'])}), warm-up {st['warmup']:,}",
        ),
        (
            "FLOPs per token",
            f"{fl['per_token']:.3g}",
            f"6N + attention (PaLM); "
            f"6N over all {'active ' * ('moe' in fl)}params "
            f"{fl['per_token_6n']:.3g}; with recomputation {fl['per_token_hardware']:.3g}",
        ),
    ]
    if "moe" in fl:
        mo = fl["moe"]
        rows.append(
            (
                "  MoE conventions",
                f"{mo['per_token_causal_attention']:.3g}",
                f"active N, causal attention; "
                f"full square {mo['per_token_full_attention']:.3g} ({mo['full_over_causal']:.2f}x); 6N active "
                f"{mo['per_token_6n_active']:.3g} (on all params {mo['per_token_6n_total']:.3g}: MFU "
                "overstated)",
            )
        )
    if "attention_context" in fl:  # train.document_masking
        rows.append(_document_masking_row(fl, p["steps"]["tokens_per_step"] // max(1, st["examples_per_step"])))
    rows.append(("Training FLOPs", f"{fl['total']:.3g}", f"6N·D = {fl['total_6n']:.3g}"))
    return rows


def _document_masking_row(fl: dict[str, Any], seq: int) -> tuple[str, str, str]:
    """train.document_masking: on, and the keys a query attends to that the attention term counts."""
    context = fl["attention_context"]
    lengths = {
        "meta.json": "document lengths from the data's meta.json",
        "data.mean_doc_tokens": "documents of data.mean_doc_tokens",
    }.get(
        fl.get("document_lengths", "none"),
        "document lengths unknown (no doc_length_histogram, no data.mean_doc_tokens)",
    )
    return (
        "Document masking",
        "on",
        f"attention within each document of a window, positions restarting: {context:,.1f} keys per query of "
        f"{seq:,} ({lengths})",
    )


def _wall_clock_rows(p: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The run's time (the step-time model's, with its range, or at the MFU given) and its throughput."""
    tm, hw = p["time"], p["hardware"]
    if not tm["seconds"]:
        return [("Wall-clock time", "n/a", hw["peak_source"])]
    cost = f", cost {tm['cost']:,.0f}" if tm.get("cost") else ""
    if tm["seconds_range"]:  # the step-time model's, with its own error on published runs
        low, high = tm["seconds_range"]
        how = (
            f"{duration_range(low, high)} at the model's published-run error; "
            f"{tm['gpu_hours']:,.0f} GPU-hours at MFU {tm['utilisation']:.3g} (step-time model)"
        )
    else:  # hardware.mfu / hfu given
        how = f"{tm['gpu_hours']:,.0f} GPU-hours at {tm['basis'].split(' ')[0]} {tm['utilisation']:g} (given)"
    rows = [
        ("Wall-clock time", duration(tm["seconds"]), f"{how} of {hw['peak_tflops']:g} TFLOP/s{cost}"),
        (
            "Throughput",
            f"{tm['tokens_per_second']:,.0f} tok/s",
            f"whole job, {tm['tokens_per_second'] / p['parallel']['world']:,.0f} per GPU",
        ),
    ]
    step: dict[str, Any] = p.get("step_time") or {}
    moe_mfu: dict[str, Any] | None = step.get("moe_mfu")
    if moe_mfu and moe_mfu["per_token_causal_attention"] is not None:  # the step-time model's, by convention
        rows.append(
            (
                "  MoE MFU",
                f"{moe_mfu['per_token_causal_attention']:.3f}",
                f"6N active + causal attention; full square {moe_mfu['per_token_full_attention']:.3f}; "
                f"6N active {moe_mfu['per_token_6n_active']:.3f} (on all params {moe_mfu['per_token_6n_total']:.3f}: "
                "overstated)",
            )
        )
    return rows


def _memory_lines(config: ResolvedConfig, p: dict[str, Any]) -> list[str]:
    """The memory block: each kind's size, each phase's total, the verdict, and the extra lines."""
    t, mem = config.train, p["memory_bytes"]
    lines = [f"  Memory per GPU (GiB), micro-batch {t.micro_batch_size} x seq {t.seq_len}:"]
    notes = {
        "weights": "working copies" if mixed_precision(t.precision) else "parameters",
        "optimizer": f"{t.optimizer} states" + (" + fp32 master weights" if mixed_precision(t.precision) else ""),
        "activations": f"recompute {t.activation_checkpointing}, attention {t.attention}",
        "buffers": "loss working set, gradient communication",
    }
    for key in ("weights", "gradients", "optimizer", "activations", "buffers", "cuda_context"):
        lines.append(f"    {key.replace('_', ' '):<14} {mem[key] / GiB:>9.2f}   {notes.get(key, '')}")
    # Not all of the above are alive at once: each phase of a step holds its own share, the peak is the total.
    held = "the earlier micro-batches' gradients, " if t.grad_accum_steps > 1 else "(no gradients yet) "
    phase_notes = {
        "forward": f"end of forward: {held}all activations, the loss's working set",
        "loss_backward": "the loss's backward beside all activations",
        "backward": "its largest moment: the first or last block's, or a tied embedding's",
        "optimizer_step": "gradients, states and the optimizer's working memory",
    }
    for phase, nbytes in mem["phases"].items():
        lines.append(f"    {phase.replace('_', ' '):<14} {nbytes / GiB:>9.2f}   {phase_notes[phase]}")
    verdict = f"peak in {mem['peak_phase'].replace('_', ' ')}"
    if p["device_memory_bytes"] is not None:
        fits = "fits" if p["fits"] else "does NOT fit"
        verdict += (
            f", of {p['device_memory_bytes'] / GiB:.1f} GiB ({p['usable_memory_bytes'] / GiB:.1f} usable "
            f"after {config.hardware.fragmentation:.0%} fragmentation): {fits}; "
            f"largest micro-batch that fits: {p['max_micro_batch_size']}"
        )
    lines.append(f"    {'total':<14} {mem['total'] / GiB:>9.2f}   {verdict}")
    if mem["compiled"] is not None:  # train.compile is on: the same step with compiled blocks
        lines.append(
            f"    {'compiled':<14} {mem['compiled'] / GiB:>9.2f}   peak with train.compile: "
            "blocks' saved tensors as inductor keeps them (measured on CPU)"
        )
    return lines + _extra_memory_lines(p)


def _extra_memory_lines(p: dict[str, Any]) -> list[str]:
    """MoE's routed load, host memory, and another framework's accounting (plan.framework)."""
    lines: list[str] = []
    mem = p["memory_bytes"]
    if "moe" in p:  # Mixture-of-Experts (pretrain.plan.memory): the imbalance the routed tokens are planned at
        mo = p["moe"]
        limit = mo["fits_up_to_imbalance"]
        limit = (
            ""
            if limit is None
            else (": does not fit even balanced" if not limit else f"; fits up to imbalance {limit:g}")
        )
        lines.append(
            f"    {'experts':<14} {mo['experts_per_rank']:>9}   a rank (expert parallel "
            f"{mo['expert_parallel']}); routed tokens at plan.routing_imbalance {mo['routing_imbalance']:g}"
            f" = load {mo['routed_load']:g}{limit}"
        )
    if mem["host"]:  # offloaded states, or a model.init_from checkpoint being read
        lines.append(f"    {'host per node':<14} {mem['host'] / GiB:>9.2f}   RAM for offloaded states / the import")
    if "framework" in p and "not_modelled" in p["framework"]:  # MoE: no dense formula stands in for it
        lines.append(f"    {'as ' + p['framework']['name']:<14} {'n/a':>9}   not modelled for Mixture-of-Experts")
    elif "framework" in p:  # plan.framework: another framework's accounting (pretrain.plan.frameworks)
        fw, fm = p["framework"], p["framework"]["memory_bytes"]
        fits = "" if fw["fits"] is None else (": fits" if fw["fits"] else ": does NOT fit")
        lines.append(
            f"    {'as ' + fw['name']:<14} {fm['total'] / GiB:>9.2f}   model states "
            f"{(fm['weights'] + fm['gradients'] + fm['optimizer']) / GiB:.2f} + activations "
            f"{fm['activations'] / GiB:.2f} + context{fits} (formulas and sources: --explain)"
        )
        if fm["host"]:  # DeepSpeed's estimators count host RAM per node too
            cold = fw.get("host_without_zero_init")
            lines.append(
                f"    {'  host':<14} {fm['host'] / GiB:>9.2f}   per node as {fw['name']} counts it"
                + ("" if cold is None else f" with zero.Init ({cold / GiB:.2f} without)")
            )
    return lines


def budget_lines(budget: dict[str, Any]) -> list[str]:
    """The budget block printed above the plan of the chosen model (or of the model given)."""
    if "model_given" in budget:
        n, d = budget["model_params"], budget["model_tokens"]
        return [
            f"budget: {_hours(budget['gpu_hours'])} GPU-hours buy {d / 1e9:,.4g}B tokens for the model given "
            f"({budget['model_given']}): {n / 1e9:.3g}B params, {d / n:,.1f} tokens per parameter; predicted "
            f"loss {budget['loss']:.3f} (+{budget['loss_penalty']:.3f} above the compute-optimal size's "
            f"{budget['loss_optimum']:.3f} at {budget['approach_3_params'] / 1e9:.2f}B params)",
            "  (tokens from the plan's own time; without a model given the budget chooses it: docs/plan.md)",
            "",
        ]

    def row(label: str, b: dict[str, Any]) -> str:
        m = b["model"]
        fit = "fits" if b["fit"]["fits"] else "does NOT fit"
        extra = " ".join(f"{k}={v}" for k, v in b["fit"]["overrides"].items())
        return (
            f"  {label:<18} {b['params'] / 1e9:6.2f}B params on {b['tokens'] / 1e9:,.1f}B tokens "
            f"({b['tokens'] / b['params']:.0f}/param): H {m['hidden_size']}, L {m['num_layers']}, heads "
            f"{m['num_heads']}/{m['num_kv_heads']} kv, H' {m['intermediate_size']}; predicted loss "
            f"{b['loss']:.3f} ({b['loss_penalty']:+.3f}); {fit}" + (f" with {extra}" if extra else "")
        )

    opt = {
        "model": budget["model"],
        "params": budget["model_params"],
        "tokens": budget["model_tokens"],
        "loss": budget["loss"],
        "loss_penalty": budget["loss_penalty"],
        "fit": budget["fit"],
    }
    small = budget["inference_aware"]
    lines = [
        f"budget: {_hours(budget['gpu_hours'])} GPU-hours = {budget['compute_flops']:.3g} FLOPs; "
        f"Chinchilla-optimal N {budget['params'] / 1e9:.2f}B, D {budget['tokens'] / 1e9:,.1f}B tokens "
        f"(Hoffmann et al. 2022)",
        row("compute-optimal", opt),
        row("inference-aware", small),
        "  predicted loss: Hoffmann et al.'s approach 3 fit, refitted by Besiroglu et al. 2024; (+x) from its "
        f"optimum {budget['loss_optimum']:.3f} "
        f"(at {budget['approach_3_params'] / 1e9:.2f}B params)",
        "  (the plan below is the compute-optimal row's; every figure explained by --explain)",
        "",
    ]
    return lines


def _hours(hours: float) -> str:
    return f"{hours:,.0f}" if hours >= 100 else f"{hours:.3g}"  # 2,688 GPU-hours; 0.05 of one
