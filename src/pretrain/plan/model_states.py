"""The model-state tensors one GPU holds, tensor by tensor, as the trainer holds them: parameters, gradients,
optimizer states (ZeRO-1's partition as ZeroRedundancyOptimizer makes it, FSDP2's padded shards), working
copies; a tensor rank's part of each parameter and a pipeline stage's own layers. memory.py adds activations,
buffers and the phases of a step around it; `debug.check_sharding` holds each rank to it."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

from ..config.schema import ResolvedConfig
from ..gpus import caches_weight_casts, gpu_spec, mixed_precision
from . import fp8
from .params import numel, padded_vocab_size, param_shapes
from .stages import chunks_per_stage, param_stages, stage_param_shapes

if TYPE_CHECKING:
    from ..config.model_section import ModelConfig
    from ..config.schema import ResolvedModelConfig

# Tensor parallelism as the trainer splits the model (distributed/tensor_parallel.py): the q/k/v and MLP up (gate
# and up) projections, the embedding and the output layer by rows (output features; vocabulary), the attention
# output and MLP down projections by columns (input features).
COLUMN_PARALLEL = (
    ".attn.qkv.weight",
    ".attn.qkv.bias",
    ".mlp.up.weight",
    ".mlp.up.bias",
    "embed.weight",
    "lm_head.weight",
)
Shapes = list[tuple[str, tuple[int, ...]]]  # (name, shape) of each parameter tensor, in module order
ROW_PARALLEL = (".attn.proj.weight", ".mlp.down.weight")


def tensor_parallel_shape(name: str, shape: tuple[Any, ...], tp: int) -> tuple[Any, ...]:
    """The part of parameter `name` one tensor rank holds (the trainer needs every split dimension to be a
    multiple of t). The rest is replicated on every tensor rank: the norms, the row-parallel biases."""
    if tp > 1 and name.endswith(COLUMN_PARALLEL) and not name.startswith("pos_embed"):
        return (shape[0] // tp,) + tuple(shape[1:])
    if tp > 1 and name.endswith(ROW_PARALLEL):
        return tuple(shape[:-1]) + (shape[-1] // tp,)
    return tuple(shape)


def _shard_numel(shape: tuple[int, ...], dp: int) -> int:
    """FSDP2 shards dim 0 in chunks of ceil(d0 / dp); rank 0 holds a full chunk (the largest share)."""
    return -(-shape[0] // dp) * numel(shape[1:])


def _state_numel(optimizer: str, shape: tuple[int, ...], momentum: float) -> int:
    """Elements of optimizer state for one parameter tensor (the fp32 step counter is added separately)."""
    if optimizer == "adamw":
        return 2 * numel(shape)  # exp_avg, exp_avg_sq
    if optimizer == "sgd":
        return numel(shape) if momentum else 0
    # Adafactor (torch.optim.Adafactor): a row and a column second-moment vector per matrix, full for vectors.
    if len(shape) >= 2:
        return numel(shape[:-1]) + numel(shape[:-2]) * shape[-1]
    return numel(shape)


def zero_paper_bytes(psi: float, stage: int, dp: int, grad_bytes: int = 2, k: int = 12) -> float:
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


def zero1_partition(shapes: list[Any], dp: int, groups: list[list[int]]) -> list[list[int]]:
    """Which parameter indices each rank owns under ZeroRedundancyOptimizer: group by group, largest tensors
    first, each to the rank with the fewest elements so far over all groups (torch's `_partition_parameters`
    keeps one count across the groups), the lowest such rank on a tie. A heap of (elements, rank) picks the
    same rank; ranks past the number of tensors own nothing and are left out of the list, so a huge
    data-parallel degree costs nothing."""
    owned: list[list[int]] = [[] for _ in range(min(dp, len(shapes)))]
    heap = [(0, r) for r in range(len(owned))]  # an unused rank beyond these is never the lowest
    for group in groups:
        for i in sorted(group, key=lambda j: numel(shapes[j][1]), reverse=True):
            size, rank = heapq.heappop(heap)
            owned[rank].append(i)
            heapq.heappush(heap, (size + numel(shapes[i][1]), rank))
    return owned


def decay_groups(m: ModelConfig, shapes: list[Any]) -> list[list[int]]:
    """AdamW's two parameter groups: [with weight decay (matrices), without (norms, biases, tied embedding)]."""
    decay: list[int] = []
    no_decay: list[int] = []
    for i, (name, shape) in enumerate(shapes):
        tied_embedding = m.tie_embeddings and name == "embed.weight"
        (decay if len(shape) >= 2 and not tied_embedding else no_decay).append(i)
    return [g for g in (decay, no_decay) if g]


