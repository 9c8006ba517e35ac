"""The routed Mixture-of-Experts feed-forward of the LLaMA family (Mixtral, Qwen3-MoE, OLMoE, DeepSeek-V3).

Routing (token choice): a bias-free linear router gives each token E logits; scores are their softmax
(Mixtral, Qwen3, OLMoE) or sigmoid (DeepSeek-V3); each token goes to the k experts of highest score plus
routing bias, and their outputs are summed weighted by the scores (the bias chooses, it never weighs:
DeepSeek-V3's auxiliary-loss-free balancing), rescaled to sum to 1 when `norm_topk_prob`. Shared experts
(DeepSeek) are one always-on SwiGLU of num_shared_experts x moe_intermediate_size: the sum of s separate
experts with the same input is exactly one expert s times as wide.

Computation is dropless: every (token, expert) pair is computed, none is dropped for capacity. The pairs are
sorted by expert so that each expert's tokens are one contiguous slice; the experts' weights are stacked
[E, ...] tensors (dim 0 is what expert parallelism will shard), and the slices go through one grouped GEMM
(`torch._grouped_mm`, on CPU since torch 2.9) or, where it cannot run, a loop of one matmul per expert: the
same products, bitwise equal on the CPU in fp32 (tests/model/test_moe.py).

Balancing:
  aux loss  Switch Transformer's coef * E * sum_i f_i * P_i, f_i the share of routed (token, expert) pairs
            that went to expert i, P_i its mean normalised score: 1 * coef when balanced (Fedus et al. 2021);
  z-loss    coef * mean over tokens of logsumexp(router logits)^2 keeps the logits small (Zoph et al. 2022);
  bias      after each optimizer step each expert's routing bias moves by rate * sign(mean load - its load)
            over the step's (all ranks') token counts (Wang et al. 2024, used by DeepSeek-V3). The bias is a
            buffer: saved in checkpoints, never touched by the optimizer.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

_routing = threading.local()  # .depth > 0 while an MoE layer runs its routed part on this thread


@contextlib.contextmanager
def routed_part() -> Iterator[None]:
    """Marks the ops of an MoE layer's routed part (router, permutation, experts, combine) for selective
    recomputation's policy (pretrain.distributed.recompute), which remakes all of them as torchtitan's does."""
    _routing.depth = getattr(_routing, "depth", 0) + 1
    try:
        yield
    finally:
        _routing.depth -= 1


def in_routed_part() -> bool:
    return getattr(_routing, "depth", 0) > 0


class PairsByExpert(NamedTuple):
    """A layer's routing (MoE.route): every (token, expert) pair chosen, sorted by expert, stably (within an
    expert its tokens stay in order). Expert e's pairs are then one contiguous slice, the counts[e] rows after
    those of experts 0..e-1: the contract the grouped GEMM (Experts) and expert parallelism's all-to-all
    (distributed/expert_parallel.py, which asserts it) rely on."""

    token: torch.Tensor  # (pairs,) int64: each pair's token
    weight: torch.Tensor  # (pairs, 1) fp32: its weight in the token's sum of expert outputs
    counts: torch.Tensor  # (E,) int64: pairs per expert
    logits: torch.Tensor  # (tokens, E) fp32: the router's logits (z-loss)
    scores: torch.Tensor  # (tokens, E) fp32: their softmax or sigmoid (aux loss)


def by_expert(chosen: torch.Tensor, weights: torch.Tensor, logits: torch.Tensor, scores: torch.Tensor) -> PairsByExpert:
    """The pairs of `chosen` (tokens, k) expert ids, with their `weights` (tokens, k), sorted by expert."""
    experts = chosen.flatten()
    order = experts.argsort(stable=True)
    counts = expert_counts(experts, scores.shape[-1])
    return PairsByExpert(order // chosen.shape[-1], weights.flatten()[order, None], counts, logits, scores)


class Experts(nn.Module):
    """E SwiGLU experts as stacked weights: `up` [E, 2I, H] (gate rows, then up rows, as our dense `mlp.up`
    and Hugging Face's `gate_up_proj`), `down` [E, H, I]."""

    def __init__(self, num_experts: int, hidden: int, width: int):
        super().__init__()
        self.up = nn.Parameter(torch.empty(num_experts, 2 * width, hidden))
        self.down = nn.Parameter(torch.empty(num_experts, hidden, width))
        self.grouped: bool | None = None  # None: the grouped GEMM wherever it runs; False: the loop

    def forward(self, x, pairs: PairsByExpert):
        """x: (pairs, H), the tokens of `pairs` in its order (by expert) -> each pair's expert output (pairs, H)."""
        return self.compute(x, pairs.counts)

    def compute(self, x, counts):
        """x: (rows, H) sorted by expert, counts[e] of them expert e's -> (rows, H)."""
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        x, up, down = x.to(dtype), self.up.to(dtype), self.down.to(dtype)  # the grouped GEMM ignores autocast
        if self.uses_grouped_mm(x):
            offsets = counts.cumsum(0).to(torch.int32)
            h = torch._grouped_mm(x, up.transpose(-2, -1), offs=offsets)
            return torch._grouped_mm(_swiglu(h), down.transpose(-2, -1), offs=offsets)
        outs = [_swiglu(part @ up[e].t()) @ down[e].t() for e, part in enumerate(x.split(counts.tolist()))]
        return torch.cat(outs)

    def uses_grouped_mm(self, x) -> bool:
        if self.grouped is False or not hasattr(torch, "_grouped_mm"):
            return False
        if x.device.type == "cuda" and not grouped_mm_on_cuda(torch.cuda.get_device_capability(x.device), x.dtype):
            return False
        # Its operands' strides must be multiples of 16 bytes: hidden and expert widths of whole 16-byte units.
        return all(n * x.element_size() % 16 == 0 for n in (self.up.shape[-1], self.down.shape[-1]))


def grouped_mm_on_cuda(capability: tuple[int, int], dtype: torch.dtype) -> bool:
    """Whether torch._grouped_mm serves the experts on a GPU of this compute capability: bf16 on Hopper (sm_90)
    only. Its kernels for Blackwell (10.x) give experts that got no token non-zero gradients (pytorch#172439):
    the per-expert loop there until torch fixes it."""
    return dtype == torch.bfloat16 and capability == (9, 0)


def moe_width(cfg) -> int:
    """The SwiGLU width of one routed or shared expert."""
    return cfg.moe_intermediate_size or cfg.intermediate_size


def _swiglu(h):
    # The halves are strided views of the gate|up rows; elementwise kernels on a CPU run a strided view several
    # times slower than a contiguous copy (benchmarks/moe_step.py --layer: silu and its backward), so copy first.
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate.contiguous()) * up.contiguous()


