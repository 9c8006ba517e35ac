"""Memory per GPU: model states, activations, temporary buffers, CUDA context; does it fit?

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
Buffers: FSDP's reduce-scatter of one block's gradients (of one tensor rank's share of the block) and the
loss's working set at the end of forward (train.loss: the plain loss's logits in the compute dtype and in
fp32, or one chunk's logits). DDP's gradient buckets (a fused buffer of the gradients, 1.5B params -> 6 GB in
fp32, as the ZeRO paper notes) are the gradients themselves: our DDP uses gradient_as_bucket_view.
Not all of it is alive at once. The peak (`total`) is the largest of four phases of an optimizer step, each
counted from what our trainer holds on CUDA (see `_phases`): the end of forward with the loss, the loss's
backward, the first block's backward (the last of the pass) and the optimizer step. Gradients exist from the
first backward until the step frees them (`zero_grad(set_to_none=True)`), so with one micro-batch they are
never beside the full activations.
"""

from __future__ import annotations

from ..config import compile_enabled
from ..gpus import gpu_spec
from .activations import _shard, activation_bytes, layer_terms, loss_terms, residual_bytes
from .kernels import planned_native_gqa
from ..units import gib
from .explain import Explain
from .hardware import device_memory_bytes
from .model_states import heaviest_stage, model_state_tensors, numel, stage_share, zero_paper_bytes
from .params import param_shapes
from .stages import chunk_indices, chunks_per_stage, stage_layers

PHASES = ("forward", "loss_backward", "backward", "optimizer_step")
# Once-per-micro-batch tensors kept until the embedding's backward, the very last; the final norm's, the output
# layer's and the loss's are gone before the blocks' backward runs.
EMBEDDING_SIDE = ("token ids", "target ids", "position ids", "rotary tables", "embedding dropout mask")


