"""Bytes kept for backward by one micro-batch: every tensor our model saves, term by term.

The starting point is Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models"), whose per-layer figure for GPT-3 style layers with fp16 activations is s*b*h*(34 + 5*a*s/h). Our
terms are that count redone for what `pretrain.model` really keeps (checked tensor by tensor against
`saved_tensors_hooks` in tests/plan/test_memory_vs_measured.py):
  - SDPA / flash attention keeps q, k, v, its output and a log-sum-exp, never the seq x seq scores (the 5as/h
    term is gone); `train.attention: eager` keeps the fp32 softmax and its cast instead. With grouped-query
    attention, where no fused kernel takes grouped heads, SDPA keeps k and v repeated per query head.
  - No dropout, no masks (the 2-byte dropout outputs and 1-byte masks are gone).
  - Norms run in fp32: RMSNorm keeps its fp32 input, the reciprocal RMS and the fp32 normalised x (Qwen3's
    QK-norm too, per head of q and k, and never recomputed). Where F.rms_norm runs its fused kernel
    (`fused_norm`: CUDA, pretrain.plan.kernels) it keeps only its input (fp32 under autocast, which casts a
    norm's input up; the 16-bit stream as it is in pure bf16) and the reciprocal RMS.
  - Under autocast each matmul keeps its own half-precision copy of its input; SwiGLU keeps the fused
    gate|up output, silu(gate) and the product (4 * b*s*H' where GELU keeps 2 * b*s*H').
  - The output layer and loss: pretrain.plan.loss_terms.
Document masking (`documents`: the kernel, pretrain.plan.kernels): each block keeps eager attention's inverted
(b, 1, s, s) bool mask, SDPA's additive mask (a x b*s*s) made from it, or the CPU loop's per-document outputs;
reset positions gather the rotary tables per token (b*s rows); recomputation holds mask and tables.
Recomputation: `full` keeps each block's input; `selective` (torchtitan's op policy, distributed/recompute.py)
also attention's outputs and every other matmul's (qkv, the MLP's first). In backward both hold one block's
recomputed tensors at a time: what it keeps without recomputation less what stayed.
Under torch.compile (`compiled`) a block saves what inductor's min-cut partitioner picks from the joint
forward-backward graph (measured on CPU, torch 2.13, tensor by tensor around a compiled block of each family,
precision and recomputation mode: tests/plan/test_memory_vs_measured.py): the cheap elementwise chains are
remade in backward, so the block keeps its input, the norms' statistics, the matmul inputs, the attention
tensors as eager, the output projection's output and the MLP's up output and down input; no fp32 normalised
x, no fp32 residual stream, no SiLU(gate). With selective recomputation it honours the policy's tags: eager
mode's tensors. Dropout masks and `train.attention: eager`, not measured compiled, are counted as eager.
For Llama-3.2-1B's block (bf16-mixed, seq 2048): 0.70x the eager bytes without recomputation.
Mixture-of-Experts blocks keep, instead of the MLP's terms, the router's and the routed tokens' tensors
(pretrain.plan.moe_activations).
Tensor parallelism divides the attention and MLP terms by t; the norm terms are divided only with sequence
parallelism, as in Korthikanti et al. Pipeline parallelism (1F1B): the first stage holds min(p, m)
micro-batches of L/p layers in flight.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .activation_terms import COMPUTE_BYTES, AddTerm, Term, rank_bytes, residual_bytes
from .documents import position_reset
from .loss_terms import loss_terms
from .moe_activations import moe_terms
from .stages import chunk_indices, chunks_in_flight, chunks_per_stage, stage_layers
from .stages import in_flight as stage_in_flight

if TYPE_CHECKING:
    from ..config.job_sections import ParallelConfig
    from ..config.schema import ResolvedModelConfig, ResolvedTrainConfig

HELD_INPUT = "block input (held by recomputation)"


def layer_terms(
    m: ResolvedModelConfig,
    t: ResolvedTrainConfig,
    parallel: ParallelConfig,
    b: int,
    recompute: str | None = None,
    native_gqa: bool = True,
    compiled: bool = False,
    imbalance: float = 1.0,
    documents: str | None = None,
    fused_norm: bool = False,
) -> list[Term]:
    """What one transformer block keeps for one micro-batch of b sequences. native_gqa: SDPA takes grouped
    k/v heads itself (pretrain.plan.kernels decides); compiled: the block runs under torch.compile (what
    inductor's min-cut partitioner saves, below); documents: the masked attention's kernel (None: causal);
    fused_norm: RMSNorm runs F.rms_norm's fused kernel (pretrain.plan.kernels.fused_rms_norm)."""
    recompute = recompute or t.activation_checkpointing
    s, h = t.seq_len, m.hidden_size
    a, r = COMPUTE_BYTES[t.precision], residual_bytes(t, parallel)
    llama = m.family == "llama"
    bs = b * s
    terms: list[Term] = []

    def add(name: str, nbytes: float, formula: str, sharded: bool = True) -> None:
        terms.append(Term(name, int(nbytes), formula, sharded))

    if recompute in ("full", "selective"):
        add(HELD_INPUT, r * bs * h, f"{r} x b*s*h", sharded=False)
    if recompute == "full":
        return terms
    if recompute == "selective":
        _selective_terms(add, m, t, parallel, a, b, imbalance, documents)
        return terms

    # Norms (two per block).
    if compiled:
        _compiled_norms(add, llama, a, r, bs, h)
    elif llama:
        n = norm_input_bytes(t, fused_norm)
        add(f"RMSNorm {'fp32 ' if n == 4 else ''}inputs", 2 * n * bs * h, f"2 x {n} x b*s*h", sharded=False)
        add("RMSNorm reciprocal rms", 2 * 4 * bs, "2 x 4 x b*s", sharded=False)
        if not fused_norm:
            add("RMSNorm fp32 normalised x", 2 * 4 * bs * h, "2 x 4 x b*s*h", sharded=False)
    else:
        add("LayerNorm inputs", 2 * r * bs * h, f"2 x {r} x b*s*h", sharded=False)
        add("LayerNorm mean and rstd", 2 * 8 * bs, "2 x 8 x b*s", sharded=False)
    if not compiled:
        add("qkv and MLP matmul inputs", 2 * a * bs * h, f"2 x {a} x b*s*h", sharded=False)

    _attention_terms(add, m, t, a, b, native_gqa, compiled, documents, fused_norm)
    _mlp_terms(add, m, parallel, bs, (a, r), recompute, imbalance, compiled)
    if m.dropout:
        add("residual dropout masks", 2 * bs * h, "2 x b*s*h (bool)", sharded=False)
    return terms


def _attention_terms(
    add: AddTerm,
    m: ResolvedModelConfig,
    t: ResolvedTrainConfig,
    a: int,
    b: int,
    native_gqa: bool,
    compiled: bool,
    documents: str | None,
    fused_norm: bool = False,
) -> None:
    """What the attention half of a block keeps (no recomputation)."""
    s, h, nh, d = t.seq_len, m.hidden_size, m.num_heads, m.head_dim
    qw, kvw = nh * d, m.num_kv_heads * d
    llama, bs = m.family == "llama", b * s
    eager = t.attention == "eager"
    if eager:  # the batched matmuls keep contiguous (batch*heads, seq, head_dim) copies of q, k and v
        add("q, k, v copies for the batched matmuls", 3 * a * bs * qw, f"3 x {a} x b*s*q {qw}")
    elif llama and (kvw == qw or native_gqa):  # SDPA keeps rotated q and k, and v: a view of the fused qkv
        add("qkv output", a * bs * (qw + 2 * kvw), f"{a} x b*s*(q {qw} + 2 x kv {kvw})")  # output, kept whole
        add("rotated q, k", a * bs * (qw + kvw), f"{a} x b*s*(q {qw} + kv {kvw})")
    elif llama:  # k and v repeated to every query head first (pretrain.plan.kernels): SDPA keeps the copies
        add("rotated q, k and v repeated per head", 3 * a * bs * qw, f"3 x {a} x b*s*q {qw}")
    else:  # SDPA keeps q, k, v: views of the fused qkv output
        add("qkv output", a * bs * 3 * h, f"{a} x b*s*3h")
    if llama and a != 4:
        reset = position_reset(m, t)  # reset: each token's rows of the tables
        add(
            "rotary cos/sin casts",
            a * (bs if reset else s) * d,
            f"{a} x {'b*s' if reset else 's'}*head_dim",
            sharded=False,
        )
    if m.qk_norm:  # Qwen3's RMSNorm over each head of q and k: the fp32 terms of a norm, per head
        heads, width = nh + m.num_kv_heads, qw + kvw
        add("QK-norm reciprocal rms", 4 * bs * heads, f"4 x b*s*(heads {nh} + kv heads {m.num_kv_heads})")
        if not fused_norm:
            add("QK-norm fp32 normalised q, k", 4 * bs * width, f"4 x b*s*(q {qw} + kv {kvw})")
        if a != 4 and norm_input_bytes(t, fused_norm) == 4:  # its fp32 copy of the 16-bit q and k
            add("QK-norm fp32 inputs", 4 * bs * width, f"4 x b*s*(q {qw} + kv {kvw})")
        elif eager or not (kvw == qw or native_gqa):  # its input is a view of the qkv output: that stays whole
            add("qkv output", a * bs * (qw + 2 * kvw), f"{a} x b*s*(q {qw} + 2 x kv {kvw}) (held by QK-norm)")
    if eager:
        if documents:  # masked_fill keeps ~mask: one per block, of the batch's own documents
            add("document mask, inverted", bs * s, "b*s*s (bool)", sharded=False)
        else:
            add("causal mask", s * s, "s*s (bool)", sharded=False)
        add("fp32 softmax", 4 * b * nh * s * s, "4 x b*heads*s*s")
        if a != 4:
            add("softmax cast", a * b * nh * s * s, f"{a} x b*heads*s*s")
    else:
        add("log-sum-exp", 4 * b * nh * s, "4 x b*heads*s")
    if documents == "mask" and not eager:
        add("document mask as SDPA's additive mask", a * bs * s, f"{a} x b*s*s", sharded=False)
    elif documents == "loop":  # each call's output, kept by its backward, beside the row's concatenation
        add("each document's attention output", a * bs * qw, f"{a} x b*s*q {qw}")
    add("attention output (the output projection's input)", a * bs * qw, f"{a} x b*s*q {qw}")
    if compiled:  # the second norm's input, the residual stream, is remade from it and the block input
        add("output projection's output", a * bs * h, f"{a} x b*s*h", sharded=False)


def _mlp_terms(
    add: AddTerm,
    m: ResolvedModelConfig,
    parallel: ParallelConfig,
    bs: int,
    dtypes: tuple[int, int],
    recompute: str,
    imbalance: float,
    compiled: bool,
) -> None:
    """What the feed-forward half of a block keeps (no recomputation); dtypes: the bytes of the compute dtype and
    of the residual stream."""
    (a, r), I, llama = dtypes, m.intermediate_size, m.family == "llama"
    if m.num_experts:
        moe_terms(add, m, parallel, bs, a, r, recompute, imbalance)
    elif compiled:  # SiLU(gate) is remade from gate|up in backward
        if llama:
            add("gate|up output", a * bs * 2 * I, f"{a} x b*s*2H'")
        else:
            add("fc output", a * bs * I, f"{a} x b*s*H'")
        add("down input", a * bs * I, f"{a} x b*s*H'")
    elif llama:
        add("gate|up output", a * bs * 2 * I, f"{a} x b*s*2H'")
        add("silu(gate), down input", 2 * a * bs * I, f"2 x {a} x b*s*H'")
    else:
        add("fc output", a * bs * I, f"{a} x b*s*H'")
        add("gelu output", a * bs * I, f"{a} x b*s*H'")


def _selective_terms(
    add: AddTerm,
    m: ResolvedModelConfig,
    t: ResolvedTrainConfig,
    parallel: ParallelConfig,
    a: int,
    b: int,
    imbalance: float,
    documents: str | None,
) -> None:
    """What selective recomputation keeps beside the block input: the attention kernel's outputs (none for eager
    attention's batched matmuls; the CPU loop's per document, their concatenation remade) and qkv's and the MLP's
    first matmul's; MoE blocks their terms as below."""
    s, I, nh = t.seq_len, m.intermediate_size, m.num_heads
    qw, kvw = nh * m.head_dim, m.num_kv_heads * m.head_dim
    bs = b * s
    add("qkv output", a * bs * (qw + 2 * kvw), f"{a} x b*s*(q {qw} + 2 x kv {kvw})")
    if t.attention != "eager":
        add("log-sum-exp", 4 * b * nh * s, "4 x b*heads*s")
        if documents == "loop":
            add("each document's attention output", a * bs * qw, f"{a} x b*s*q {qw}")
        else:
            add("attention output (the output projection's input)", a * bs * qw, f"{a} x b*s*q {qw}")
    if m.num_experts:
        moe_terms(add, m, parallel, bs, a, residual_bytes(t, parallel), "selective", imbalance)
    elif m.family == "llama":
        add("gate|up output", a * bs * 2 * I, f"{a} x b*s*2H'")
    else:
        add("fc output", a * bs * I, f"{a} x b*s*H'")


def norm_input_bytes(t: ResolvedTrainConfig, fused_norm: bool) -> int:
    """Bytes per element of what an RMSNorm keeps of its input: an fp32 copy (the composite casts it up, as
    autocast does before the fused kernel), but the 16-bit input itself in the fused kernel of pure bf16."""
    return 2 if fused_norm and t.precision == "bf16" else 4


def _compiled_norms(add: AddTerm, llama: bool, a: int, r: int, bs: int, h: int) -> None:
    """The norms' share of a compiled block without recomputation, and the matmul inputs they make. Inductor's
    partitioner keeps the block input and remakes each norm's output from it and the statistics, so no fp32
    normalised x is kept; the qkv and MLP matmul inputs stay."""
    add("block input", r * bs * h, f"{r} x b*s*h", sharded=False)
    if llama:
        add("RMSNorm reciprocal rms", 2 * 4 * bs, "2 x 4 x b*s", sharded=False)
    else:
        add("LayerNorm mean and rstd", 2 * 8 * bs, "2 x 8 x b*s", sharded=False)
    add("qkv and MLP matmul inputs", 2 * a * bs * h, f"2 x {a} x b*s*h", sharded=False)


def once_terms(
    m: ResolvedModelConfig,
    t: ResolvedTrainConfig,
    parallel: ParallelConfig,
    b: int,
    documents: str | None = None,
    fused_norm: bool = False,
) -> list[Term]:
    """What the embedding, final norm and loss keep (once per micro-batch, not per layer)."""
    s, h, d = t.seq_len, m.hidden_size, m.head_dim
    a, r = COMPUTE_BYTES[t.precision], residual_bytes(t, parallel)
    bs = b * s
    reset = position_reset(m, t)
    rows, per = (bs, "b*s") if reset else (s, "s")  # reset: positions and tables per token
    held = t.activation_checkpointing != "none"  # the checkpoint holds the blocks' inputs
    terms = [Term("token ids", 8 * bs, "8 x b*s (int64)", False)]
    if m.family == "gpt2":
        terms.append(Term("position ids", 8 * rows, f"8 x {per} (int64)", False))
        terms.append(Term("final LayerNorm", r * bs * h + 8 * bs, f"{r} x b*s*h + 8 x b*s", False))
    else:
        if fused_norm:  # its input and 1/rms
            n = norm_input_bytes(t, fused_norm)
            terms.append(Term("final RMSNorm", n * bs * h + 4 * bs, f"{n} x b*s*h + 4 x b*s", False))
        else:  # its fp32 input and normalised x, and 1/rms
            terms.append(Term("final RMSNorm", 8 * bs * h + 4 * bs, "8 x b*s*h + 4 x b*s", False))
        if a == 4 or held:  # saved by the rotation, or held by the checkpoint as the blocks' input
            shared = "" if reset else ", shared"
            terms.append(Term(f"rotary tables (fp32{shared})", 4 * rows * d, f"2 x 4 x {per}*head_dim/2", False))
    if held and documents == "mask":
        terms.append(Term("document mask (held by recomputation)", bs * s, "b*s*s (bool)", False))
    terms += loss_terms(m, t, parallel, b)["kept"]
    if m.dropout:
        terms.append(Term("embedding dropout mask", bs * h, "b*s*h (bool)", False))
    return terms


def _overlap(m: ResolvedModelConfig, t: ResolvedTrainConfig, parallel: ParallelConfig, b: int) -> int:
    """Full recomputation: the recomputed block keeps its held input as-is (no second copy) when its first
    norm saves the input itself: LayerNorm always, RMSNorm when the residual stream is already fp32."""
    r = residual_bytes(t, parallel)
    if m.family == "gpt2" or r == 4:
        return r * b * t.seq_len * m.hidden_size
    return 0


def activation_bytes(
    m: ResolvedModelConfig,
    t: ResolvedTrainConfig,
    parallel: ParallelConfig,
    b: int | None = None,
    native_gqa: bool = True,
    compiled: bool = False,
    imbalance: float = 1.0,
    documents: str | None = None,
    fused_norm: bool = False,
) -> dict[str, Any]:
    """Activation bytes per GPU for micro-batch b (default train.micro_batch_size), with the terms; compiled:
    the blocks run under torch.compile; imbalance: plan.routing_imbalance (MoE); documents, fused_norm: as
    layer_terms. With dense blocks before the MoE ones each kind's blocks are counted as their own (under a
    pipeline every block of the fullest stage as the larger kind); `per_layer` and `layer_terms` are the larger
    kind's."""
    b = b or t.micro_batch_size
    tp, sp = parallel.tensor, parallel.sequence_parallel
    layers, in_flight = _fullest_stage(m, t, parallel)
    terms_of = functools.partial(
        layer_terms,
        t=t,
        parallel=parallel,
        b=b,
        native_gqa=native_gqa,
        compiled=compiled,
        imbalance=imbalance,
        documents=documents,
        fused_norm=fused_norm,
    )
    dense = m.first_dense_layers if m.num_experts else 0
    kinds = [m, dataclasses.replace(m, num_experts=0)] if dense else [m]
    options: list[tuple[int, list[Term], ResolvedModelConfig]] = []
    for kind in kinds:
        terms = terms_of(kind)
        options.append((rank_bytes(terms, tp, sp), terms, kind))
    per_layer, per_layer_terms, m = max(options, key=lambda option: option[0])
    once = once_terms(m, t, parallel, b, documents, fused_norm)
    once_bytes = rank_bytes(once, tp, sp)
    if dense and parallel.pipeline == 1:  # the MoE blocks and the dense first ones, each kind its own bytes
        total = in_flight * (options[0][0] * (m.num_layers - dense) + options[1][0] * dense)
    else:
        total = layers * in_flight * per_layer
    working = 0
    if t.activation_checkpointing != "none":
        working = _recompute_working(terms_of, kinds, m, t, parallel, b)
        total += working
    total += once_bytes
    return dict(
        total=total,
        per_layer=per_layer,
        layers=layers,
        in_flight=in_flight,
        once=once_bytes,
        recompute_working=working,
        layer_terms=per_layer_terms,
        once_terms=once,
    )


def _fullest_stage(m: ResolvedModelConfig, t: ResolvedTrainConfig, parallel: ParallelConfig) -> tuple[int, int]:
    """(layers, micro-batches in flight) of the pipeline rank that must fit.
    1F1B: stage k holds up to p - k micro-batches of its layers' activations; the stage holding the most (the
    first, unless a later one has more layers) is the one that must fit. Interleaved: rank k holds
    chunks_in_flight (chunk, micro-batch) activations, each of a chunk's layers (its largest chunk's)."""
    pp, v = parallel.pipeline, chunks_per_stage(parallel)
    splits = stage_layers(m.num_layers, pp * v)

    def held(k: int) -> tuple[int, int]:  # (layers, in flight) of rank k
        if v == 1:
            return len(splits[k]), stage_in_flight(k, pp, t.grad_accum_steps)
        return (max(len(splits[c]) for c in chunk_indices(k, pp, v)), chunks_in_flight(k, pp, t.grad_accum_steps, v))

    return max((held(k) for k in range(pp)), key=lambda x: x[0] * x[1])


def _recompute_working(
    terms_of: Callable[..., list[Term]],
    kinds: list[Any],
    m: ResolvedModelConfig,
    t: ResolvedTrainConfig,
    parallel: ParallelConfig,
    b: int,
) -> int:
    """Backward recomputes one block at a time and holds its tensors until its gradients are done, less what
    the block kept (selective: the policy's outputs, handed back from the checkpoint's cache): the largest
    kind's (all hold the same input, so `m`, the kind counted per layer, may be the other: a wide dense first
    block). terms_of(kind, recompute=...): layer_terms with this micro-batch and kernels."""
    tp, sp = parallel.tensor, parallel.sequence_parallel

    def recomputed(kind: ResolvedModelConfig) -> int:
        kept = {x.name for x in terms_of(kind)}
        return rank_bytes([x for x in terms_of(kind, recompute="none") if x.name not in kept], tp, sp)

    recomputed_bytes = max(recomputed(kind) for kind in kinds)
    return recomputed_bytes - _overlap(m, t, parallel, b) // (tp if sp else 1)