class MoE(nn.Module):
    """The routed feed-forward of one block (see the module docstring). After a training forward,
    `router_loss` holds this micro-batch's aux + z losses (a graph tensor the model adds to its loss), and
    the step's statistics accumulate in `step_sums` until `end_step`."""

    expert_bias: torch.Tensor  # a buffer (register_buffer below)

    def __init__(self, cfg, shared: nn.Module | None = None):
        super().__init__()
        width = moe_width(cfg)
        self.num_experts, self.top_k = cfg.num_experts, cfg.experts_per_token
        self.score, self.norm_topk_prob = cfg.router, cfg.norm_topk_prob
        self.aux_coef, self.z_coef = cfg.router_aux_loss_coef, cfg.router_z_loss_coef
        self.router = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = Experts(cfg.num_experts, cfg.hidden_size, width)
        self.shared = shared  # the shared experts' SwiGLU (the block builds it: a dense MLP of their width)
        self.register_buffer("expert_bias", torch.zeros(cfg.num_experts))  # persistent: in every checkpoint
        self.router_loss: torch.Tensor | None = None
        # The ranks a model replica's tokens are routed on: tensor parallelism's sequence parts (each tensor rank
        # routes its own, distributed/tensor_parallel.py). Each rank's balancing losses are its part's, weighted
        # by 1/parts so that their sum over the parts is the replica's mean.
        self.token_parts = 1
        # The step's sums so far: tokens per expert, aux loss, z-loss. Not a buffer: DDP would overwrite each
        # rank's with rank 0's at every forward (it broadcasts buffers).
        self.step_sums: torch.Tensor | None = None

    @torch.no_grad()
    def reset_buffers(self) -> None:
        """Zero routing biases (a model materialised from the meta device has garbage there)."""
        self.expert_bias.zero_()
        self.step_sums = None

    # Eager under torch.compile: each expert's token count is a data-dependent shape (the grouped GEMM's
    # offsets, the loop's splits, expert parallelism's all-to-all splits), and the grouped GEMM's fake-tensor
    # kernel takes bf16 only (torch 2.13: an fp32 trace fails). The block's attention and norms compile.
    @torch.compiler.disable
    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        with routed_part():
            pairs = self.route(x)
            y = self._routed(x, pairs)
        if self.shared is not None:
            y = y + self.shared(x)
        if self.training:
            self._account(pairs.logits, pairs.scores, pairs.counts)
        return y.reshape(shape)

    def route(self, x) -> PairsByExpert:
        """Token choice for tokens x (tokens, H): scores from the router's logits, in fp32 whatever the compute
        dtype; each token's experts (`choose`), weighted by their scores (rescaled to sum to 1 when
        norm_topk_prob); the pairs sorted by expert."""
        logits = self.router(x).float()
        scores = logits.softmax(-1) if self.score == "softmax" else logits.sigmoid()
        with torch.no_grad():
            chosen = self.choose(scores)
        weights = scores.gather(-1, chosen)
        if self.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        return by_expert(chosen, weights, logits, scores)

    def choose(self, scores):
        """Each token's top_k experts (tokens, k): the highest score plus routing bias (the bias chooses, it never
        weighs). Another rule of choice (DeepSeek-V3's group-limited routing: the best groups of experts first)
        goes here."""
        return (scores + self.expert_bias).topk(self.top_k, dim=-1).indices

    def _routed(self, x, pairs: PairsByExpert):
        """The routed experts' output for tokens x (tokens, H): each token's weighted sum of its experts'."""
        out = self.experts(x[pairs.token], pairs) * pairs.weight.to(x.dtype)
        # index_put_'s backward keeps only the token ids, where index_add_'s keeps its whole source (for its
        # shape): a second copy of every routed token's output.
        return torch.zeros_like(x).index_put_((pairs.token,), out.to(x.dtype), accumulate=True)

    def _account(self, logits, scores, counts) -> None:
        """This micro-batch's balancing losses (into `router_loss`) and statistics (into the step's sums), once
        per micro-batch: activation checkpointing runs the forward again in backward (`recomputing`), and
        that run computes the losses' graph again (backward unpacks its saved tensors) but counts nothing."""
        tokens = logits.shape[0]
        share = counts.float() / (tokens * self.top_k)  # f_i: no gradient, as in Switch
        mean_score = (scores / scores.sum(-1, keepdim=True)).mean(0)  # P_i (softmax: already normalised)
        aux = self.num_experts * (share * mean_score).sum()
        z = logits.logsumexp(-1).square().mean()
        if recomputing():
            return
        self.router_loss = (self.aux_coef * aux + self.z_coef * z) / self.token_parts
        sums = torch.cat([counts.float(), aux.detach()[None], z.detach()[None]])
        self.step_sums = sums if self.step_sums is None else self.step_sums + sums