def model_state_tensors(cfg: ResolvedConfig, rank: int | None = None, stage: int | None = None) -> dict[str, Any]:
    """Bytes of the tensors one GPU holds between steps and in flight: parameters, gradients, optimizer
    states, and working copies (half-precision or gathered parameters); `stage` names the stage counted.
    `rank`: that data-parallel rank's share (ranks differ under ZeRO-1 and uneven FSDP chunks); by default
    the largest share (what must fit). `stage`: that pipeline stage's parameters (pretrain.plan.stages); by
    default the heaviest stage's. A rank holds its stage's parameters, each its tensor rank's part (FSDP2
    then shards that part over the data ranks), as the trainer holds them in every layout."""
    m, t, par = cfg.model, cfg.train, cfg.parallel
    dp, ep = par.data_parallel, par.expert
    whole = param_shapes(m)
    stage = (heaviest_stage(cfg) if par.pipeline > 1 else 0) if stage is None else stage
    shapes = [
        (n, tensor_parallel_shape(n, s, par.tensor))
        for n, s in stage_param_shapes(m, stage, par.pipeline, chunks_per_stage(par))
    ]
    if ep > 1:  # each rank holds E / ep of the routed experts
        whole, shapes = ([(n, expert_parallel_shape(n, s, ep)) for n, s in x] for x in (whole, shapes))
    # One block's and the root's tensors as this rank holds them (a stage's list may lack block 0).
    block_shapes = whole if par.pipeline > 1 else shapes
    mixed = mixed_precision(t.precision)
    param_bytes = 2 if t.precision == "bf16" else 4
    grad_bytes = 2 if (t.precision == "bf16" or (mixed and t.grad_dtype == "same")) else 4
    state_bytes = param_bytes  # PyTorch optimizers keep states in the parameter dtype
    zero = par.zero_stage if dp > 1 else 0
    sharded = zero >= 2  # FSDP2 shards parameters, gradients and states

    def group(name: str) -> int:  # the ranks ZeRO shards a tensor over: an expert's are the dp / ep that hold it
        return dp // ep if ep > 1 and is_expert(name) else dp

    def place(name: str) -> int:  # this rank's place in that group (data ranks r, r + ep, ... hold the same experts)
        return (rank or 0) // ep if ep > 1 and is_expert(name) else rank or 0

    n_params = sum(_shard_numel(s, group(n)) if sharded else numel(s) for n, s in shapes)  # FSDP pads chunks
    owned = list(range(len(shapes)))
    if zero == 1:  # each rank owns its share of the dense tensors (over dp) and of its experts' (over dp / ep)
        owned = _zero1_owned(m, shapes, dp, ep, rank)
    n_states = sum(
        _state_numel(t.optimizer, _shape_for(s, group(n), sharded, place(n)), t.momentum)
        for n, s in (shapes[i] for i in owned)
    )
    steps = 4 * len(owned) if _has_step(t.optimizer) else 0

    copies = _working_copies(cfg, shapes, whole, block_shapes, zero)
    out = dict(
        parameters=param_bytes * n_params,
        gradients=grad_bytes * n_params,
        optimizer_states=state_bytes * n_states + steps,
        working_copies=copies,
        optimizer_working=_optimizer_working(cfg, shapes, owned, dp, sharded, state_bytes),
        per_layer_params=_block_share(cfg, whole),
        stage=stage,
    )
    return out