def memory(cfg, counts, ex: Explain) -> dict:
    m, t, par, hw = cfg.model, cfg.train, cfg.parallel, cfg.hardware
    dp = par.data_parallel
    mixed = t.precision.endswith("-mixed")
    st = model_state_tensors(cfg)
    zero = par.zero_stage if dp > 1 else 0

    params, optimizer, host_offload = _resident(cfg, st)
    weights = st["working_copies"] + params
    gradients = st["gradients"]
    what = {"fp32": "fp32 parameters", "bf16": "bf16 parameters",
            "fp16-mixed": "fp16 working copies", "bf16-mixed": "bf16 working copies"}[t.precision]
    ex.add("memory", "weights", gib(weights), f"{what}: {weights:,} bytes"
           + (f" (ZeRO-{zero}, data parallel {dp})" if zero else ""))
    grad_dtype = "bf16" if t.precision == "bf16" or (mixed and t.grad_dtype == "same") else "fp32"
    ex.add("memory", "gradients", gib(gradients), f"{grad_dtype} gradients: {gradients:,} bytes"
           + (f", sharded over {dp}" if zero >= 2 else ""))
    ex.add("memory", "optimizer", gib(optimizer),
           f"{t.optimizer} states {st['optimizer_states']:,}" + (f" + fp32 master weights {st['parameters']:,}" if mixed else "")
           + (f" (sharded over {dp})" if zero >= 1 else "") + (" (offloaded to the host)" if host_offload else ""))
    if par.pipeline > 1:
        k = heaviest_stage(cfg)
        v = chunks_per_stage(par)
        split = stage_layers(m.num_layers, par.pipeline * v)
        chunks = [split[c] for c in chunk_indices(k, par.pipeline, v)]  # one range without interleaving
        held = " and ".join(f"{r.start}-{r.stop - 1}" if len(r) > 1 else f"{r.start}" for r in chunks)
        ends = {0: "the embedding and ", par.pipeline - 1: "the final norm, the output layer and "}.get(k, "")
        ex.add("memory", "pipeline stage", k, f"model states above are stage {k}'s of {par.pipeline}, the heaviest: "
               f"{ends}" + (f"layers {held}" if sum(map(len, chunks)) > 1 else f"layer {held}")
               + (", each tensor rank's part" if par.tensor > 1 else ""))

    if mixed and t.optimizer == "adamw":
        # As the paper combines ZeRO with model parallelism (its table 1): each GPU holds Psi / N_m parameters,
        # N_m = tensor x pipeline, whose states ZeRO then shards over data parallel.
        mp = par.tensor * par.pipeline
        paper = zero_paper_bytes(counts.total / mp, zero, dp, grad_bytes=2 if t.grad_dtype == "same" else 4)
        ex.add("memory", "model states, ZeRO paper accounting", gib(paper),
               f"(2 + {2 if t.grad_dtype == 'same' else 4} + 12) bytes x {counts.total:,} parameters"
               + (f" / model parallel {mp} (tensor {par.tensor} x pipeline {par.pipeline})" if mp > 1 else "")
               + f", stage {zero} sharding over {dp}; ours above counts what autocast/FSDP really hold")

    act = activation_bytes(m, t, par, native_gqa=planned_native_gqa(cfg))
    per_layer_formula = " + ".join(x.formula for x in act["layer_terms"])
    ex.add("memory", "activations per layer", gib(act["per_layer"]),
           f"{per_layer_formula} with b={t.micro_batch_size}, s={t.seq_len}, h={m.hidden_size}, "
           f"H'={m.intermediate_size}" + (f", / tensor {par.tensor}" if par.tensor > 1 else ""))
    ex.add("memory", "activations", gib(act["total"]),
           (f"{act['layers']} layers x {act['in_flight']} micro-batch(es) in flight" if chunks_per_stage(par) == 1
            else f"chunks of {act['layers']} layers x {act['in_flight']} chunk micro-batches in flight (interleaved)")
           + f" x {act['per_layer']:,}"
           + (f" + one recomputed block {act['recompute_working']:,}" if act["recompute_working"] else "")
           + f" + embedding/final norm/loss {act['once']:,}")

    buffers, why = _buffers(cfg, st, zero)
    ex.add("memory", "buffers", gib(buffers), why)
    context = _cuda_context(cfg)
    ex.add("memory", "cuda_context", gib(context), f"hardware.cuda_context_gb {hw.cuda_context_gb} x 1e9"
           if context else "none on a CPU")

    # One optimizer step passes through four phases; what is alive differs, and the peak is the largest.
    held, held_why = _held_gradients(cfg, st)
    ex.add("memory", "gradients in forward", gib(held), held_why)
    phases = _phases(cfg, st, t.micro_batch_size)
    totals = {name: sum(n for _, n in parts) for name, parts in phases.items()}
    for name, parts in phases.items():
        ex.add("memory", f"phase {name}", gib(totals[name]), " + ".join(f"{what} {n:,}" for what, n in parts))
    peak_phase = max(PHASES, key=lambda name: totals[name])  # the first of equal ones
    total = totals[peak_phase]
    ex.add("memory", "total", gib(total), f"the largest phase: {peak_phase} {total:,}")
    compiled = _compiled_note(cfg)
    ex.add("memory", "compiled", compiled or "eager", "train.compile resolves to torch.compile for this device: "
           "the figures above are eager mode's" if compiled else "train.compile resolves to eager for this device")

    # The trainer builds the model on the GPU (FSDP: on the meta device, then each rank its shard), so host
    # memory holds only offloaded states, and a whole imported checkpoint while model.init_from is read.
    procs = min(par.gpus, par.gpus_per_node)
    init = 4 * counts.total if m.init_from else 0
    host = procs * (host_offload + init)
    ex.add("memory", "host", gib(host), f"{procs} processes per node x (offloaded states {host_offload:,}"
           + (f" + the model.init_from checkpoint read in fp32 {init:,})" if init else ")"))

    device = device_memory_bytes(hw)
    result = dict(weights=weights, gradients=gradients, optimizer=optimizer, activations=act["total"],
                  buffers=buffers, cuda_context=context, total=total, peak_phase=peak_phase, phases=totals,
                  compiled=compiled, host=host)
    fit = dict(device_bytes=device, usable_bytes=None, fits=None, max_micro_batch_size=None)
    if device is not None:
        usable = int(device * (1 - hw.fragmentation))
        fit.update(usable_bytes=usable, fits=total <= usable)
        fit["max_micro_batch_size"] = _max_micro_batch(cfg, st, usable)
        ex.add("memory", "fits", fit["fits"], f"total {gib(total)} <= {gib(device)} x (1 - fragmentation "
               f"{hw.fragmentation}) = {gib(usable)}")
        ex.add("memory", "max_micro_batch_size", fit["max_micro_batch_size"],
               "largest train.micro_batch_size whose peak phase fits")
    tensors = {k: st[k] for k in ("parameters", "gradients", "optimizer_states", "working_copies")}
    return dict(memory_bytes=result, model_states=tensors, fit=fit, activation_detail=act)