def expert_counts(experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """How many (token, expert) pairs each expert got: int64 [E], without waiting for the device. torch.bincount
    copies to the host twice on CUDA (its input's min and max, to size its output); a scatter-add into E zeros
    has a fixed shape (torchtitan's torch.histc too, whose float counts the grouped GEMM's offsets would cast
    back), and its integer sums are exact in any order."""
    return torch.zeros(num_experts, dtype=torch.int64, device=experts.device).scatter_add_(
        0, experts, torch.ones_like(experts)
    )


def recomputing() -> bool:
    """Whether this forward runs inside backward: torch.utils.checkpoint's recomputation, the only forward
    that does (torch's own module_tracker and FSDP2 tell backward from forward the same way)."""
    return torch._C._current_graph_task_id() != -1


def moe_layers(model) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def router_loss(model):
    """The sum of the MoE layers' balancing losses of the last training forward (weighted by their coefs)."""
    losses = [m.router_loss for m in moe_layers(model) if m.router_loss is not None]
    for m in moe_layers(model):
        m.router_loss = None
    return sum(losses) if losses else None


@torch.no_grad()
def end_step(model, micro_batches: int, update: bool = True) -> dict:
    """After an optimizer step: every rank's expert counts summed (one all-reduce), the routing biases moved
    towards equal load by model.router_bias_update_rate when `update` (a skipped step moves nothing), the
    step's MoE metrics returned and the sums cleared. The same on every rank: the biases stay equal without a
    broadcast."""
    layers, rate = moe_layers(model), model.config.router_bias_update_rate
    if not layers:
        return {}
    stats = torch.stack(cast("list[torch.Tensor]", [m.step_sums for m in layers]))  # each layer ran this step
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(stats)
        stats[:, -2:] /= torch.distributed.get_world_size()
    counts, aux, z = stats[:, :-2], stats[:, -2] / micro_batches, stats[:, -1] / micro_batches
    mean = counts.mean(-1, keepdim=True)
    for m, c, avg in zip(layers, counts, mean):
        if rate and update:
            m.expert_bias += rate * torch.sign(avg - c)
        m.step_sums = None
    load = counts.max(-1).values / mean.squeeze(-1)
    aux, z, *load = torch.cat([aux.mean()[None], z.mean()[None], load]).tolist()  # one copy to the host
    return {
        "moe/aux_loss": aux,
        "moe/z_loss": z,
        "moe/load_max_over_mean": max(load),
        "moe/load_max_over_mean_per_layer": [round(v, 4) for v in load],
    }
