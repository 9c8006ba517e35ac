"""The shapes of a block's token-major GEMMs (x @ W, K -> N per token), for the step-time model's operand term
(pretrain.plan.step_time): how many FLOPs a GEMM does per byte of activations it reads and writes.

A GEMM of M tokens, K in and N out does 2 M K N FLOPs and streams a M (K + N) bytes of activations (the weights,
reused over thousands of rows, are left out: the weight reads are the step's floor instead): 2 K N / (a (K + N))
FLOPs per byte, whatever M. A routed expert's M is only its share of the tokens (hundreds of rows: b*s/t x k x
ep / E), so its K x N weights are streamed too, once per expert: 2 K N / (a (K + N + K N / M)). Narrow GEMMs stream
more bytes per FLOP, and under the additive roofline (t = FLOPs / rate + bytes / HBM) run further below a
large GEMM's rate. An MoE block's routed experts are its narrowest: Qwen3-30B-A3B's experts (2048 -> 2 x 768,
768 -> 2048) do 878 and 558 FLOPs per bf16 byte where its dense-sized MLP would do 1,755 and 1,536. With expert
tensor parallelism 1 (Megatron's and torchtitan's default) an expert keeps its whole width on every tensor rank,
which instead sends it a share of the tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .params import expert_width, moe_layers

if TYPE_CHECKING:
    from ..config.schema import ResolvedModelConfig

Shape = tuple[float, float, float, float]  # (K, N, rows per token, rows per weight): a GEMM of the block


def _attention(m: ResolvedModelConfig, tp: int) -> list[Shape]:
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    return [(m.hidden_size, (q + 2 * kv) / tp, 1, 0), (q / tp, m.hidden_size, 1, 0)]


def _mlp(m: ResolvedModelConfig, tp: int, width: float, rows: float = 1, per_weight: float = 0) -> list[Shape]:
    up = 2 * width if m.family == "llama" else width  # SwiGLU: gate and up
    return [(m.hidden_size, up / tp, rows, per_weight), (width / tp, m.hidden_size, rows, per_weight)]


def _moe_block(m: ResolvedModelConfig, tp: int, expert_rows: float) -> list[Shape]:
    """Attention, the router, the k routed experts a token runs (whole width: expert tensor parallelism 1; each
    expert's weights streamed once per its `expert_rows` rows) and the shared experts (split over the tensor
    ranks, as a dense MLP)."""
    shapes = [*_attention(m, tp), (m.hidden_size, m.num_experts, 1, 0)]
    shapes += _mlp(m, 1, expert_width(m), m.experts_per_token, expert_rows)
    if m.num_shared_experts:
        shapes += _mlp(m, tp, m.num_shared_experts * expert_width(m))
    return shapes


def _bytes_per_row(k: float, n: float, per_weight: float) -> float:
    """Elements a GEMM streams per row: K in, N out, and its K x N weights over the rows that share them."""
    return k + n + (k * n / per_weight if per_weight else 0)


def gemm_intensity(m: ResolvedModelConfig, tp: int, a: int, expert_rows: float = 0) -> float:
    """FLOPs per byte of the blocks' GEMMs taken together (module docstring); expert_rows: the tokens of one
    routed expert, whose weights are streamed once for them (MoE)."""
    if not m.num_experts:
        shapes = [*_attention(m, tp), *_mlp(m, tp, m.intermediate_size)]
        return sum(2 * k * n for k, n, _, _ in shapes) / sum(a * (k + n) for k, n, _, _ in shapes)
    moe = moe_layers(m)
    dense = [*_attention(m, tp), *_mlp(m, tp, m.intermediate_size)]
    blocks = [(m.num_layers - moe, dense), (moe, _moe_block(m, tp, expert_rows))]
    flops = sum(count * sum(2 * k * n * rows for k, n, rows, _ in shapes) for count, shapes in blocks)
    moved = sum(count * sum(a * _bytes_per_row(k, n, w) * rows for k, n, rows, w in shapes) for count, shapes in blocks)
    return flops / moved
