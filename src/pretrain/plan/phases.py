"""The four phases of an optimizer step and what each holds on the device (pretrain.plan.memory takes the
peak over them): the end of forward with the loss, the loss's backward, the blocks' backward at its largest
moment, and the optimizer step. Each part is counted as our trainer holds it: which gradients exist when, what
recomputation makes again, the loss's working sets, DDP's buckets, FSDP's reduce-scatter."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..gpus import caches_weight_casts, gpu_spec, mixed_precision
from .activation_terms import rank_bytes, residual_bytes
from .activations import activation_bytes
from .kernels import planned_document_kernel, planned_fused_norm, planned_native_gqa
from .loss_terms import loss_terms
from .model_states import numel, stage_share
from .params import param_shapes

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig

PHASES = ("forward", "loss_backward", "backward", "optimizer_step")
# Once-per-micro-batch tensors kept until the embedding's backward, the very last; the final norm's, the output
# layer's and the loss's are gone before the blocks' backward runs.
EMBEDDING_SIDE = ("token ids", "target ids", "position ids", "rotary tables", "embedding dropout mask")


def resident(cfg: ResolvedConfig, st: dict[str, Any]) -> tuple[int, int, int]:
    """(parameters outside the working copies, optimizer states with autocast's fp32 master weights, the bytes
    of both offloaded to the host): on the GPU from start to end of every step."""
    mixed = mixed_precision(cfg.train.precision)
    params = 0 if mixed else st["parameters"]  # autocast: the fp32 parameters are the master weights
    optimizer = st["optimizer_states"] + (st["parameters"] if mixed else 0)
    host = 0
    if cfg.parallel.offload in ("optimizer", "optimizer+params"):
        host, optimizer = optimizer, 0
    if cfg.parallel.offload == "optimizer+params":
        host, params = host + params, 0
    return params, optimizer, host


def cuda_context(cfg: ResolvedConfig) -> int:
    return int(cfg.hardware.cuda_context_gb * 1e9) if gpu_spec(cfg.hardware.gpu).name != "cpu" else 0


# NCCL's buffers, outside PyTorch's allocator, from each communicator's first collective to the end of the run.
# A ring channel connects each rank to the next; every connection has a FIFO per protocol: LL 512 KiB, LL128
# 4,915,200 bytes and Simple NCCL_BUFFSIZE 4 MiB (DEFAULT_*_BUFFSIZE in NCCL's src/init.cc), 9.19 MiB that
# NCCL maps as one 10 MiB allocation (its 2 MiB granularity: the 10,485,760-byte ALLOC lines in
# NVIDIA/nccl#1685), one connection's set per rank and channel. NCCL opens up to 32 channels between NVLink'd
# H100s (#1685's log), and memory is linear in channels with a ring's two connections whatever the scale
# (NVIDIA/nccl#986, #1450). Trees between nodes, NVLS and the pipeline's send/recv add some more: not counted.
NCCL_CHANNELS = 32
NCCL_CONNECTION_BYTES = 10 * 2**20


def nccl_buffers(cfg: ResolvedConfig) -> tuple[int, str]:
    """NCCL's buffers per GPU: 0 on one GPU or a CPU (gloo). One communicator for the whole job (the default
    process group: DDP's gradients, the loss's all-reduce, barriers), and one per mesh dimension of more than
    one rank when the trainer builds a DeviceMesh (tensor or pipeline parallelism, FSDP)."""
    par = cfg.parallel
    if par.gpus == 1 or gpu_spec(cfg.hardware.gpu).name == "cpu":
        return 0, ""
    groups = ["the job's"]
    if par.tensor > 1 or par.pipeline > 1 or par.fsdp:
        sizes = {"data": par.data_parallel, "tensor": par.tensor, "pipeline": par.pipeline}
        groups += [f"{name} parallel {n}" for name, n in sizes.items() if n > 1]
    per = NCCL_CHANNELS * NCCL_CONNECTION_BYTES
    return len(groups) * per, (
        f"NCCL buffers of {len(groups)} communicator(s) ({', '.join(groups)}) x "
        f"{NCCL_CHANNELS} ring channels x 10 MiB (LL + LL128 + Simple NCCL_BUFFSIZE FIFOs)"
    )


def held_gradients(cfg: ResolvedConfig, st: dict[str, Any]) -> tuple[int, str]:
    """Gradients alive while a micro-batch's forward runs. The trainer frees them after each optimizer step
    (`zero_grad(set_to_none=True)`), so with one micro-batch they do not exist yet at the activation peak."""
    t, par = cfg.train, cfg.parallel
    if par.data_parallel > 1 and par.zero_stage <= 1:
        return 0, "none beside DDP's gradient buckets, which are the gradients and counted in every phase"
    if t.grad_accum_steps == 1:
        return 0, ("none: train.grad_accum_steps=1, the gradients appear in backward and the optimizer step frees them")
    if cfg.parallel.fsdp and par.grad_sync == "step":
        n = _unsharded_gradients(cfg)
        return n, (
            f"FSDP without reduce-scatter between micro-batches (parallel.grad_sync=step) holds every "
            f"gradient unsharded in its reduce dtype: {n:,}"
        )
    return st["gradients"], f"the earlier micro-batches' accumulated gradients {st['gradients']:,}"


def _unsharded_gradients(cfg: ResolvedConfig, block_and_root: bool = False) -> int:
    """Unsharded gradients FSDP2 accumulates without gradient sync: fp32 (its reduce dtype under mixed
    precision), bf16 for pure bf16. `block_and_root`: only the model's first block's and the root's, which in
    the last micro-batch's backward are not yet reduce-scattered when that block, the last to run, does its
    backward."""
    shapes = param_shapes(cfg.model)
    n = sum(
        numel(s)
        for name, s in shapes
        if not block_and_root or not name.startswith("blocks.") or name.startswith("blocks.0.")
    )
    if cfg.parallel.tensor * cfg.parallel.pipeline > 1:
        n = int(n * stage_share(cfg))
    return (2 if cfg.train.precision == "bf16" else 4) * n


def _backward_copies(cfg: ResolvedConfig, st: dict[str, Any]) -> int:
    """Working copies alive while the last block the backward pass runs (the model's first) does its backward."""
    if cfg.parallel.fsdp:
        return st["working_copies"]  # FSDP's gathered parameters: counted as in forward (an upper bound)
    if caches_weight_casts(cfg.train, cfg.parallel):  # held by the cast cache to the step's end: counted apart
        return 0
    if mixed_precision(cfg.train.precision):  # the other blocks' casts went with their saved tensors
        matmul = sum(numel(s) for n, s in param_shapes(cfg.model) if n.startswith("blocks.0.") and len(s) == 2)
        return 2 * matmul // cfg.parallel.tensor
    return 0


def _backward_activations(cfg: ResolvedConfig, act: dict[str, Any], b: int, first: bool) -> int:
    """Activations alive while one block runs its backward, with the gradient flowing down the residual
    stream into and out of it and the embedding's inputs (the final norm's, output layer's and loss's are
    gone). `first`: the first block backward runs (the model's last), every block's tensors still alive and
    its own recomputed ones beside them; else the last it runs (the model's first), one block's left (and the
    other micro-batches' in flight under a pipeline)."""
    m, t, par = cfg.model, cfg.train, cfg.parallel
    tp, sp = par.tensor, par.sequence_parallel
    held = act["in_flight"] * act["layers"] - (0 if first else act["layers"] - 1)
    blocks = held * act["per_layer"] + act["recompute_working"]
    embedding = rank_bytes([x for x in act["once_terms"] if x.name.startswith(EMBEDDING_SIDE)], tp, sp)
    residual = 2 * residual_bytes(t, par) * b * t.seq_len * m.hidden_size
    return blocks + embedding + residual // (tp if sp else 1)


def step_phases(
    cfg: ResolvedConfig, st: dict[str, Any], b: int, compiled: bool = False
) -> dict[str, list[tuple[str, int]]]:
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
    context are alive in all four. Recomputed tensors exist only in backward: not in the first two.
    compiled: the blocks' activations as torch.compile keeps them (pretrain.plan.activations), the rest as in
    eager mode."""
    t, par = cfg.train, cfg.parallel
    act = activation_bytes(
        cfg.model,
        t,
        par,
        b,
        native_gqa=planned_native_gqa(cfg),
        compiled=compiled,
        imbalance=cfg.plan.routing_imbalance,
        documents=planned_document_kernel(cfg, compiled),
        fused_norm=planned_fused_norm(cfg),
    )
    always, st = _alive_in_every_phase(cfg, st)
    held, _ = held_gradients(cfg, st)
    held_name = "unsharded gradients" if cfg.parallel.fsdp and par.grad_sync == "step" else "gradients"
    copies = ("working copies", st["working_copies"])
    forward_act = ("activations", act["total"] - act["recompute_working"])
    checkpoints = ("checkpoints' CPU generator states", _checkpoint_rng_states(cfg, act, compiled))
    gradients = st["gradients"]
    if cfg.parallel.fsdp and par.grad_sync == "step" and t.grad_accum_steps > 1:
        gradients += _unsharded_gradients(cfg, block_and_root=True)
    first = [
        copies,
        (held_name, max(held, _first_block_gradients(cfg, st))),
        (
            "first block backward runs: all activations, its recomputed ones, the residual gradients",
            _backward_activations(cfg, act, b, first=True),
        ),
        checkpoints,
    ]
    last = _last_block_backward(cfg, st, act, b, gradients)
    phases = {
        "forward": [copies, (held_name, held), forward_act, checkpoints, ("loss working set", _loss_buffer(cfg, b))],
        "loss_backward": [
            copies,
            (held_name, held),
            forward_act,
            checkpoints,
            ("loss backward", _loss_backward_buffer(cfg, b)),
        ],
        "backward": max(
            first, last, _tied_embedding_backward(cfg, st, gradients), key=lambda parts: sum(n for _, n in parts)
        ),
        "optimizer_step": [("gradients", st["gradients"]), (f"{t.optimizer} working memory", st["optimizer_working"])],
    }
    return {name: [p for p in always + parts if p[1]] for name, parts in phases.items()}


def _alive_in_every_phase(cfg: ResolvedConfig, st: dict[str, Any]) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """Parameters, optimizer states, DDP's gradient buckets, the CUDA context and NCCL's buffers, and `st` as
    the phases count it: where the buckets are the gradients, its gradients are 0 (counted here, once)."""
    t, par = cfg.train, cfg.parallel
    params, optimizer, _ = resident(cfg, st)
    always = [
        ("parameters", params),
        (f"{t.optimizer} states" + (" + fp32 master weights" if mixed_precision(t.precision) else ""), optimizer),
    ]
    if par.data_parallel > 1 and par.zero_stage <= 1:
        # DDP (ZeRO-1 runs on it too) allocates its gradient buckets when it wraps the model, and with
        # gradient_as_bucket_view (distributed/engines.py) the gradients are views into them: alive in
        # every phase, even before the first backward, and never a second time.
        always.append(("DDP gradient buckets (the gradients)", st["gradients"]))
        st = dict(st, gradients=0)
    always.append(("cuda_context", cuda_context(cfg)))
    always.append(("NCCL buffers", nccl_buffers(cfg)[0]))
    return always, st


def _last_block_backward(
    cfg: ResolvedConfig, st: dict[str, Any], act: dict[str, Any], b: int, gradients: int
) -> list[tuple[str, int]]:
    """The moment the last block backward runs (the model's first): the other blocks' gradients beside its
    own activations, working copies or gradients, and with FSDP the reduce-scatter of one block."""
    rest = _backward_activations(cfg, act, b, first=False)
    if cfg.parallel.fsdp:  # gradients arrive unsharded in the reduce-scatter buffer, sharded ones already counted
        return [
            ("working copies", _backward_copies(cfg, st)),
            ("gradients", gradients),
            ("last block backward runs: its activations, the residual gradients", rest),
            ("FSDP reduce-scatter", 4 * st["per_layer_params"]),
        ]
    # the block's gradients appear as its activations and working copies are freed: the larger of the two
    block = act["per_layer"] + act["recompute_working"]
    rest -= block
    block_grads = _block_gradients(cfg, st)
    cached = st["working_copies"] if caches_weight_casts(cfg.train, cfg.parallel) else 0  # train.cache_weight_casts
    return [
        ("other blocks' gradients", gradients - block_grads),
        (
            "the last block backward runs: its activations and copies, or its gradients",
            max(block + _backward_copies(cfg, st), block_grads),
        ),
        ("the residual gradients and the embedding's inputs", rest),
        ("weight-cast cache", cached),
    ]


def _tied_embedding_backward(cfg: ResolvedConfig, st: dict[str, Any], gradients: int) -> list[tuple[str, int]]:
    """The embedding's backward, the very last: a tied embedding's gradient is made as a new V x H tensor and
    then added to the output layer's, which is already there (an untied one is its first gradient)."""
    if not cfg.model.tie_embeddings or cfg.parallel.fsdp:
        return []
    shapes = dict(param_shapes(cfg.model))
    total = sum(numel(s) for s in shapes.values())
    embedding = st["gradients"] * numel(shapes["embed.weight"]) // total
    return [("gradients", gradients), ("the tied embedding's new gradient", embedding)]


def _block_gradients(cfg: ResolvedConfig, st: dict[str, Any]) -> int:
    """One block's share of the gradients."""
    shapes = param_shapes(cfg.model)
    total = sum(numel(s) for _, s in shapes)
    return st["gradients"] * sum(numel(s) for n, s in shapes if n.startswith("blocks.0.")) // total


# torch.utils.checkpoint keeps the CPU generator's state (torch.get_rng_state(): 5,056 bytes of Mersenne
# Twister) for every checkpointed call until its backward, to replay dropout exactly; on a GPU in host memory.
CPU_RNG_STATE_BYTES = 5056


def _checkpoint_rng_states(cfg: ResolvedConfig, act: dict[str, Any], compiled: bool) -> int:
    """CPU plans only: the generator states recomputation keeps, one per checkpointed block call. A compiled
    block keeps one with full recomputation and none with selective, whose recomputation the partitioner
    moves into the backward graph (measured with saved_tensors_hooks, torch 2.13)."""
    calls = {"none": 0, "selective": 0 if compiled else 1, "full": 1}[cfg.train.activation_checkpointing]
    if gpu_spec(cfg.hardware.gpu).name != "cpu":
        return 0
    return CPU_RNG_STATE_BYTES * calls * act["layers"] * act["in_flight"]


def _first_block_gradients(cfg: ResolvedConfig, st: dict[str, Any]) -> int:
    """Gradients made by the end of the first block's backward: the output layer's, the final norm's and that
    block's own (their share of all gradients)."""
    shapes = param_shapes(cfg.model)
    total = sum(numel(s) for _, s in shapes)
    top = f"blocks.{cfg.model.num_layers - 1}."
    made = sum(
        numel(s)
        for n, s in shapes
        if n.startswith(("norm.", "lm_head.", top)) or (n == "embed.weight" and cfg.model.tie_embeddings)
    )
    return st["gradients"] * made // total


def loss_part(cfg: ResolvedConfig, b: int, when: str) -> tuple[int, str]:
    """What the loss holds beside what it keeps (pretrain.plan.loss_terms), `when` "forward" (at
    its end) or "backward" (while the loss's backward runs): bytes and the formula."""
    par = cfg.parallel
    terms = loss_terms(cfg.model, cfg.train, par, b)[when]
    return rank_bytes(terms, par.tensor, par.sequence_parallel), " + ".join(f"{x.name} ({x.formula})" for x in terms)


def _loss_buffer(cfg: ResolvedConfig, b: int) -> int:
    """The loss's working set at the end of forward: the plain loss's logits in the compute dtype and in
    fp32, or the chunked loss's last chunk (its gradients, made in forward, are kept: activations)."""
    return loss_part(cfg, b, "forward")[0]


def _loss_backward_buffer(cfg: ResolvedConfig, b: int) -> int:
    """The loss's backward at its largest: the plain loss's fp32 gradients of the log-softmax and the logits
    beside the kept log-softmax (12 x b*s*V in all); the chunked one only scales the gradients it kept."""
    return loss_part(cfg, b, "backward")[0]