def _resident(cfg, st) -> tuple[int, int, int]:
    """(parameters outside the working copies, optimizer states with autocast's fp32 master weights, the bytes
    of both offloaded to the host): on the GPU from start to end of every step."""
    mixed = cfg.train.precision.endswith("-mixed")
    params = 0 if mixed else st["parameters"]  # autocast: the fp32 parameters are the master weights
    optimizer = st["optimizer_states"] + (st["parameters"] if mixed else 0)
    host = 0
    if cfg.parallel.offload in ("optimizer", "optimizer+params"):
        host, optimizer = optimizer, 0
    if cfg.parallel.offload == "optimizer+params":
        host, params = host + params, 0
    return params, optimizer, host


def _cuda_context(cfg) -> int:
    return int(cfg.hardware.cuda_context_gb * 1e9) if gpu_spec(cfg.hardware.gpu).name != "cpu" else 0


def _compiled_note(cfg) -> str | None:
    """The planner counts what eager mode keeps; say so wherever train.compile turns the compiler on."""
    device = "cpu" if gpu_spec(cfg.hardware.gpu).name == "cpu" else "cuda"
    if not compile_enabled(cfg.train.compile, device):
        return None
    return "not modelled: eager figures; torch.compile usually keeps less"


def _held_gradients(cfg, st) -> tuple[int, str]:
    """Gradients alive while a micro-batch's forward runs. The trainer frees them after each optimizer step
    (`zero_grad(set_to_none=True)`), so with one micro-batch they do not exist yet at the activation peak."""
    t, par = cfg.train, cfg.parallel
    if par.data_parallel > 1 and par.zero_stage <= 1:
        return 0, "none beside DDP's gradient buckets, which are the gradients and counted in every phase"
    if t.grad_accum_steps == 1:
        return 0, ("none: train.grad_accum_steps=1, the gradients appear in backward and the optimizer step "
                   "frees them")
    if cfg.parallel.fsdp and par.grad_sync == "step":
        n = _unsharded_gradients(cfg)
        return n, (f"FSDP without reduce-scatter between micro-batches (parallel.grad_sync=step) holds every "
                   f"gradient unsharded in its reduce dtype: {n:,}")
    return st["gradients"], f"the earlier micro-batches' accumulated gradients {st['gradients']:,}"


