"""Memory per GPU: model states, activations, temporary buffers, CUDA context; does it fit (plan/memory_fit.py)?

Model states follow the ZeRO paper's accounting (Rajbhandari et al. 2020, section 3.1) for the way our
trainer really holds them:
  fp32        weights 4 bytes, gradients 4, optimizer states (AdamW m and v: 8) in fp32.
  *-mixed     autocast: the parameters stay fp32 and serve as the master weights (counted under optimizer
              with m and v: 4 + 8 = 12 bytes); gradients are fp32 (4 bytes, `train.grad_dtype: fp32`, as
              PyTorch, Megatron and DeepSpeed keep them today; 2 with `same`, as the ZeRO paper counts);
              "weights" are the half-precision copies autocast makes of each matmul weight and keeps for
              backward (2 bytes per matmul parameter). 2 + 4 + 12 = 18 bytes/param (16 with `same`).
  bf16        pure bf16 weights, gradients and optimizer states: 2 + 2 + 4 = 8 bytes/param.
ZeRO stages shard over the data-parallel group (world / (tensor x pipeline)), as our trainer does it:
  1  PyTorch's ZeroRedundancyOptimizer: each rank keeps the optimizer states of its share of the parameter
     tensors (greedy by size); parameters (= fp32 master weights) and gradients stay whole.
  2  FSDP2 without resharding after forward: fp32 parameters, gradients and states sharded; the
     half-precision parameters of every block stay gathered from forward to backward.
  3  FSDP2: everything sharded; only the blocks in flight (the current one and the prefetched next) and the
     root (embedding, final norm, output layer) are gathered; with a pipeline, those of the stage's own.
Buffers: FSDP's reduce-scatter of one block's gradients (of one tensor rank's share of the block), the
loss's working set at the end of forward (train.loss: the plain loss's logits in the compute dtype and in
fp32, or one chunk's logits) and, between GPUs, NCCL's communicators' buffers (plan/phases.py). DDP's
gradient buckets (a fused buffer of the gradients, 1.5B params -> 6 GB in fp32, as the ZeRO paper notes) are
the gradients themselves: our DDP uses gradient_as_bucket_view.
Not all of it is alive at once. The peak (`total`) is the largest of four phases of an optimizer step, each
counted from what our trainer holds on CUDA (plan/phases.py): the end of forward with the loss, the loss's
backward, the first block's backward (the last of the pass) and the optimizer step. Gradients exist from the
first backward until the step frees them (`zero_grad(set_to_none=True)`), so with one micro-batch they are
never beside the full activations. With train.compile on, `compiled` is the same peak with each block keeping
what torch.compile saves (plan/activations.py); `total`, the larger, still judges the fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import compile_enabled
from ..gpus import gpu_spec, mixed_precision
from ..units import gib
from .activations import activation_bytes
from .explain import Explain
from .kernels import planned_document_kernel, planned_fused_norm, planned_native_gqa
from .memory_fit import memory_fit, moe_fit
from .model_states import expert_shard_dim, model_state_tensors, zero_paper_bytes
from .phases import PHASES, cuda_context, held_gradients, loss_part, nccl_buffers, resident, step_phases
from .stages import chunk_indices, chunks_per_stage, stage_layers

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig
    from .params import ParamCounts


def memory(cfg: ResolvedConfig, counts: ParamCounts, ex: Explain) -> dict[str, Any]:
    m, t, par, hw = cfg.model, cfg.train, cfg.parallel, cfg.hardware
    dp = par.data_parallel
    st = model_state_tensors(cfg)
    zero = par.zero_stage if dp > 1 else 0

    params, optimizer, host_offload = resident(cfg, st)
    weights = st["working_copies"] + params
    gradients = st["gradients"]
    _explain_model_states(cfg, counts, st, (weights, gradients, optimizer), host_offload, ex)

    act = activation_bytes(
        m,
        t,
        par,
        native_gqa=planned_native_gqa(cfg),
        imbalance=cfg.plan.routing_imbalance,
        documents=planned_document_kernel(cfg),
        fused_norm=planned_fused_norm(cfg),
    )
    _explain_activations(cfg, act, ex)

    buffers, why = _buffers(cfg, st, zero)
    ex.add("memory", "buffers", gib(buffers), why)
    context = cuda_context(cfg)
    ex.add(
        "memory",
        "cuda_context",
        gib(context),
        f"hardware.cuda_context_gb {hw.cuda_context_gb} x 1e9" if context else "none on a CPU",
    )

    # One optimizer step passes through four phases; what is alive differs, and the peak is the largest.
    held, held_why = held_gradients(cfg, st)
    ex.add("memory", "gradients in forward", gib(held), held_why)
    phases = step_phases(cfg, st, t.micro_batch_size)
    totals = {name: sum(n for _, n in parts) for name, parts in phases.items()}
    for name, parts in phases.items():
        ex.add("memory", f"phase {name}", gib(totals[name]), " + ".join(f"{what} {n:,}" for what, n in parts))
    peak_phase = max(PHASES, key=lambda name: totals[name])  # the first of equal ones
    total = totals[peak_phase]
    ex.add("memory", "total", gib(total), f"the largest phase: {peak_phase} {total:,}")
    compiled, compiled_basis = _compiled_peak(cfg, st, ex)
    host = _host(cfg, counts, host_offload, ex)

    result = dict(
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        activations=act["total"],
        buffers=buffers,
        cuda_context=context,
        total=total,
        peak_phase=peak_phase,
        phases=totals,
        compiled=compiled,
        compiled_basis=compiled_basis,
        host=host,
    )
    fit = memory_fit(cfg, st, total, ex)
    tensors = {k: st[k] for k in ("parameters", "gradients", "optimizer_states", "working_copies")}
    out = dict(memory_bytes=result, model_states=tensors, fit=fit, activation_detail=act)
    if m.num_experts:
        out["moe"] = moe_fit(cfg, st, fit["usable_bytes"], ex)
    return out


def _explain_model_states(
    cfg: ResolvedConfig, counts: ParamCounts, st: dict[str, Any], kinds: tuple[int, int, int], offload: int, ex: Explain
) -> None:
    """--explain's lines for the weights, gradients and optimizer states, a pipeline stage's share, and the
    ZeRO paper's accounting beside ours."""
    m, t, par = cfg.model, cfg.train, cfg.parallel
    weights, gradients, optimizer = kinds
    dp = par.data_parallel
    zero = par.zero_stage if dp > 1 else 0
    mixed = mixed_precision(t.precision)
    what = {
        "fp32": "fp32 parameters",
        "bf16": "bf16 parameters",
        "fp16-mixed": "fp16 working copies",
        "bf16-mixed": "bf16 working copies",
        "fp8": "bf16 and float8 working copies",
    }[t.precision]
    ex.add(
        "memory",
        "weights",
        gib(weights),
        f"{what}: {weights:,} bytes" + (f" (ZeRO-{zero}, data parallel {dp})" if zero else ""),
    )
    grad_dtype = "bf16" if t.precision == "bf16" or (mixed and t.grad_dtype == "same") else "fp32"
    over = _sharded_over(cfg)
    ex.add(
        "memory",
        "gradients",
        gib(gradients),
        f"{grad_dtype} gradients: {gradients:,} bytes" + (f", sharded over {over}" if zero >= 2 else ""),
    )
    ex.add(
        "memory",
        "optimizer",
        gib(optimizer),
        f"{t.optimizer} states {st['optimizer_states']:,}"
        + (f" + fp32 master weights {st['parameters']:,}" if mixed else "")
        + (f" (sharded over {over})" if zero >= 1 else "")
        + (" (offloaded to the host)" if offload else ""),
    )
    if par.pipeline > 1:
        k = st["stage"]
        v = chunks_per_stage(par)
        split = stage_layers(m.num_layers, par.pipeline * v)
        chunks = [split[c] for c in chunk_indices(k, par.pipeline, v)]  # one range without interleaving
        held = " and ".join(f"{r.start}-{r.stop - 1}" if len(r) > 1 else f"{r.start}" for r in chunks)
        ends = {0: "the embedding and ", par.pipeline - 1: "the final norm, the output layer and "}.get(k, "")
        ex.add(
            "memory",
            "pipeline stage",
            k,
            f"model states above are stage {k}'s of {par.pipeline}, the heaviest: "
            f"{ends}"
            + (f"layers {held}" if sum(map(len, chunks)) > 1 else f"layer {held}")
            + (", each tensor rank's part" if par.tensor > 1 else ""),
        )

    if mixed and t.optimizer == "adamw":
        # As the paper combines ZeRO with model parallelism (its table 1): each GPU holds Psi / N_m parameters,
        # N_m = tensor x pipeline, whose states ZeRO then shards over data parallel.
        mp = par.tensor * par.pipeline
        paper = zero_paper_bytes(counts.total / mp, zero, dp, grad_bytes=2 if t.grad_dtype == "same" else 4)
        ex.add(
            "memory",
            "model states, ZeRO paper accounting",
            gib(paper),
            f"(2 + {2 if t.grad_dtype == 'same' else 4} + 12) bytes x {counts.total:,} parameters"
            + (f" / model parallel {mp} (tensor {par.tensor} x pipeline {par.pipeline})" if mp > 1 else "")
            + f", stage {zero} sharding over {dp}; ours above counts what autocast/FSDP really hold",
        )


