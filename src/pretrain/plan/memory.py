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
Buffers: DDP's gradient buckets (a fused copy of the gradients, 1.5B params -> 6 GB in fp32, as the ZeRO
paper notes), FSDP's reduce-scatter of one block's gradients (of one tensor rank's share of the block), and
the loss's working set (train.loss: the plain loss's full-vocabulary fp32 gradients, or one chunk's logits).
"""

from __future__ import annotations

import heapq

from .activations import activation_bytes, loss_terms
from .kernels import planned_native_gqa
from .explain import Explain, gib
from .hardware import device_memory_bytes, gpu_spec
from .params import param_shapes


def _numel(shape) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def _shard_numel(shape, dp: int) -> int:
    """FSDP2 shards dim 0 in chunks of ceil(d0 / dp); rank 0 holds a full chunk (the largest share)."""
    return -(-shape[0] // dp) * _numel(shape[1:])


def _state_numel(optimizer: str, shape, momentum: float) -> int:
    """Elements of optimizer state for one parameter tensor (the fp32 step counter is added separately)."""
    if optimizer == "adamw":
        return 2 * _numel(shape)  # exp_avg, exp_avg_sq
    if optimizer == "sgd":
        return _numel(shape) if momentum else 0
    # Adafactor (torch.optim.Adafactor): a row and a column second-moment vector per matrix, full for vectors.
    if len(shape) >= 2:
        return _numel(shape[:-1]) + _numel(shape[:-2]) * shape[-1]
    return _numel(shape)


def zero_paper_bytes(psi: int, stage: int, dp: int, grad_bytes: int = 2, k: int = 12) -> float:
    """Model states per GPU as the ZeRO paper counts them (section 5.1, figure 1): fp16 weights (2 bytes),
    gradients (`grad_bytes`), K = 12 bytes of fp32 master weights, momentum and variance; stage 1 shards the
    K bytes, stage 2 also the gradients, stage 3 also the weights, over `dp` ranks."""
    weights, grads, states = 2 * psi, grad_bytes * psi, k * psi
    if stage >= 1:
        states /= dp
    if stage >= 2:
        grads /= dp
    if stage >= 3:
        weights /= dp
    return weights + grads + states


def _has_step(optimizer: str) -> bool:
    return optimizer in ("adamw", "adafactor")


def zero1_partition(shapes: list, dp: int, groups: list[list[int]]) -> list[list[int]]:
    """Which parameter indices each rank owns under ZeroRedundancyOptimizer: per parameter group, largest
    tensors first, each to the rank with the fewest elements so far, the lowest such rank on a tie (torch's
    `_partition_parameters`). A heap of (elements, rank) picks the same rank; ranks past the number of
    tensors own nothing and are left out of the list, so a huge data-parallel degree costs nothing."""
    owned: list[list[int]] = [[] for _ in range(min(dp, len(shapes)))]
    for group in groups:
        heap = [(0, r) for r in range(min(dp, len(group)))]  # an unused rank beyond these is never the lowest
        for i in sorted(group, key=lambda j: _numel(shapes[j][1]), reverse=True):
            size, rank = heapq.heappop(heap)
            owned[rank].append(i)
            heapq.heappush(heap, (size + _numel(shapes[i][1]), rank))
    return owned


def decay_groups(m, shapes: list) -> list[list[int]]:
    """AdamW's two parameter groups: [with weight decay (matrices), without (norms, biases, tied embedding)]."""
    decay, no_decay = [], []
    for i, (name, shape) in enumerate(shapes):
        tied_embedding = m.tie_embeddings and name == "embed.weight"
        (decay if len(shape) >= 2 and not tied_embedding else no_decay).append(i)
    return [g for g in (decay, no_decay) if g]


def model_state_tensors(cfg, rank: int | None = None) -> dict:
    """Bytes of the tensors one GPU holds between steps and in flight: parameters, gradients, optimizer
    states, and working copies (half-precision or gathered parameters). Exact for tensor = pipeline = 1.
    `rank`: that data-parallel rank's share (ranks differ under ZeRO-1 and uneven FSDP chunks); by default
    the largest share (what must fit)."""
    m, t, par = cfg.model, cfg.train, cfg.parallel
    dp = par.gpus // (par.tensor * par.pipeline)
    model_parallel = par.tensor * par.pipeline
    shapes = param_shapes(m)
    mixed = t.precision.endswith("-mixed")
    param_bytes = 2 if t.precision == "bf16" else 4
    grad_bytes = 2 if (t.precision == "bf16" or (mixed and t.grad_dtype == "same")) else 4
    state_bytes = param_bytes  # PyTorch optimizers keep states in the parameter dtype
    zero = par.zero_stage if dp > 1 else 0
    sharded = zero >= 2  # FSDP2 shards parameters, gradients and states

    def local(shape):
        return _shard_numel(shape, dp) if sharded else _numel(shape)

    n_params = sum(local(s) for _, s in shapes)  # FSDP pads every rank's chunk to ceil(d0 / dp) rows
    owned = range(len(shapes))
    if zero == 1:
        partition = zero1_partition(shapes, dp, decay_groups(m, shapes))
        owned = (partition[rank] if rank < len(partition) else []) if rank is not None else max(
            partition, key=lambda ix: sum(_numel(shapes[i][1]) for i in ix))
    n_states = sum(_state_numel(t.optimizer, _shape_for(shapes[i][1], dp, sharded, rank or 0), t.momentum)
                   for i in owned)
    steps = 4 * len(list(owned)) if _has_step(t.optimizer) else 0

    per_layer = sum(_numel(s) for n, s in shapes if n.startswith("blocks.0."))
    root = sum(_numel(s) for n, s in shapes if not n.startswith("blocks."))
    # Matmul weights (biases are added, not multiplied: autocast's cast of a bias is not kept).
    layer_matmul = sum(_numel(s) for n, s in shapes if n.startswith("blocks.0.") and len(s) == 2)
    # The plain loss's output matmul keeps autocast's copy of its weight; the chunked one casts it per call.
    output_matmul = m.vocab_size * m.hidden_size if t.loss == "plain" else 0
    compute_bytes = 2 if (mixed or t.precision == "bf16") else 4
    if zero == 2:  # every block's parameters stay gathered from forward to backward
        copies = compute_bytes * sum(_numel(s) for _, s in shapes)
    elif zero == 3 and model_parallel > 1:  # whole blocks of this stage, not a share of the model's
        copies = int(compute_bytes * _zero3_gathered(cfg, shapes))
    elif zero == 3:  # the block being computed, the prefetched next one, and the root's parameters
        copies = compute_bytes * (min(2, m.num_layers) * per_layer + root)
    elif mixed:  # autocast keeps a half-precision copy of each matmul weight for backward
        stage_layers = -(-m.num_layers // cfg.parallel.pipeline)
        layers_kept = 1 if t.activation_checkpointing == "full" else stage_layers  # full: the recomputed one
        copies = 2 * (layers_kept * layer_matmul + output_matmul) // cfg.parallel.tensor
    else:
        copies = 0
    out = dict(parameters=param_bytes * n_params, gradients=grad_bytes * n_params,
               optimizer_states=state_bytes * n_states + steps, working_copies=copies,
               per_layer_params=_block_share(cfg, shapes))
    if model_parallel > 1:  # tensor / pipeline split: the heaviest stage's share (approximate)
        scale = _stage_share(cfg, shapes)
        for key in ("parameters", "gradients", "optimizer_states") + (("working_copies",) if zero == 2 else ()):
            out[key] = int(out[key] * scale)
    return out


def _shape_for(shape, dp, sharded, rank=0):
    """A rank's unpadded share of a tensor under FSDP (optimizer states are made like the local shard)."""
    if not sharded:
        return shape
    chunk = -(-shape[0] // dp)
    return (max(0, min(chunk, shape[0] - rank * chunk)),) + tuple(shape[1:])


def _block_share(cfg, shapes) -> int:
    """Parameters of one block on one tensor rank: the matmuls split t ways, the norms replicated."""
    per_layer = sum(_numel(s) for n, s in shapes if n.startswith("blocks.0."))
    layer_norms = sum(_numel(s) for n, s in shapes if n.startswith("blocks.0.") and "norm" in n)
    return (per_layer - layer_norms) // cfg.parallel.tensor + layer_norms


def _zero3_gathered(cfg, shapes) -> float:
    """Parameters one (pipeline stage, tensor rank) holds gathered under ZeRO-3: the block being computed and
    the prefetched next one, both of this stage, and the root modules on it (the embedding on the first
    stage, the final norm and output layer on the last, all three without a pipeline), split as
    _stage_share splits them."""
    m, par = cfg.model, cfg.parallel
    t = par.tensor
    embed = sum(_numel(s) for n, s in shapes if n in ("embed.weight", "pos_embed.weight"))
    head = sum(_numel(s) for n, s in shapes if n.startswith("norm.")) + m.vocab_size * m.hidden_size
    if par.pipeline == 1:
        root = (embed + head - (m.vocab_size * m.hidden_size if m.tie_embeddings else 0)) / t
    else:  # the heavier end (a tied output layer is a second copy on the last stage)
        root = max(embed, head) / t
    blocks = min(2, -(-m.num_layers // par.pipeline))
    return blocks * _block_share(cfg, shapes) + root


def _stage_share(cfg, shapes) -> float:
    """Fraction of all parameters on the heaviest (pipeline stage, tensor rank)."""
    m, par = cfg.model, cfg.parallel
    total = sum(_numel(s) for _, s in shapes)
    per_layer = sum(_numel(s) for n, s in shapes if n.startswith("blocks.0."))
    layer_norms = sum(_numel(s) for n, s in shapes if n.startswith("blocks.0.") and "norm" in n)
    embed = sum(_numel(s) for n, s in shapes if n in ("embed.weight", "pos_embed.weight"))
    head = sum(_numel(s) for n, s in shapes if n.startswith("norm.")) + m.vocab_size * m.hidden_size
    layers = -(-m.num_layers // par.pipeline)
    t = par.tensor

    def split(n, replicated=0):
        return (n - replicated) / t + replicated

    body = layers * split(per_layer, layer_norms)
    if par.pipeline == 1:
        stage = body + split(embed) + split(head) - (split(m.vocab_size * m.hidden_size) if m.tie_embeddings else 0)
    else:
        stage = max(body + split(embed), body + split(head))
    return stage / total


def memory(cfg, counts, ex: Explain) -> dict:
    m, t, par, hw = cfg.model, cfg.train, cfg.parallel, cfg.hardware
    dp = par.gpus // (par.tensor * par.pipeline)
    mixed = t.precision.endswith("-mixed")
    st = model_state_tensors(cfg)
    zero = par.zero_stage if dp > 1 else 0

    weights = st["working_copies"] + (0 if mixed else st["parameters"])
    optimizer = st["optimizer_states"] + (st["parameters"] if mixed else 0)
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
           + (f" (sharded over {dp})" if zero >= 1 else ""))

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
           f"{act['layers']} layers x {act['in_flight']} micro-batch(es) in flight x {act['per_layer']:,}"
           + (f" + one recomputed block {act['recompute_working']:,}" if act["recompute_working"] else "")
           + f" + embedding/final norm/loss {act['once']:,}")

    buffers, why = _buffers(cfg, st, gradients, zero)
    ex.add("memory", "buffers", gib(buffers), why)
    on_gpu = gpu_spec(hw.gpu).name != "cpu"
    context = int(hw.cuda_context_gb * 1e9) if on_gpu else 0
    ex.add("memory", "cuda_context", gib(context), f"hardware.cuda_context_gb {hw.cuda_context_gb} x 1e9"
           if on_gpu else "none on a CPU")

    host_offload = 0
    if par.offload in ("optimizer", "optimizer+params"):
        host_offload += optimizer
        optimizer = 0
    if par.offload == "optimizer+params":
        host_offload += weights - st["working_copies"]
        weights = st["working_copies"]
    total = weights + gradients + optimizer + act["total"] + buffers + context
    ex.add("memory", "total", gib(total), "weights + gradients + optimizer + activations + buffers + cuda_context")

    # The trainer builds the model on the GPU (FSDP: on the meta device, then each rank its shard), so host
    # memory holds only offloaded states, and a whole imported checkpoint while model.init_from is read.
    procs = min(par.gpus, par.gpus_per_node)
    init = 4 * counts.total if m.init_from else 0
    host = procs * (host_offload + init)
    ex.add("memory", "host", gib(host), f"{procs} processes per node x (offloaded states {host_offload:,}"
           + (f" + the model.init_from checkpoint read in fp32 {init:,})" if init else ")"))

    device = device_memory_bytes(hw)
    result = dict(weights=weights, gradients=gradients, optimizer=optimizer, activations=act["total"],
                  buffers=buffers, cuda_context=context, total=total, host=host)
    fit = dict(device_bytes=device, usable_bytes=None, fits=None, max_micro_batch_size=None)
    if device is not None:
        usable = int(device * (1 - hw.fragmentation))
        fit.update(usable_bytes=usable, fits=total <= usable)
        fixed = total - act["total"] - _loss_buffer(cfg, t.micro_batch_size)
        fit["max_micro_batch_size"] = _max_micro_batch(cfg, fixed, usable)
        ex.add("memory", "fits", fit["fits"], f"total {gib(total)} <= {gib(device)} x (1 - fragmentation "
               f"{hw.fragmentation}) = {gib(usable)}")
        ex.add("memory", "max_micro_batch_size", fit["max_micro_batch_size"],
               "largest train.micro_batch_size whose total fits")
    tensors = {k: st[k] for k in ("parameters", "gradients", "optimizer_states", "working_copies")}
    return dict(memory_bytes=result, model_states=tensors, fit=fit, activation_detail=act)


def _loss_working_set(cfg, b: int) -> tuple[int, str]:
    """The loss's transient working set on top of what it keeps (pretrain.plan.activations.loss_terms):
    bytes and the formula."""
    par = cfg.parallel
    transient = loss_terms(cfg.model, cfg.train, par, b)["transient"]
    nbytes = sum(x.bytes // par.tensor if (x.sharded or par.sequence_parallel) else x.bytes for x in transient)
    return nbytes, " + ".join(f"{x.name} ({x.formula})" for x in transient)


def _loss_buffer(cfg, b: int) -> int:
    return _loss_working_set(cfg, b)[0]


def _buffers(cfg, st, gradients: int, zero: int) -> tuple[int, str]:
    dp = cfg.parallel.gpus // (cfg.parallel.tensor * cfg.parallel.pipeline)
    loss, formula = _loss_working_set(cfg, cfg.train.micro_batch_size)
    t = cfg.parallel.tensor
    parts, why = [loss], [f"{cfg.train.loss} loss working set {loss:,}: {formula}"
                          + (f", V terms / tensor {t}" if t > 1 else "")]
    if dp > 1 and zero <= 1:
        parts.append(gradients)
        why.append(f"DDP gradient buckets {gradients:,} (a fused copy of the gradients)")
    elif dp > 1:
        rs = 4 * st["per_layer_params"]
        parts.append(rs)
        why.append(f"FSDP reduce-scatter of one block's fp32 gradients {rs:,} (4 x {st['per_layer_params']:,} "
                   + ("parameters per tensor rank)" if t > 1 else "parameters)"))
    return sum(parts), " + ".join(why)


def _max_micro_batch(cfg, fixed: int, usable: int) -> int:
    def need(b):
        act = activation_bytes(cfg.model, cfg.train, cfg.parallel, b, native_gqa=planned_native_gqa(cfg))
        return fixed + act["total"] + _loss_buffer(cfg, b)

    if need(1) > usable:
        return 0
    lo, hi = 1, 2
    while need(hi) <= usable:  # ends: every sequence adds its token ids and logits, so need grows with b
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(mid) <= usable else (lo, mid)
    return lo