def _unsharded_gradients(cfg, block_and_root: bool = False) -> int:
    """Unsharded gradients FSDP2 accumulates without gradient sync: fp32 (its reduce dtype under mixed
    precision), bf16 for pure bf16. `block_and_root`: only the model's first block's and the root's, which in
    the last micro-batch's backward are not yet reduce-scattered when that block, the last to run, does its
    backward."""
    shapes = param_shapes(cfg.model)
    n = sum(numel(s) for _, s in shapes)
    if block_and_root:
        per_layer = sum(numel(s) for name, s in shapes if name.startswith("blocks.0."))
        n -= (cfg.model.num_layers - 1) * per_layer
    if cfg.parallel.tensor * cfg.parallel.pipeline > 1:
        n = int(n * stage_share(cfg, shapes))
    return (2 if cfg.train.precision == "bf16" else 4) * n


def _backward_copies(cfg, st) -> int:
    """Working copies alive while the last block the backward pass runs (the model's first) does its backward."""
    if cfg.parallel.fsdp:
        return st["working_copies"]  # FSDP's gathered parameters: counted as in forward (an upper bound)
    if cfg.train.precision.endswith("-mixed"):  # the other blocks' casts went with their saved tensors
        matmul = sum(numel(s) for n, s in param_shapes(cfg.model) if n.startswith("blocks.0.") and len(s) == 2)
        return 2 * matmul // cfg.parallel.tensor
    return 0


def _backward_activations(cfg, act: dict, b: int, first: bool) -> int:
    """Activations alive while one block runs its backward, with the gradient flowing down the residual
    stream into and out of it and the embedding's inputs (the final norm's, output layer's and loss's are
    gone). `first`: the first block backward runs (the model's last), every block's tensors still alive and
    its own recomputed ones beside them; else the last it runs (the model's first), one block's left (and the
    other micro-batches' in flight under a pipeline)."""
    m, t, par = cfg.model, cfg.train, cfg.parallel
    tp, sp = par.tensor, par.sequence_parallel
    if first:
        blocks = act["in_flight"] * act["layers"] * act["per_layer"] + _recomputed(cfg, act, b)
    else:
        blocks = (act["in_flight"] * act["layers"] - (act["layers"] - 1)) * act["per_layer"] + \
            act["recompute_working"]
    embedding = _shard([x for x in act["once_terms"] if x.name.startswith(EMBEDDING_SIDE)], tp, sp)
    residual = 2 * residual_bytes(t, par) * b * t.seq_len * m.hidden_size
    return blocks + embedding + residual // (tp if sp else 1)


def _recomputed(cfg, act: dict, b: int) -> int:
    """What recomputation makes again for one block during its backward: full, the block's tensors; selective,
    what the block keeps without it less what it keeps with it (the norms' and the MLP activation's)."""
    t = cfg.train
    if t.activation_checkpointing != "selective":
        return act["recompute_working"]
    gqa = planned_native_gqa(cfg)
    par = cfg.parallel

    def kept(mode):
        return _shard(layer_terms(cfg.model, t, par, b, recompute=mode, native_gqa=gqa), par.tensor,
                      par.sequence_parallel)
    return kept("none") - kept("selective")


