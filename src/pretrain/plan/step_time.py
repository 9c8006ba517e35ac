"""Seconds per optimizer step of a layout: compute, memory traffic and communication, each term written out.

One micro-batch on one GPU (a tensor rank of a pipeline stage) takes
    t_mb = max(matmul FLOPs / R x tile(b*s) + attention FLOPs / (R x 0.7), weights read / HBM)
           + GEMM operands / HBM + activation traffic / HBM + tensor-parallel collectives
  R        achievable FLOP/s: `hardware.profile`'s measured TFLOP/s (a profile is already what a large matmul
           reaches), else the peak (catalog or hardware.peak_tflops) x 0.75, what a large bf16 GEMM reaches
           of the dense data-sheet figure on an A100; on Hopper x 0.76 (HOPPER_MATMUL_SHARE, fitted to the
           published H100 runs: see its comment). Attention kernels reach less of it than GEMMs (FlashAttention-2
           reaches 50-73% of peak forward and less backward: Dao 2023): 0.7 of R. On Hopper the same kernel
           (PyTorch's SDPA flash, llm-foundry's) reaches only 35% of the dense peak ("FlashAttention-2 achieves
           only 35% utilization on the H100 GPU", Shah et al. 2024, FlashAttention-3, abstract): 0.35 of peak.
           Both at head dimension 128; below it x (d/128)^0.25 (HEAD_DIM_EXPONENT, fitted: see its comment).
  operands a GEMM's activations (K in, N out per token) stream through HBM as it runs: t = FLOPs / R +
           bytes / HBM, the additive ("smooth") roofline, so a GEMM's efficiency falls with its arithmetic
           intensity 2 K N / (a (K + N)), the block's GEMMs taken together: narrow models (GPT-2 small, MPT-760M
           at hidden 1536) and GPUs with more FLOPs per byte of HBM (an H100: ~300 FLOPs/byte against an
           A100's ~150) reach less of the large-GEMM rate (Williams et al. 2009, Roofline; NVIDIA's Matrix
           Multiplication Background guide, "Understanding Performance").
  tile     matmuls run in tiles of 128 rows of tokens: b*s rows use b*s / (128 x ceil(b*s / 128)) of the
           tensor cores ("tile quantization", NVIDIA's Matrix Multiplication Background guide). GPUs only.
  weights  the compute-dtype matmul weights are read 3 times (forward, activation gradients, weight
           gradients; 4 with full recomputation): a floor a small micro-batch cannot go under, which is why
           tokens/s falls at tiny batches (a 7B model on a V100 in a practitioner's LLaMA-Factory log:
           12.9 it/s at cutoff 1 and still 12.3 at 1,024 tokens, 2.34 at 8,192).
  traffic  every tensor kept for backward written once and read once (norms, activations, residual adds are
           memory-bound kernels that do not overlap the matmuls); recomputed tensors are written once more.
  kernels  each kernel costs a fixed ~10 us however small (eager PyTorch's dispatch on the CPU and the
           launch): ~60 per block (about 20 forward, twice that backward; recomputation adds ~15 selective:
           the forward's but the kept matmuls', attention's, the down projection's and the last residual add;
           ~20 full) and ~20 around them, per micro-batch;
           what makes many small micro-batches slower than few large ones at equal FLOPs.
  TP       Megatron's tensor parallelism all-reduces the b*s*h activations twice per block in forward and
           twice in backward (Shoeybi et al. 2019, figure 4; 3 x 2 with full recomputation, which redoes the
           forward); sequence parallelism replaces each all-reduce by an all-gather + reduce-scatter of the
           same volume (Korthikanti et al. 2022, section 4.2.2). A ring moves 2 (t-1)/t x bytes per GPU. Not
           overlapped with compute, but with parallel.async_tp: each collective in t chunks pipelined with
           its matmul (Wang et al., ASPLOS'23), one chunk exposed.
  MoE      the dispatch as it runs (pretrain.plan.expert_dispatch: each rank's b*s/t tokens, NVLink inside the
           node and the NIC beyond it, the counts exchange, the dispatcher, what overlaps), the permutation
           passes, each expert's rows in GEMM tiles, the busiest rank's extra routed tokens (pretrain.plan.
           expert_parallel), the routed experts' narrow shapes in the operand term (pretrain.plan.gemm_shapes)
           and the MoE block's extra kernels; all of the rank's experts' weights are read.
The step is the pipeline's (1F1B, Narayanan et al. 2021): (m + p - 1) micro-batch slots for m micro-batches
(bubble (p-1) / (m+p-1)), each as long as the busiest stage's micro-batch (the output layer on the last:
pretrain.plan.pipeline_time) and also sending the b*s*h activations forward and their gradients back
(point-to-point), then the data-parallel communication left exposed, then the optimizer:
  DDP      all-reduce of the gradients, 2 (d-1)/d x gradient bytes, overlapped with the last micro-batch's
           backward (2/3 of its compute) except the last 25 MB bucket (DDP's bucket_cap_mb).
  ZeRO-1   the distributed optimizer (Megatron-LM's, docs/source/distrib_optimizer.md): a reduce-scatter of
           the gradients, (d-1)/d x gradient bytes, overlapped with backward as DDP's (--overlap-grad-reduce),
           and an all-gather of the updated compute-dtype parameters, (d-1)/d x their bytes, overlapped with the
           next step's first forward (--overlap-param-gather), each exposing its last bucket.
  ZeRO-2/3 FSDP: per micro-batch (parallel.grad_sync=micro_batch; once with step) a reduce-scatter of the
           gradients, (d-1)/d x gradient bytes, and all-gathers of the compute-dtype parameters, once per
           micro-batch (ZeRO-2) or for forward and again for backward (ZeRO-3); prefetched, so hidden behind
           the micro-batches' compute except one block's worth (the first gather / the last reduce-scatter).
           Per pipeline stage, as torch.distributed.pipelining runs FSDP2: gathered and unsynced through every
           micro-batch but the last, so ZeRO-2 gathers once a step (ZeRO-3 twice a micro-batch), and one
           reduce-scatter follows the last backward, hidden behind nothing.
  overlap  hidden communication is not free: NCCL's kernels take SMs and HBM bandwidth from the compute beside
           them, which runs 18.9% slower on average for as long as they overlap (A100s and H100s, GPT and
           LLaMA layers: "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
           Learning", arXiv 2507.03114, abstract); so each hidden second of communication costs 0.189 s.
  optimizer  memory-bound: parameters and states read and written, gradients read, at HBM bandwidth; with
           parallel.offload the gradients go to the host and the parameters come back over PCIe, and the
           host's memory bandwidth runs the update (ZeRO-Offload, Ren et al. 2021).
Links: a group whose ranks lie within one node (tensor ranks are adjacent, then data, then pipeline: Megatron's
order) uses NVLink, hardware.intra_node_gbps; otherwise the network, hardware.inter_node_gbps (per GPU per
direction; a data-parallel group across nodes runs one NCCL ring per NIC, so its k ranks in a node move
data over k NICs at once, NVLink's rate at most). Defaults: the catalog's data-sheet figures x 0.8, about
what copies and NCCL's ring collectives reach of a link's rate; a key given is taken as measured (nccl-tests' bus
bandwidth).
Pure Python, as the rest of the planner.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..config import compile_enabled
from ..gpus import gpu_spec
from . import cpu_time, fp8
from .activation_terms import COMPUTE_BYTES
from .activations import activation_bytes
from .collectives import (
    BANDWIDTH_EFFICIENCY,
    data_parallel_time,
    hbm_gbps,
    links,
    optimizer_time,
)
from .expert_dispatch import dispatch_seconds
from .expert_parallel import expert_rows, moe_seconds, weight_params
from .explain import Explain
from .flops import mfu
from .gemm_shapes import gemm_intensity
from .hardware import memory_bandwidth_gbps
from .kernels import planned_native_gqa
from .moe_activations import routed_load
from .params import moe_layers
from .pipeline_time import busiest_stage, pipeline_time
from .tensor_parallel_time import tensor_parallel_time
from .traffic import eager_elementwise_traffic, kept_tensor_traffic, weight_reads

if TYPE_CHECKING:
    from ..config.planner_sections import HardwareConfig
    from ..config.schema import ResolvedConfig, ResolvedTrainConfig
    from ..gpus import GpuSpec
    from .params import ParamCounts

MATMUL_EFFICIENCY = 0.75  # of a data-sheet dense peak, reached by large bf16 GEMMs
ATTENTION_EFFICIENCY = 0.7  # of the matmul rate (FlashAttention-2: 50-73% of peak forward, Dao 2023)
HOPPER_ATTENTION_PEAK = 0.35  # of the dense peak: FlashAttention-2 on an H100 (Shah et al. 2024, abstract)
# Both at head dimension 128. A tile's matmuls grow with the head dimension d and its softmax and rescaling do
# not, so a smaller d runs slower per FLOP (FlashAttention-2's benchmarks, Dao 2023, report head dimension 64
# below 128 on the same GPU): the rate x (d / 128) ** HEAD_DIM_EXPONENT, at most 1. The exponent is fitted to
# the published runs (tests/plan/published_runs.yaml): the median |log ratio| of all 41 is lowest, and the
# golden set's share within 15 % highest, from 0.2 to 0.3; 0.25 puts d = 64 at 0.84, d = 96 at 0.93.
HEAD_DIM_EXPONENT = 0.25
HOPPER_GPUS = ("h100-pcie", "h100-sxm", "h800", "h200")
# The 0.75 is an A100's. A Hopper card reaches less of its data sheet: its best-shape bf16 matmul reaches 80.1% of
# 989 TFLOP/s against an A100's 85.9% of 312 ("Maximum Achievable Matmul FLOPS" table, stas00/ml-engineering,
# compute/accelerator/README.md, CUDA 12.1 rows), and in a training step its clocks fall further at the 700 W
# limit under sustained tensor-core load. The share is fitted, one number for the generation, not per run: on
# the 41 published runs of tests/plan/published_runs.yaml the median |log(planned / measured)| is lowest (0.105-0.106)
# from 0.74 to 0.78, and 0.76 is that range's middle; the share of runs within 15 % barely moves (66-68 % from
# 0.72 to 0.82). The best-shape ratio alone (0.801 / 0.859 = 0.93) left llm-foundry's H100 rows 1.07-1.29x
# optimistic.
HOPPER_MATMUL_SHARE = 0.76
# A B200's best-shape bf16 matmul reaches 77.6% of 2,250 TFLOP/s against an A100's 85.9% of 312 (the same
# "Maximum Achievable Matmul FLOPS" table, torch 2.7.1+cu128 row): 0.776 / 0.859 of the A100's share. Taken as
# measured, not fitted (the Hopper share above needed more than its table ratio; no dense B200 run is published
# here to fit one).
BLACKWELL_GPUS = ("b200",)
BLACKWELL_MATMUL_SHARE = 0.776 / 0.859
TILE_ROWS = 128
KERNELS_PER_LAYER = 60  # forward: norms, 4-7 matmuls, rotary, attention, activation, adds (~20); backward 2x
RECOMPUTED_KERNELS = {"none": 0, "selective": 15, "full": 20}  # the forward but 5 kept/skipped ops; all of it
KERNELS_OUTSIDE = 20  # embedding, final norm, output layer, loss, their backward
# An MoE feed-forward launches more kernels than the MLP it replaces: router, top-k, sort, counts, gathers,
# the weighted scatter-add, the balancing losses. Counted on moe-debug (torch.profiler, aten ops that are not
# views, forward and backward): 74 for the MoE feed-forward against 14 for the dense MLP.
MOE_KERNELS = 60
KERNEL_OVERHEAD_S = 10e-6


def step_time(
    c: ResolvedConfig, counts: ParamCounts, fl: dict[str, Any], peak: float | None, ex: Explain | None = None
) -> dict[str, Any] | None:
    """The modelled step of config `c` (flops: pretrain.plan.flops.flops's dict; peak: TFLOP/s per GPU)."""
    ex = ex or Explain()
    if not peak:
        ex.add("step_time", "seconds", None, "no peak FLOP/s: set hardware.profile or hardware.peak_tflops")
        return None
    out = _micro_batch(c, counts, fl, peak, ex)
    busiest = busiest_stage(c, out["micro_batch_s"], _output_layer_s(c, counts, out["achievable_tflops"]))
    out.update(pipeline_time(c, out["micro_batch_s"], busiest, ex))
    out.update(data_parallel_time(c, counts, out, ex))
    if spec_is_cpu(c):  # the step's own ops and its update at the CPU's memory bandwidth (pretrain.plan.cpu_time)
        out["optimizer_s"] = cpu_time.optimizer_seconds(c, counts, ex)
    else:
        out.update(optimizer_time(c, counts, ex))
    seconds = out["forward_backward_s"] + out["data_parallel_exposed_s"] + out["optimizer_s"]
    t, par = c.train, c.parallel
    tokens = t.seq_len * t.micro_batch_size * t.grad_accum_steps * par.data_parallel
    model_per_token = fl["per_token_6n"] if c.flops.convention == "6n" else fl["per_token"]
    utilisation = mfu(tokens / seconds, model_per_token, par.gpus, peak)
    ex.add(
        "step_time",
        "seconds",
        seconds,
        f"forward/backward {out['forward_backward_s']:.4g} + exposed data "
        f"parallel {out['data_parallel_exposed_s']:.4g} + optimizer {out['optimizer_s']:.4g}",
    )
    ex.add("step_time", "tokens_per_second", tokens / seconds, f"{tokens:,} tokens per step / {seconds:.4g} s")
    ex.add(
        "step_time",
        "mfu",
        utilisation,
        f"tokens/s x {model_per_token:,} model FLOPs/token / ({par.gpus} x {peak:g} TFLOP/s)",
    )
    if t.precision == "fp8":  # the MFU against both peaks, `mfu` being the bf16 one (plan/fp8.py)
        out.update(fp8.mfu_fields(c, fl, utilisation, model_per_token))
    if "moe" in fl:  # an MoE run's MFU under each convention in use (flops.moe), all on active parameters but one
        out["moe_mfu"] = {k: mfu(tokens / seconds, v, par.gpus, peak) for k, v in fl["moe"].items() if "per_token" in k}
    return {"seconds": seconds, "tokens_per_second": tokens / seconds, "mfu": utilisation, **out}


def spec_is_cpu(c: ResolvedConfig) -> bool:
    return gpu_spec(c.hardware.gpu).name == "cpu"


def _micro_batch(
    c: ResolvedConfig, counts: ParamCounts, fl: dict[str, Any], peak: float, ex: Explain
) -> dict[str, Any]:
    """One micro-batch's forward and backward on one GPU (a tensor rank of a pipeline stage)."""
    m, t, par, hw = c.model, c.train, c.parallel, c.hardware
    spec = gpu_spec(hw.gpu)
    tp, pp = par.tensor, par.pipeline
    shard = tp * pp
    a = COMPUTE_BYTES[t.precision]
    full = t.activation_checkpointing == "full"
    tokens = t.micro_batch_size * t.seq_len
    rate, rate_how = _achievable_tflops(hw, spec, peak)
    on_gpu = spec.name != "cpu"
    tile = tokens / (TILE_ROWS * math.ceil(tokens / TILE_ROWS)) if on_gpu else 1.0
    attention = fl["attention_per_token"] * (4 / 3 if full else 1)  # full recomputation redoes its forward
    matmul = fl["per_token_hardware"] - attention
    rows = expert_rows(c, tokens, routed_load(m, par, c.plan.routing_imbalance)) if m.num_experts else 0
    intensity = gemm_intensity(m, tp, a, rows)
    hbm = hbm_gbps(c)
    operand_s = matmul * tokens / shard / intensity / (hbm * 1e9) if on_gpu and hbm else 0.0
    matmul_s = matmul * tokens / shard / (rate * 1e12 * tile)
    cast_s = 0.0
    if t.precision == "fp8":  # the converted linears' GEMMs at the fp8 rate, their casts at HBM (plan/fp8.py)
        memory = hbm if on_gpu else cpu_time.FP8_CAST_GBPS  # a CPU converts to float8 element by element
        matmul_s, cast_s, fp8_how = fp8.matmul_seconds(c, matmul, tokens, shard, rate, tile, memory)
        ex.add("step_time", "fp8_cast_s", cast_s, fp8_how)
    attention_s, attention_how = _attention_seconds(c, spec, attention, tokens, peak, rate)
    ex.add("step_time", "achievable_tflops", rate, rate_how)
    ex.add(
        "step_time",
        "matmul_s",
        matmul_s,
        f"{matmul:,} hardware FLOPs/token (no attention) x b*s {tokens:,} / "
        f"(tensor {tp} x pipeline {pp}) / ({rate:.4g} TFLOP/s x tile {tile:.3g})"
        + ("" if on_gpu else "; no tiles on a CPU"),
    )
    ex.add(
        "step_time",
        "gemm_operand_s",
        operand_s,
        f"the same FLOPs / {intensity:.4g} FLOPs per byte of "
        "activations the GEMMs read and write / HBM" + ("" if on_gpu else "; not modelled on a CPU"),
    )
    ex.add("step_time", "attention_s", attention_s, attention_how)

    if on_gpu:
        weight_s, traffic_s, layers = _memory_bound_terms(c, counts, hbm, on_gpu, ex)
        overhead_s = _kernel_overhead(c, layers, ex)
    else:  # eager PyTorch on a CPU: its ops' overhead and elementwise traffic (pretrain.plan.cpu_time)
        weight_s = 0.0  # the matmuls read their weights at the matmul rate
        traffic_s, overhead_s, layers = cpu_time.micro_batch_terms(c, ex)

    intra, inter, link_how = links(c)
    tp_s = tensor_parallel_time(c, layers, tokens, intra, link_how, matmul_s, on_gpu, ex)
    moe = {}
    if m.num_experts:
        gemm = (rate, tile if on_gpu else None, hbm if on_gpu else 0.0)
        moe = moe_seconds(c, tokens, gemm, ex)
        load = moe.pop("load")
        moe.update(dispatch_seconds(c, tokens, load, (intra, inter, link_how), matmul_s + attention_s, ex))
    terms = {
        "achievable_tflops": rate,
        "matmul_s": matmul_s,
        "attention_s": attention_s,
        "weight_read_s": weight_s,
        "gemm_operand_s": operand_s,
        "activation_traffic_s": traffic_s,
        "tensor_parallel_s": tp_s,
        "kernel_overhead_s": overhead_s,
    }
    return _micro_batch_sum(t, terms, moe, cast_s, ex)


def _micro_batch_sum(
    t: ResolvedTrainConfig, terms: dict[str, Any], moe: dict[str, Any], cast_s: float, ex: Explain
) -> dict[str, Any]:
    """The micro-batch's seconds from its terms: the compute or the weights' reads, whichever is longer, then
    everything that waits beside neither."""
    compute_s = terms["matmul_s"] + terms["attention_s"] + moe.get("expert_imbalance_s", 0.0)
    compute_s += moe.get("expert_tile_s", 0.0)
    weight_s, operand_s, traffic_s = terms["weight_read_s"], terms["gemm_operand_s"], terms["activation_traffic_s"]
    tp_s, overhead_s = terms["tensor_parallel_s"], terms["kernel_overhead_s"]
    moe_s = moe.get("dispatch_exposed_s", 0.0) + moe.get("permutation_s", 0.0)
    micro_s = max(compute_s, weight_s) + operand_s + traffic_s + tp_s + overhead_s + cast_s + moe_s
    bound = "compute" if compute_s >= weight_s else "memory"
    ex.add(
        "step_time",
        "micro_batch_s",
        micro_s,
        f"max(compute {compute_s:.4g}, weight reads {weight_s:.4g}) + "
        f"GEMM operands {operand_s:.4g} + activation traffic {traffic_s:.4g} + TP {tp_s:.4g} "
        f"+ kernel overhead {overhead_s:.4g}"
        + (f" + fp8 casts {cast_s:.4g}" if t.precision == "fp8" else "")
        + (f" + dispatch {moe['dispatch_exposed_s']:.4g} + permutation {moe['permutation_s']:.4g}" if moe else "")
        + ": "
        + ("compute-bound" if bound == "compute" else "memory-bound (the weights' reads set the floor)"),
    )
    out = {
        "achievable_tflops": terms["achievable_tflops"],
        "micro_batch_s": micro_s,
        "matmul_s": terms["matmul_s"],
        "attention_s": terms["attention_s"],
        "weight_read_s": weight_s,
        "gemm_operand_s": operand_s,
        "activation_traffic_s": traffic_s,
        "tensor_parallel_s": tp_s,
        "kernel_overhead_s": overhead_s,
        "bound": bound,
        **moe,
    }
    return {**out, "fp8_cast_s": cast_s} if t.precision == "fp8" else out


def _output_layer_s(c: ResolvedConfig, counts: ParamCounts, rate: float) -> float:
    """One micro-batch's output-layer matmul, 6 V H FLOPs a token over the tensor ranks, at the large-GEMM rate:
    what the last pipeline stage runs besides its blocks."""
    tokens = c.train.micro_batch_size * c.train.seq_len
    tile = tokens / (TILE_ROWS * math.ceil(tokens / TILE_ROWS)) if gpu_spec(c.hardware.gpu).name != "cpu" else 1.0
    return 6 * counts.vocab_hidden * tokens / c.parallel.tensor / (rate * 1e12 * tile)


def _achievable_tflops(hw: HardwareConfig, spec: GpuSpec, peak: float) -> tuple[float, str]:
    """What the matmuls reach: a profile's measured rate, else the peak x the large-GEMM efficiency."""
    if hw.profile and not hw.peak_tflops:
        return peak, "hardware.profile's measured TFLOP/s"
    share, why = 1.0, ""
    if spec.name in HOPPER_GPUS:
        share, why = HOPPER_MATMUL_SHARE, "Hopper, fitted to published H100 runs"
    elif spec.name in BLACKWELL_GPUS:
        share, why = BLACKWELL_MATMUL_SHARE, "Blackwell's best-shape matmul against an A100's"
    return peak * MATMUL_EFFICIENCY * share, f"peak {peak:g} x {MATMUL_EFFICIENCY} (large-GEMM efficiency)" + (
        f" x {share:.3g} ({why})" if share != 1 else ""
    )


def _attention_seconds(
    c: ResolvedConfig, spec: GpuSpec, attention: float, tokens: int, peak: float, rate: float
) -> tuple[float, str]:
    """The attention kernel's seconds for one micro-batch, and how: FlashAttention-2's share of the peak on
    Hopper, else a share of the GEMM rate."""
    hw, shard = c.hardware, c.parallel.tensor * c.parallel.pipeline
    hopper = spec.name in HOPPER_GPUS and not (hw.profile and not hw.peak_tflops)
    attention_rate = peak * HOPPER_ATTENTION_PEAK if hopper else rate * ATTENTION_EFFICIENCY
    attention_how = (
        f"peak {peak:g} x {HOPPER_ATTENTION_PEAK} (FlashAttention-2 on Hopper)"
        if hopper
        else f"{rate:.4g} x {ATTENTION_EFFICIENCY}"
    )
    d = c.model.head_dim
    if spec.name != "cpu" and d < 128:  # a GPU kernel's tiles; a CPU's attention is plain matmuls
        attention_rate *= (d / 128) ** HEAD_DIM_EXPONENT
        attention_how += f" x ({d}/128)^{HEAD_DIM_EXPONENT} (head dimension)"
    return attention * tokens / shard / (attention_rate * 1e12), (
        f"{attention:,.0f} attention FLOPs/token (as the plan counts them) x {tokens:,} / {shard} / ({attention_how})"
    )


def _memory_bound_terms(
    c: ResolvedConfig, counts: ParamCounts, hbm: float, on_gpu: bool, ex: Explain
) -> tuple[float, float, int]:
    """(seconds reading the weights, seconds of activation traffic, layers on this GPU)."""
    m, t, par, hw = c.model, c.train, c.parallel, c.hardware
    a = COMPUTE_BYTES[t.precision]
    shard = par.tensor * par.pipeline
    bw_how = f"{memory_bandwidth_gbps(hw):g} GB/s x {BANDWIDTH_EFFICIENCY}" if hbm else "no HBM figure: not modelled"
    reads = weight_reads(t)
    read = weight_params(c, counts)
    weights = reads * a * read / shard
    weight_s = weights / (hbm * 1e9) if hbm else 0.0
    ex.add(
        "step_time",
        "weight_read_s",
        weight_s,
        f"{reads} reads x {a} bytes x {read:,} / {shard} = {weights:.4g} bytes / {bw_how}",
    )
    native = planned_native_gqa(c)
    imbalance = c.plan.routing_imbalance
    traffic, act = kept_tensor_traffic(m, t, par, native_gqa=native, imbalance=imbalance)
    if t.activation_checkpointing != "none":  # what the recomputation writes again in backward
        recomputed = activation_bytes(m, t, par, native_gqa=native, imbalance=imbalance)["per_layer"]
        traffic += act["layers"] * (act["per_layer"] - recomputed)
    kept_how = f"{traffic:.4g} bytes: those kept for backward written and read" + (
        ", the recomputed ones written again" if t.activation_checkpointing != "none" else ""
    )
    if not compile_enabled(t.compile, "cpu" if not on_gpu else "cuda"):  # eager: every elementwise op a kernel
        eager = eager_elementwise_traffic(m, t, par, act["layers"])
        if eager > traffic:
            kept_how = (
                f"{eager:.4g} bytes that eager mode's elementwise kernels read and write (more than "
                f"the kept tensors' {traffic:.4g}; train.compile off)"
            )
            traffic = eager
    traffic_s = traffic / (hbm * 1e9) if hbm else 0.0
    ex.add("step_time", "activation_traffic_s", traffic_s, f"{kept_how} / {bw_how}")
    return weight_s, traffic_s, act["layers"]


def _kernel_overhead(c: ResolvedConfig, layers: int, ex: Explain) -> float:
    """Seconds of per-kernel overhead of one micro-batch (eager PyTorch's dispatch and launch)."""
    t = c.train
    per_layer = KERNELS_PER_LAYER + RECOMPUTED_KERNELS[t.activation_checkpointing]
    routed = -(-moe_layers(c.model) // c.parallel.pipeline)  # an MoE block's routing, sorting and exchanges
    overhead_s = (layers * per_layer + routed * MOE_KERNELS + KERNELS_OUTSIDE) * KERNEL_OVERHEAD_S
    ex.add(
        "step_time",
        "kernel_overhead_s",
        overhead_s,
        f"({layers} layers x {per_layer} + {KERNELS_OUTSIDE}"
        + (f" + {routed} MoE layers x {MOE_KERNELS}" if routed else "")
        + f") kernels x {KERNEL_OVERHEAD_S * 1e6:g} us (eager PyTorch's dispatch and launch)",
    )
    return overhead_s