def _sharded_over(cfg: ResolvedConfig) -> str:
    """What ZeRO shards over, as model_states.py counts it: the data ranks; an MoE model's routed experts over
    the ranks holding the same ones (on dim 1 past the experts each holds), its router and shared experts over
    every data x tensor rank beside tensor parallelism with whole experts."""
    m, par = cfg.model, cfg.parallel
    dp = par.data_parallel
    if not m.num_experts:
        return f"{dp}"
    here, ranks = m.num_experts // par.expert, par.expert_data_parallel
    dim = expert_shard_dim(here, ranks)
    folded = par.tensor > 1 and par.expert_tensor == 1
    return (
        f"{dp} data ranks"
        + (f" (the router and shared experts over all {par.expert_pool} data x tensor ranks)" if folded else "")
        + f"; the routed experts, {here} a rank (expert parallel {par.expert}), over the {ranks} ranks holding "
        + f"the same ones, on dim {dim}"
        + (": each expert's rows split" if dim else "")
    )


def _explain_activations(cfg: ResolvedConfig, act: dict[str, Any], ex: Explain) -> None:
    m, t, par = cfg.model, cfg.train, cfg.parallel
    per_layer_formula = " + ".join(x.formula for x in act["layer_terms"])
    ex.add(
        "memory",
        "activations per layer",
        gib(act["per_layer"]),
        f"{per_layer_formula} with b={t.micro_batch_size}, s={t.seq_len}, h={m.hidden_size}, "
        f"H'={m.intermediate_size}" + (f", / tensor {par.tensor}" if par.tensor > 1 else ""),
    )
    if t.activation_checkpointing == "selective":
        ex.add(
            "memory",
            "selective recomputation",
            "operator-level",
            "torchtitan's op policy (selective_ac_option "
            "'op'): each block keeps its input, the attention kernel's outputs and every other matmul's output "
            "(our fused qkv and gate|up whole, where torchtitan's separate projections keep wq, wv, w1, w2); "
            "backward recomputes the rest, the output projection's matmul included, one block at a time",
        )
    ex.add(
        "memory",
        "activations",
        gib(act["total"]),
        (
            f"{act['layers']} layers x {act['in_flight']} micro-batch(es) in flight"
            if chunks_per_stage(par) == 1
            else f"chunks of {act['layers']} layers x {act['in_flight']} chunk micro-batches in flight (interleaved)"
        )
        + f" x {act['per_layer']:,}"
        + (f" + one recomputed block {act['recompute_working']:,}" if act["recompute_working"] else "")
        + f" + embedding/final norm/loss {act['once']:,}",
    )