def _phases(cfg, st, b: int) -> dict[str, list[tuple[str, int]]]:
    """What each phase of an optimizer step holds, as (what, bytes) parts, for micro-batch b:
      forward         end of the last micro-batch's forward with the loss: all activations, the loss's working set,
                      the gradients held across micro-batches;
      loss_backward   the loss's backward: all activations and the loss's backward working set;
      backward        the largest of three moments: the first block backward runs (the model's last: every
                      block's activations and its recomputed tensors, the output layer's and its own
                      gradients), the last it runs (the other blocks' gradients, its activations or its
                      gradients, FSDP's reduce-scatter of one block) and a tied embedding's (all gradients and
                      a second V x H one);
      optimizer_step  gradients, states and the optimizer's working memory.
    Parameters, optimizer states, DDP's gradient buckets (allocated when DDP wraps the model) and the CUDA
    context are alive in all four. Recomputed tensors exist only in backward: not in the first two."""
    t, par = cfg.train, cfg.parallel
    dp = par.data_parallel
    mixed = t.precision.endswith("-mixed")
    params, optimizer, _ = _resident(cfg, st)
    act = activation_bytes(cfg.model, t, par, b, native_gqa=planned_native_gqa(cfg))
    resident = [("parameters", params),
                (f"{t.optimizer} states" + (" + fp32 master weights" if mixed else ""), optimizer)]
    if dp > 1 and par.zero_stage <= 1:
        # DDP (ZeRO-1 runs on it too) allocates its gradient buckets when it wraps the model, and with
        # gradient_as_bucket_view (distributed/parallelize.py) the gradients are views into them: alive in
        # every phase, even before the first backward, and never a second time.
        resident.append(("DDP gradient buckets (the gradients)", st["gradients"]))
        st = dict(st, gradients=0)
    resident.append(("cuda_context", _cuda_context(cfg)))
    held, _ = _held_gradients(cfg, st)
    held_name = "unsharded gradients" if cfg.parallel.fsdp and par.grad_sync == "step" else "gradients"
    copies = ("working copies", st["working_copies"])
    forward_act = ("activations", act["total"] - act["recompute_working"])
    gradients = st["gradients"]
    if cfg.parallel.fsdp and par.grad_sync == "step" and t.grad_accum_steps > 1:
        gradients += _unsharded_gradients(cfg, block_and_root=True)
    reduce_scatter = 4 * st["per_layer_params"] if cfg.parallel.fsdp else 0
    first = [copies, (held_name, max(held, _first_block_gradients(cfg, st))),
             ("first block backward runs: all activations, its recomputed ones, the residual gradients",
              _backward_activations(cfg, act, b, first=True))]
    rest = _backward_activations(cfg, act, b, first=False)
    if cfg.parallel.fsdp:  # gradients arrive unsharded in the reduce-scatter buffer, sharded ones already counted
        last = [("working copies", _backward_copies(cfg, st)), ("gradients", gradients),
                ("last block backward runs: its activations, the residual gradients", rest),
                ("FSDP reduce-scatter", reduce_scatter)]
    else:  # the block's gradients appear as its activations and working copies are freed: the larger of the two
        block = act["per_layer"] + act["recompute_working"]
        rest -= block
        block_grads = _block_gradients(cfg, st)
        last = [("other blocks' gradients", gradients - block_grads),
                ("the last block backward runs: its activations and copies, or its gradients",
                 max(block + _backward_copies(cfg, st), block_grads)),
                ("the residual gradients and the embedding's inputs", rest)]
    checkpoints = ("checkpoints' CPU generator states", _checkpoint_rng_states(cfg, act))
    first.append(checkpoints)
    phases = {
        "forward": [copies, (held_name, held), forward_act, checkpoints, ("loss working set", _loss_buffer(cfg, b))],
        "loss_backward": [copies, (held_name, held), forward_act, checkpoints,
                          ("loss backward", _loss_backward_buffer(cfg, b))],
        "backward": max(first, last, _tied_embedding_backward(cfg, st, gradients),
                        key=lambda parts: sum(n for _, n in parts)),
        "optimizer_step": [("gradients", st["gradients"]),
                           (f"{t.optimizer} working memory", st["optimizer_working"])],
    }
    return {name: [p for p in resident + parts if p[1]] for name, parts in phases.items()}


def _tied_embedding_backward(cfg, st, gradients: int) -> list[tuple[str, int]]:
    """The embedding's backward, the very last: a tied embedding's gradient is made as a new V x H tensor and
    then added to the output layer's, which is already there (an untied one is its first gradient)."""
    if not cfg.model.tie_embeddings or cfg.parallel.fsdp:
        return []
    shapes = dict(param_shapes(cfg.model))
    total = sum(numel(s) for s in shapes.values())
    embedding = st["gradients"] * numel(shapes["embed.weight"]) // total
    return [("gradients", gradients), ("the tied embedding's new gradient", embedding)]


