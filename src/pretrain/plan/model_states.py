"""The model-state tensors one GPU holds, tensor by tensor, as the trainer holds them: parameters, gradients,
optimizer states (ZeRO-1's partition as ZeroRedundancyOptimizer makes it, FSDP2's padded shards), working
copies; a tensor rank's part of each parameter and a pipeline stage's own layers. memory.py adds activations,
buffers and the phases of a step around it; `debug.check_sharding` holds each rank to it."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

from ..config.schema import ResolvedConfig
from ..gpus import caches_weight_casts, gpu_spec, mixed_precision
from . import fp8, muon
from .optimizer_groups import optimizer_groups
from .params import numel, padded_vocab_size, param_shapes
from .stages import chunks_per_stage, param_stages, stage_param_shapes

if TYPE_CHECKING:
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


def _shard_numel(shape: tuple[int, ...], dp: int, dim: int = 0) -> int:
    """FSDP2 shards dim 0 (or `dim`) in chunks of ceil(d / dp), each rank's padded to a full chunk."""
    return -(-shape[dim] // dp) * numel(shape) // shape[dim] if shape[dim] else 0


def expert_shard_dim(experts_here: int, ranks: int) -> int:
    """The dimension FSDP2 shards a rank's stacked expert tensors [E/ep, ...] on over the `ranks` that hold the
    same experts: 0 while they are at most the experts held (each rank whole experts), else 1 (torchtitan's
    shard_placement_fn for experts): on dim 0 the ranks past E/ep would each hold a whole expert's padding or
    copy, so Mixtral's 8 experts at 64 data ranks would leave every rank a whole expert's states."""
    return 1 if ranks > experts_here else 0


def _state_numel(optimizer: str, name: str, shape: tuple[int, ...], momentum: float) -> int:
    """Elements of optimizer state for one parameter tensor (the fp32 step counter is added separately)."""
    if optimizer == "adamw":
        return 2 * numel(shape)  # exp_avg, exp_avg_sq
    if optimizer == "sgd":
        return numel(shape) if momentum else 0
    if optimizer == "muon":
        return muon.state_numel(name, shape)
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


class _ZeroShard:
    """Over which ranks ZeRO shards each tensor a rank holds, this rank's place among them, and the dimension.
    Dense tensors: the data-parallel ranks. Routed experts: the expert-data-parallel ranks, those holding the
    same experts (ParallelConfig.expert_pool / expert; the expert mesh numbers them with the expert-parallel
    group fastest, as distributed/expert_parallel.py builds it), on dim 1 past the experts they hold
    (`expert_shard_dim`). With whole experts under tensor parallelism the MoE layer is data-parallel over the
    data x tensor ranks, so its router and shared experts are sharded over all of them."""

    def __init__(self, cfg: ResolvedConfig, data_rank: int, tensor_rank: int):
        par = cfg.parallel
        self.dp, self.ep, self.edp, self.pool = par.data_parallel, par.expert, par.expert_data_parallel, par.expert_pool
        self.folded = cfg.model.num_experts > 0 and par.tensor > 1 and par.expert_tensor == 1
        self.data_rank = data_rank
        # this rank's place among the ranks an expert-parallel group is taken from (the tensor dimension fastest)
        self.pool_rank = data_rank * par.tensor + tensor_rank if self.folded else data_rank

    def group(self, name: str) -> int:
        if is_expert(name):
            return self.edp
        return self.pool if self.folded and is_moe_dense(name) else self.dp

    def place(self, name: str) -> int:
        if is_expert(name):
            return self.pool_rank // self.ep
        return self.pool_rank if self.folded and is_moe_dense(name) else self.data_rank

    def dim(self, name: str, shape: tuple[int, ...]) -> int:
        return expert_shard_dim(shape[0], self.edp) if is_expert(name) else 0


def model_state_tensors(
    cfg: ResolvedConfig, rank: int | None = None, stage: int | None = None, tensor_rank: int = 0
) -> dict[str, Any]:
    """Bytes of the tensors one GPU holds between steps and in flight: parameters, gradients, optimizer
    states, and working copies (half-precision or gathered parameters); `stage` names the stage counted.
    `rank`: that data-parallel rank's share (ranks differ under ZeRO-1 and uneven FSDP chunks), at tensor rank
    `tensor_rank` (an MoE layer's ranks span both); by default the largest share (what must fit). `stage`: that
    pipeline stage's parameters (pretrain.plan.stages); by default the heaviest stage's. A rank holds its
    stage's parameters, each its tensor rank's part (FSDP2 then shards that part over the data ranks), as the
    trainer holds them in every layout."""
    m, t, par = cfg.model, cfg.train, cfg.parallel
    dp, ep = par.data_parallel, par.expert
    whole = param_shapes(m)
    stage = (heaviest_stage(cfg) if par.pipeline > 1 else 0) if stage is None else stage
    shapes = [
        (n, tensor_parallel_shape(n, s, par.tensor))
        for n, s in stage_param_shapes(m, stage, par.pipeline, chunks_per_stage(par))
    ]
    if ep > 1 or par.expert_tensor > 1:  # each rank holds E / ep of the routed experts, each split etp ways
        whole, shapes = (
            [(n, expert_parallel_shape(n, s, ep, par.expert_tensor)) for n, s in x] for x in (whole, shapes)
        )
    # One block's and the root's tensors as this rank holds them (a stage's list may lack block 0).
    block_shapes = whole if par.pipeline > 1 else shapes
    mixed = mixed_precision(t.precision)
    param_bytes = 2 if t.precision == "bf16" else 4
    grad_bytes = 2 if (t.precision == "bf16" or (mixed and t.grad_dtype == "same")) else 4
    state_bytes = param_bytes  # PyTorch optimizers keep states in the parameter dtype
    zero = par.zero_stage if dp > 1 else 0
    sharded = zero >= 2  # FSDP2 shards parameters, gradients and states
    shard = _ZeroShard(cfg, rank or 0, tensor_rank)

    n_params = sum(_shard_numel(s, shard.group(n), shard.dim(n, s)) if sharded else numel(s) for n, s in shapes)
    owned = list(range(len(shapes)))
    if zero == 1:  # each rank owns its share of the dense tensors (over dp) and of its experts' (over edp)
        owned = _zero1_owned(cfg, shapes, rank)
    kept = [(n, _shape_for(s, shard.group(n), sharded, shard.place(n), shard.dim(n, s))) for n, s in shapes]
    n_states = sum(_state_numel(t.optimizer, *kept[i], t.momentum) for i in owned)
    steps = 4 * len(owned) if _has_step(t.optimizer) else 0
    load = (
        muon.step_load(cfg, [shapes[i] for i in owned], dict(whole), shard, sharded) if t.optimizer == "muon" else None
    )
    if load:  # AdamW's step counters for its tensors only
        steps = 4 * load["adamw_tensors"]

    copies = _working_copies(cfg, shapes, whole, block_shapes, zero)
    out: dict[str, Any] = dict(
        parameters=param_bytes * n_params,
        gradients=grad_bytes * n_params,
        optimizer_states=state_bytes * n_states + steps,
        working_copies=copies,
        optimizer_working=load["working_bytes"]
        if load
        else _optimizer_working(cfg, shapes, owned, shard, sharded, state_bytes),
        per_layer_params=_block_share(cfg, whole),
        stage=stage,
    )
    if load:
        out["muon"] = load
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
        held = layers_kept * layer_matmul
        if not recomputed and par.pipeline == 1:  # each block its own (an MoE model's dense first ones hold fewer)
            held = sum(
                numel(s) for n, s in shapes if n.startswith("blocks.") and _is_cast(n, s, caches_weight_casts(t, par))
            )
        copies = 2 * (held - layers_kept * converted + output_matmul) // (par.tensor if par.pipeline > 1 else 1)
    else:
        copies = 0
    return copies


def is_expert(name: str) -> bool:
    """A routed experts' stacked tensor (pretrain.plan.params): split over the expert-parallel group."""
    return ".mlp.experts." in name


def is_moe_dense(name: str) -> bool:
    """An MoE layer's tensor that every rank of it holds whole: its router and its shared experts."""
    return ".mlp.router." in name or ".mlp.shared." in name


def expert_parallel_shape(name: str, shape: tuple[Any, ...], ep: int, etp: int = 1) -> tuple[Any, ...]:
    """The part of a parameter one expert-parallel rank holds: E / ep of the routed experts, each split over
    etp tensor ranks as the dense MLP is (up [E, 2 H_e, H] by rows, down [E, H, H_e] by columns, the biases
    with them), the rest whole."""
    if not is_expert(name):
        return tuple(shape)
    rest = list(shape[1:])
    if etp > 1:
        split = 0 if name.endswith((".up", ".up_bias")) else len(rest) - 1  # down_bias [E, H] is not split
        if not name.endswith(".down_bias"):
            rest[split] //= etp
    return (shape[0] // ep, *rest)


def _zero1_owned(cfg: ResolvedConfig, shapes: list[tuple[str, tuple[int, ...]]], rank: int | None) -> list[int]:
    """The tensors whose optimizer states one rank keeps under ZeRO-1 (`rank`; None: the largest share). With
    expert parallelism the experts' tensors are partitioned apart, over the `edp` ranks that hold the same
    experts (the largest shares of both parts added: an upper bound)."""
    m, par, owned = cfg.model, cfg.parallel, list[int]()
    dp, edp, ep = par.data_parallel, par.expert_data_parallel, par.expert
    for experts, ranks in ((False, dp), (True, edp)) if ep > 1 else ((None, dp),):
        ix = [i for i, (n, _) in enumerate(shapes) if experts is None or is_expert(n) == experts]
        part = [shapes[i] for i in ix]
        partition = zero1_partition(part, ranks, optimizer_groups(cfg.train.optimizer, m, part))
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
        return not matmul or _is_cast(n, s, biases)

    return max(sum(numel(s) for n, s in shapes if n.startswith(kind) and counted(n, s)) for kind in _block_kinds(m))


def _is_cast(name: str, shape: tuple[int, ...], biases: bool) -> bool:
    """A tensor autocast keeps a cast of: a matmul weight (2-D, or MoE's 3-D stacked experts), and with the cast
    cache (`biases`) a linear's bias."""
    return len(shape) >= 2 or (biases and name.endswith(".bias") and not name.endswith("norm.bias"))


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
    shard: _ZeroShard,
    sharded: bool,
    state_bytes: int,
) -> int:
    """Temporaries of the optimizer step. AdamW is fused (distributed/optim.py): one in-place kernel, none. SGD's
    momentum update is in place. Adafactor's foreach implementation, the default on CUDA, makes a full-size
    second-moment estimate of every parameter it updates (torch.optim.Adafactor's docs: "~ sizeof(params) more
    peak memory"); on a CPU, one tensor at a time."""
    if cfg.train.optimizer != "adafactor":
        return 0
    sizes = [numel(_shape_for(s, shard.group(n), sharded, 0, shard.dim(n, s))) for n, s in (shapes[i] for i in owned)]
    if gpu_spec(cfg.hardware.gpu).name == "cpu":
        return state_bytes * max(sizes, default=0)
    return state_bytes * sum(sizes)


def _shape_for(shape: tuple[int, ...], dp: int, sharded: bool, rank: int = 0, dim: int = 0) -> tuple[int, ...]:
    """A rank's unpadded share of a tensor under FSDP (optimizer states are made like the local shard)."""
    if not sharded:
        return shape
    chunk = -(-shape[dim] // dp)
    own = max(0, min(chunk, shape[dim] - rank * chunk))
    return tuple(own if i == dim else d for i, d in enumerate(shape))


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