def _host(cfg: ResolvedConfig, counts: ParamCounts, host_offload: int, ex: Explain) -> int:
    """Host memory per node."""
    m, par = cfg.model, cfg.parallel
    # The trainer builds the model on the GPU (FSDP: on the meta device, then each rank its shard), so host
    # memory holds only offloaded states, and a whole imported checkpoint while model.init_from is read.
    procs = min(par.gpus, par.gpus_per_node)
    init = 4 * counts.total if m.init_from else 0
    host = procs * (host_offload + init)
    ex.add(
        "memory",
        "host",
        gib(host),
        f"{procs} processes per node x (offloaded states {host_offload:,}"
        + (f" + the model.init_from checkpoint read in fp32 {init:,})" if init else ")"),
    )
    return host


COMPILED_BASIS = (
    "eager phases with the blocks' saved tensors as inductor's partitioner keeps them (measured on CPU, torch 2.13)"
)


def _compiled_peak(cfg: ResolvedConfig, st: dict[str, Any], ex: Explain) -> tuple[int | None, str | None]:
    """The step's peak where train.compile turns the compiler on: the same phases, each block keeping what
    torch.compile saves (pretrain.plan.activations); the fit stays judged on the eager peak, the larger."""
    device = "cpu" if gpu_spec(cfg.hardware.gpu).name == "cpu" else "cuda"
    if not compile_enabled(cfg.train.compile, device):
        ex.add("memory", "compiled", "eager", "train.compile resolves to eager for this device")
        return None, None
    t, par = cfg.train, cfg.parallel
    act = activation_bytes(
        cfg.model,
        t,
        par,
        native_gqa=planned_native_gqa(cfg),
        compiled=True,
        imbalance=cfg.plan.routing_imbalance,
        documents=planned_document_kernel(cfg, compiled=True),
        fused_norm=planned_fused_norm(cfg),
    )
    ex.add(
        "memory",
        "activations per layer, compiled",
        gib(act["per_layer"]),
        " + ".join(x.formula for x in act["layer_terms"]) + (f", / tensor {par.tensor}" if par.tensor > 1 else ""),
    )
    totals = {
        name: sum(n for _, n in parts)
        for name, parts in step_phases(cfg, st, t.micro_batch_size, compiled=True).items()
    }
    phase = max(PHASES, key=lambda name: totals[name])
    ex.add(
        "memory",
        "compiled",
        gib(totals[phase]),
        f"the largest phase with compiled blocks: {phase} "
        f"{totals[phase]:,} ({', '.join(f'{k} {v:,}' for k, v in totals.items())}); {COMPILED_BASIS}",
    )
    return totals[phase], COMPILED_BASIS


def _buffers(cfg: ResolvedConfig, st: dict[str, Any], zero: int) -> tuple[int, str]:
    dp = cfg.parallel.data_parallel
    loss, formula = loss_part(cfg, cfg.train.micro_batch_size, "forward")
    t = cfg.parallel.tensor
    parts, why = (
        [loss],
        [
            f"{cfg.train.loss} loss working set at the end of forward {loss:,}: {formula}"
            + (f", V terms / tensor {t}" if t > 1 else "")
        ],
    )
    if dp > 1 and zero >= 2:
        rs = 4 * st["per_layer_params"]
        parts.append(rs)
        why.append(
            f"FSDP reduce-scatter of one block's fp32 gradients {rs:,} (4 x {st['per_layer_params']:,} "
            + ("parameters per tensor rank)" if t > 1 else "parameters)")
        )
    nccl, nccl_why = nccl_buffers(cfg)
    if nccl:
        parts.append(nccl)
        why.append(f"{nccl_why} {nccl:,}")
    return sum(parts), " + ".join(why)