def _block_gradients(cfg, st) -> int:
    """One block's share of the gradients."""
    shapes = param_shapes(cfg.model)
    total = sum(numel(s) for _, s in shapes)
    return st["gradients"] * sum(numel(s) for n, s in shapes if n.startswith("blocks.0.")) // total


# torch.utils.checkpoint keeps the CPU generator's state (torch.get_rng_state(): 5,056 bytes of Mersenne
# Twister) for every checkpointed call until its backward, to replay dropout exactly; on a GPU in host memory.
CPU_RNG_STATE_BYTES = 5056


def _checkpoint_rng_states(cfg, act: dict) -> int:
    """CPU plans only: the generator states recomputation keeps, per checkpointed call (selective: both norms
    and the MLP activation of each block; full: each block)."""
    calls = {"none": 0, "selective": 3, "full": 1}[cfg.train.activation_checkpointing]
    if gpu_spec(cfg.hardware.gpu).name != "cpu":
        return 0
    return CPU_RNG_STATE_BYTES * calls * act["layers"] * act["in_flight"]


def _first_block_gradients(cfg, st) -> int:
    """Gradients made by the end of the first block's backward: the output layer's, the final norm's and that
    block's own (their share of all gradients)."""
    shapes = param_shapes(cfg.model)
    total = sum(numel(s) for _, s in shapes)
    top = f"blocks.{cfg.model.num_layers - 1}."
    made = sum(numel(s) for n, s in shapes if n.startswith(("norm.", "lm_head.", top))
               or (n == "embed.weight" and cfg.model.tie_embeddings))
    return st["gradients"] * made // total


def _loss_part(cfg, b: int, when: str) -> tuple[int, str]:
    """What the loss holds beside what it keeps (pretrain.plan.activations.loss_terms), `when` "forward" (at
    its end) or "backward" (while the loss's backward runs): bytes and the formula."""
    par = cfg.parallel
    terms = loss_terms(cfg.model, cfg.train, par, b)[when]
    return _shard(terms, par.tensor, par.sequence_parallel), " + ".join(f"{x.name} ({x.formula})" for x in terms)


def _loss_buffer(cfg, b: int) -> int:
    """The loss's working set at the end of forward: the plain loss's logits in the compute dtype and in
    fp32, or the chunked loss's last chunk (its gradients, made in forward, are kept: activations)."""
    return _loss_part(cfg, b, "forward")[0]


def _loss_backward_buffer(cfg, b: int) -> int:
    """The loss's backward at its largest: the plain loss's fp32 gradients of the log-softmax and the logits
    beside the kept log-softmax (12 x b*s*V in all); the chunked one only scales the gradients it kept."""
    return _loss_part(cfg, b, "backward")[0]


def _buffers(cfg, st, zero: int) -> tuple[int, str]:
    dp = cfg.parallel.data_parallel
    loss, formula = _loss_part(cfg, cfg.train.micro_batch_size, "forward")
    t = cfg.parallel.tensor
    parts, why = [loss], [f"{cfg.train.loss} loss working set at the end of forward {loss:,}: {formula}"
                          + (f", V terms / tensor {t}" if t > 1 else "")]
    if dp > 1 and zero >= 2:
        rs = 4 * st["per_layer_params"]
        parts.append(rs)
        why.append(f"FSDP reduce-scatter of one block's fp32 gradients {rs:,} (4 x {st['per_layer_params']:,} "
                   + ("parameters per tensor rank)" if t > 1 else "parameters)"))
    return sum(parts), " + ".join(why)


def _max_micro_batch(cfg, st, usable: int) -> int:
    def need(b):
        return max(sum(n for _, n in parts) for parts in _phases(cfg, st, b).values())

    if need(1) > usable:
        return 0
    lo, hi = 1, 2
    while need(hi) <= usable:  # ends: every sequence adds its token ids and logits, so need grows with b
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(mid) <= usable else (lo, mid)
    return lo