def _working_copies(
    cfg: ResolvedConfig, shapes: list[tuple[str, tuple[int, ...]]], whole: Shapes, block_shapes: Shapes, zero: int
) -> int:
    """Bytes of the parameters' compute-dtype copies a rank holds: FSDP's gathered blocks (ZeRO 2/3) or
    autocast's copies of the matmul weights kept for backward."""
    m, t, par = cfg.model, cfg.train, cfg.parallel
    mixed = mixed_precision(t.precision)
    per_layer = _heaviest_block(m, block_shapes)
    root = sum(numel(s) for n, s in block_shapes if not n.startswith("blocks."))
    # Matmul weights (biases are added, not multiplied: autocast's cast of a bias is not kept); MoE's stacked
    # experts are 3-D, each grouped GEMM keeping its cast too.
    layer_matmul = _heaviest_block(m, block_shapes, matmul=True)
    if caches_weight_casts(t, par):  # the cast cache keeps the linears' bias casts too, to the step's end
        layer_matmul = _heaviest_block(m, block_shapes, matmul=True, biases=True)
    # The plain loss's output matmul keeps autocast's copy of its weight; the chunked one casts it per call.
    output_matmul = padded_vocab_size(m) * m.hidden_size if t.loss == "plain" else 0
    compute_bytes = 2 if (mixed or t.precision == "bf16") else 4
    # fp8 (plan/fp8.py): torchao keeps no autocast copy of a converted weight, and tensorwise under FSDP
    # gathers it in float8, a byte an element less than bf16.
    converted = (
        fp8.converted_numel_per_layer(cfg) // (par.tensor if par.pipeline == 1 else 1) if t.precision == "fp8" else 0
    )  # as block_shapes holds them
    gathered_saved = fp8.gathered_bytes_saved(cfg, converted) if converted else 0
    if par.pipeline > 1 and zero >= 2:
        gathered_saved = 0  # ZeRO 2/3 per pipeline stage is planned, not trained: no float8 gather counted
    if zero == 2:  # every block's parameters stay gathered from forward to backward
        layers_here = len({n.split(".")[1] for n, _ in shapes if n.startswith("blocks.")})
        copies = compute_bytes * sum(numel(s) for _, s in shapes) - layers_here * gathered_saved
    elif zero == 3 and par.pipeline > 1:  # whole blocks of this stage, not a share of the model's
        copies = int(compute_bytes * _zero3_gathered(cfg, whole))
    elif zero == 3:  # the block being computed, the prefetched next one, and the root's parameters
        copies = compute_bytes * (min(2, m.num_layers) * per_layer + root) - min(2, m.num_layers) * gathered_saved
    elif mixed:  # autocast keeps a half-precision copy of each matmul weight for backward
        layers_here = len({n.split(".")[1] for n, _ in shapes if n.startswith("blocks.")})
        # with recomputation the casts are made again: only the recomputed block's are alive; with
        # train.cache_weight_casts every block's, for the whole step
        recomputed = t.activation_checkpointing != "none" and not caches_weight_casts(t, par)
        layers_kept = 1 if recomputed else layers_here
        copies = (
            2 * (layers_kept * (layer_matmul - converted) + output_matmul) // (par.tensor if par.pipeline > 1 else 1)
        )
    else:
        copies = 0
    return copies


def is_expert(name: str) -> bool:
    """A routed experts' stacked tensor (pretrain.plan.params): split over the expert-parallel group."""
    return ".mlp.experts." in name


def expert_parallel_shape(name: str, shape: tuple[Any, ...], ep: int) -> tuple[Any, ...]:
    """The part of a parameter one expert-parallel rank holds: E / ep of the routed experts, the rest whole."""
    if ep > 1 and is_expert(name):
        return (shape[0] // ep,) + tuple(shape[1:])
    return tuple(shape)


def _zero1_owned(
    m: ResolvedModelConfig, shapes: list[tuple[str, tuple[int, ...]]], dp: int, ep: int, rank: int | None
) -> list[int]:
    """The tensors whose optimizer states one rank keeps under ZeRO-1 (`rank`; None: the largest share). With
    expert parallelism the experts' tensors are partitioned apart, over the dp / ep ranks that hold the same
    experts (the largest shares of both parts added: an upper bound)."""
    owned: list[int] = []
    for experts, ranks in ((False, dp), (True, dp // ep)) if ep > 1 else ((None, dp),):
        ix = [i for i, (n, _) in enumerate(shapes) if experts is None or is_expert(n) == experts]
        part = [shapes[i] for i in ix]
        partition = zero1_partition(part, ranks, decay_groups(m, part))
        r = None if rank is None else rank // ep if experts else rank  # its place among `ranks`
        mine = (
            (partition[r] if r < len(partition) else [])
            if r is not None
            else max(partition, key=lambda own: sum(numel(part[i][1]) for i in own), default=list[int]())
        )
        owned += [ix[i] for i in mine]
    return owned


def _block_kinds(m: ResolvedModelConfig) -> set[str]:
    """A block of each kind, by name prefix: the first, and the first MoE block after the dense ones."""
    return {"blocks.0.", f"blocks.{m.first_dense_layers if m.num_experts else 0}."}


def _heaviest_block(
    m: ResolvedModelConfig, shapes: list[tuple[str, tuple[int, ...]]], matmul: bool = False, biases: bool = False
) -> int:
    """Parameters of the largest block in `shapes` (an MoE block or a dense one; all equal in a dense model);
    `matmul`: its matrices only, `biases`: and the linears' biases (not the norms')."""

    def counted(n: str, s: tuple[int, ...]) -> bool:
        return not matmul or len(s) >= 2 or (biases and n.endswith(".bias") and not n.endswith("norm.bias"))

    return max(sum(numel(s) for n, s in shapes if n.startswith(kind) and counted(n, s)) for kind in _block_kinds(m))


def _stage_sizes(cfg: ResolvedConfig) -> list[int]:
    """Parameters of each pipeline stage on one tensor rank (the norms are whole on every one)."""
    p, t, v = cfg.parallel.pipeline, cfg.parallel.tensor, chunks_per_stage(cfg.parallel)
    shapes = param_shapes(cfg.model)
    sizes = [0] * p
    for (n, s), k in zip(shapes, param_stages(cfg.model, shapes, p, v)):
        sizes[k] += numel(tensor_parallel_shape(n, s, t))
    return sizes


def heaviest_stage(cfg: ResolvedConfig) -> int:
    """The pipeline stage with the most parameters (the first of equals): the one whose model states must fit.
    The first holds the embedding, the last the final norm and output layer, and the later stages one layer
    more when the layers do not divide evenly; counted per tensor rank."""
    sizes = _stage_sizes(cfg)
    return sizes.index(max(sizes))


def _optimizer_working(
    cfg: ResolvedConfig,
    shapes: list[tuple[str, tuple[int, ...]]],
    owned: list[int],
    dp: int,
    sharded: bool,
    state_bytes: int,
) -> int:
    """Temporaries of the optimizer step. AdamW is fused (distributed/optim.py): one in-place kernel, none. SGD's
    momentum update is in place. Adafactor's foreach implementation, the default on CUDA, makes a full-size
    second-moment estimate of every parameter it updates (torch.optim.Adafactor's docs: "~ sizeof(params) more
    peak memory"); on a CPU, one tensor at a time."""
    if cfg.train.optimizer != "adafactor":
        return 0
    sizes = [numel(_shape_for(shapes[i][1], dp, sharded)) for i in owned]
    if gpu_spec(cfg.hardware.gpu).name == "cpu":
        return state_bytes * max(sizes, default=0)
    return state_bytes * sum(sizes)


def _shape_for(shape: tuple[int, ...], dp: int, sharded: bool, rank: int = 0) -> tuple[int, ...]:
    """A rank's unpadded share of a tensor under FSDP (optimizer states are made like the local shard)."""
    if not sharded:
        return shape
    chunk = -(-shape[0] // dp)
    return (max(0, min(chunk, shape[0] - rank * chunk)),) + tuple(shape[1:])


def _block_share(cfg: ResolvedConfig, shapes: list[tuple[str, tuple[int, ...]]]) -> int:
    """Parameters of one block on one tensor rank: the matmuls split t ways, the norms replicated."""

    def share(kind: str) -> int:
        per_layer = sum(numel(s) for n, s in shapes if n.startswith(kind))
        layer_norms = sum(numel(s) for n, s in shapes if n.startswith(kind) and "norm" in n)
        return (per_layer - layer_norms) // cfg.parallel.tensor + layer_norms

    return max(share(kind) for kind in _block_kinds(cfg.model))


def _zero3_gathered(cfg: ResolvedConfig, shapes: list[tuple[str, tuple[int, ...]]]) -> float:
    """Parameters one (pipeline stage, tensor rank) holds gathered under ZeRO-3: the block being computed and
    the prefetched next one, both of this stage, and the root modules on it (the embedding on the first
    stage, the final norm and output layer on the last, all three without a pipeline), each its tensor
    rank's part."""
    m, par = cfg.model, cfg.parallel
    t = par.tensor
    embed = sum(numel(s) for n, s in shapes if n in ("embed.weight", "pos_embed.weight"))
    head = sum(numel(s) for n, s in shapes if n.startswith("norm.")) + padded_vocab_size(m) * m.hidden_size
    if par.pipeline == 1:
        root = (embed + head - (padded_vocab_size(m) * m.hidden_size if m.tie_embeddings else 0)) / t
    else:  # the heavier end (a tied output layer is a second copy on the last stage)
        root = max(embed, head) / t
    blocks = min(2, -(-m.num_layers // par.pipeline))
    return blocks * _block_share(cfg, shapes) + root


def stage_share(cfg: ResolvedConfig) -> float:
    """Fraction of all parameters on the heaviest (pipeline stage, tensor rank): the stages as the trainer
    splits them (pretrain.plan.stages), each tensor its tensor rank's part."""
    return max(_stage_sizes(cfg)) / sum(numel(s) for _, s in param_shapes(cfg.model))
