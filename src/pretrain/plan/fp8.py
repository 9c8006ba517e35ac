"""train.precision=fp8 in the planner: which GEMMs run in float8, what they cost and save, and the MFU under
two peaks. Pure Python; the trainer converts and splits by the same rules (`converts`, `float8_tensor_parallel`;
distributed/fp8.py).

  GEMMs    each block linear whose dimensions are multiples of 16 and >= train.fp8_min_features; the output
           layer stays bf16. Their 6 K N FLOPs per token (8 K N with full recomputation) run at the catalog's
           fp8 peak x the same large-GEMM efficiency as bf16's; the rest at the bf16 rate.
  casts    torchao scales and casts each operand before its GEMM: memory-bound kernels that do not overlap
           the matmuls. Per micro-batch and linear, its activations (b*s x (K + N) elements, forward input
           and backward gradient, each used twice) cost CAST_BYTES each (tensorwise: read bf16 for the amax,
           read it again and write float8 = 5 bytes; rowwise casts each operand again along the other axis
           for backward: 7), its weight 9 bytes an element (fp32 read twice, float8 written). A modelled
           assumption, not a measurement: what makes small shapes gain little or lose (pytorch/ao #572),
           since the casts grow with K + N and the GEMM with K N.
  memory   the converted weights keep no bf16 autocast copy (torchao saves the fp32 weight and casts again
           in backward); under FSDP with tensorwise scaling they are all-gathered in float8 (1 byte, not 2).
           Scales (one fp32 per tensor or per row) are left out: kilobytes.
  TP       with sequence parallelism, tensorwise on a GPU, the converted linears' all-gathers carry float8
           (torchao's Float8ColwiseParallel / Float8RowwiseParallel), the reduce-scatters bf16: x 0.75 of
           the tensor-parallel bytes when all four of a block's split linears convert.
  MFU      `mfu` is against the bf16 dense peak, the figure comparable with a bf16 run
           (`mfu_bf16_peak`); `mfu_mixed_peak` is against the peak of the job's own GEMM mix, the FLOPs-weighted
           harmonic mean of the fp8 and bf16 peaks (torchtitan reports no MFU under float8 for want of it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..gpus import gpu_spec
from .params import param_shapes

if TYPE_CHECKING:
    from ..config.schema import Config, ResolvedConfig

MULTIPLE = 16  # float8 tensor cores take dimensions in multiples of 16
CPU_ADVICE = (
    "fp8 on a CPU is an emulation, for checking float8 numerics (debug.fp8_check) before a GPU run, not for "
    "speed: a CPU has no float8 units, so torchao casts every operand to float8 and back element by element "
    "and multiplies in fp32 (~5x slower than bf16-mixed at hidden 128: docs/benchmarks.md); "
    "train with bf16-mixed on a CPU"
)
CAST_BYTES = {"tensorwise": 5, "rowwise": 7}
WEIGHT_CAST_BYTES = 9


def converts(name: str, in_features: int, out_features: int, min_features: int) -> bool:
    """Whether the linear `name` (its path in the model: `blocks.3.mlp.up`) multiplies in float8."""
    return (
        name.startswith("blocks.")
        and in_features % MULTIPLE == 0
        and out_features % MULTIPLE == 0
        and min(in_features, out_features) >= min_features
    )


def gemms(c: ResolvedConfig) -> dict[str, Any]:
    """The linears of the model under the filter: how many convert and are skipped (the output layer among
    them), the (K, N) of one block's converted ones, and the model FLOPs per token they carry."""
    m, t = c.model, c.train
    block = [(n.removesuffix(".weight"), s) for n, s in param_shapes(m) if len(s) == 2 and n.startswith("blocks.0.")]
    shapes = [(s[1], s[0]) for n, s in block if converts(n, s[1], s[0], t.fp8_min_features)]  # (out, in) rows
    return {
        "recipe": t.fp8_recipe,
        "linears": len(shapes) * m.num_layers,  # + 1 skipped: the output layer
        "skipped": (len(block) - len(shapes)) * m.num_layers + 1,
        "shapes": shapes,
        "per_token": 6 * sum(k * n for k, n in shapes) * m.num_layers,
    }


def peaks(c: ResolvedConfig) -> tuple[float | None, float | None]:
    """(fp8, bf16) data-sheet peaks of the card, None where the catalog has none (a CPU, another GPU)."""
    spec = gpu_spec(c.hardware.gpu).peak_tflops
    return spec.get("fp8"), spec.get("bf16")


def mixed_peak(fp8_flops: float, flops: float, fp8: float, bf16: float) -> float:
    """The peak of a FLOP mix: the harmonic mean of the two peaks weighted by the FLOPs each runs."""
    return flops / (fp8_flops / fp8 + (flops - fp8_flops) / bf16)


def matmul_seconds(
    c: ResolvedConfig, matmul: float, tokens: int, shard: int, rate: float, tile: float, hbm: float
) -> tuple[Any, ...]:
    """(GEMM seconds, cast seconds, the line for --explain) of one micro-batch's `matmul` hardware FLOPs per
    token under fp8: the converted GEMMs at the fp8 rate, the rest at `rate`, the casts at HBM bandwidth."""
    g = gemms(c)
    recompute = 8 / 6 if c.train.activation_checkpointing == "full" else 1.0  # forward again
    fp8_flops = min(g["per_token"] * recompute, matmul)
    fp8_peak, bf16_peak = peaks(c)
    speedup = fp8_peak / bf16_peak if fp8_peak and bf16_peak else 1.0
    gemm_s = ((matmul - fp8_flops) + fp8_flops / speedup) * tokens / shard / (rate * 1e12 * tile)
    layers = c.model.num_layers / c.parallel.pipeline
    cast_bytes = (
        layers
        / c.parallel.tensor
        * sum(CAST_BYTES[c.train.fp8_recipe] * 2 * tokens * (k + n) + WEIGHT_CAST_BYTES * k * n for k, n in g["shapes"])
    )
    cast_s = cast_bytes / (hbm * 1e9) if hbm else 0.0
    how = (
        f"{fp8_flops:,.0f} of {matmul:,.0f} FLOPs/token in float8 ({g['linears']} linears) at {speedup:g}x the "
        f"rate, the rest at {rate:.4g} TFLOP/s; casts {cast_bytes:.4g} bytes at HBM"
        + ("" if hbm else " (no HBM figure: not modelled)")
    )
    return gemm_s, cast_s, how


def mfu_fields(c: ResolvedConfig, fl: dict[str, Any], mfu_bf16: float | None, model_per_token: float) -> dict[str, Any]:
    """`mfu_bf16_peak` (= mfu) and `mfu_mixed_peak` of a modelled or measured speed."""
    fp8_peak, bf16_peak = peaks(c)
    out = {"mfu_bf16_peak": mfu_bf16, "mfu_mixed_peak": None}
    if fp8_peak and bf16_peak and mfu_bf16 is not None:
        peak = mixed_peak(min(gemms(c)["per_token"], model_per_token), model_per_token, fp8_peak, bf16_peak)
        out["mfu_mixed_peak"] = mfu_bf16 * bf16_peak / peak
    return out


CONVENTION = (
    "; mfu: against the bf16 dense peak (= mfu_bf16_peak, comparable with a bf16 run); "
    "mfu_mixed_peak: against the FLOPs-weighted harmonic mean of the fp8 peak (the converted linears' "
    "FLOPs) and the bf16 peak (the rest)"
)


# Tensor parallelism's linears by how they split: a column split all-gathers its input in forward (again in
# the recomputed forward), a row split all-gathers its output's gradient in backward (distributed/
# tensor_parallel.py); both reduce-scatter the other way, in bf16 (torchao casts no reduction's input).
COLUMN_SPLITS = ("attn.qkv", "mlp.up")
ROW_SPLITS = ("attn.proj", "mlp.down")


def float8_tensor_parallel(config: Config, device_type: str) -> bool:
    """Whether tensor parallelism splits the Float8Linears with torchao's Float8ColwiseParallel /
    Float8RowwiseParallel (as torchtitan does) rather than torch's ColwiseParallel / RowwiseParallel: one rule
    for the trainer (distributed/fp8.py) and the planner's bytes (tensor_parallel_bytes).

    torchao's styles cast a linear's input to float8 before the sequence-parallel all-gather and its output's
    gradient before the backward's, so those all-gathers carry 1 byte a value, not bf16's 2. Only:
      - on CUDA: NCCL carries float8 tensors, gloo does not ("Invalid scalar type", torch 2.13), so CPU runs
        (and CI's tests) keep torch's styles, whose collectives are bf16;
      - tensorwise: torchao's styles cast with one scale per tensor, not rowwise's per-row scales;
      - without debug.fp8_check: its bf16 shadow needs each linear's input before the float8 cast."""
    t = config.train
    return (
        t.precision == "fp8" and t.fp8_recipe == "tensorwise" and device_type == "cuda" and not config.debug.fp8_check
    )


def tensor_parallel_bytes(c: ResolvedConfig, collectives: int, on_gpu: bool) -> float:
    """The share of tensor parallelism's bf16 bytes it moves under fp8 (1.0: no change). With sequence
    parallelism each of a block's `collectives` all-reduce-sized steps is an all-gather + a reduce-scatter;
    where the trainer uses torchao's float8 styles (float8_tensor_parallel), each linear the filter converts
    all-gathers in float8 (1 byte a value, not 2). All four converted: 0.75."""
    t = c.train
    if not (c.parallel.sequence_parallel and float8_tensor_parallel(c, "cuda" if on_gpu else "cpu")):
        return 1.0
    shapes = {n.removesuffix(".weight"): s for n, s in param_shapes(c.model) if n.startswith("blocks.0.")}
    gathers = {"forward": 2 if t.activation_checkpointing == "full" else 1, "backward": 1}  # each split's
    halved = 0
    for splits, when in ((COLUMN_SPLITS, "forward"), (ROW_SPLITS, "backward")):
        for name in splits:
            s = shapes.get(f"blocks.0.{name}")
            if s and converts(f"blocks.0.{name}", s[1], s[0], t.fp8_min_features):
                halved += gathers[when]
    return 1 - halved / (4 * collectives)  # of 2 x collectives steps of 2 bytes a value, each saves 1


def gathered_bytes_saved(c: ResolvedConfig, converted_numel: int) -> int:
    """Bytes FSDP's gathered copies save when tensorwise all-gathers the converted weights in float8."""
    return converted_numel if c.train.fp8_recipe == "tensorwise" and c.parallel.fsdp else 0


def converted_numel_per_layer(c: ResolvedConfig) -> int:
    """Elements of one block's converted weights (all tensor ranks together)."""
    return sum(k * n for k, n in gemms(c)["shapes"])


PAYS = 1.10  # a modelled speed-up below this is not worth float8's numerics (its risk is the run's)


def advice(c: ResolvedConfig, p: dict[str, Any]) -> list[str]:
    """fp8 that converts no linear (on any device: the run is bf16-mixed under another name), on a CPU what fp8
    there is for, and fp8 where the model says it will not pay: the speed-up over bf16-mixed, modelled, for this
    shape."""
    if c.train.precision != "fp8":
        return []
    g, least = gemms(c), c.train.fp8_min_features
    lines: list[str] = []
    if not g["linears"]:
        lines.append(
            f"fp8: no linear converts (none of the blocks' linears has both sides multiples of {MULTIPLE} and "
            f">= train.fp8_min_features={least}), so every GEMM runs in bf16, as under bf16-mixed; lower "
            f"train.fp8_min_features (their narrower sides here: {_widths(c)}) or use train.precision=bf16-mixed"
        )
    if gpu_spec(c.hardware.gpu).name == "cpu":
        lines.append(CPU_ADVICE)
    if lines or not p.get("step_time") or not peaks(c)[0]:
        return lines  # or a card the catalog lacks: no float8 rate to weigh
    from ..config import replaced
    from . import plan_with_explain

    bf16 = plan_with_explain(replaced(c, {"train.precision": "bf16-mixed"}), advice=False)[0]["step_time"]
    speedup = bf16["seconds"] / p["step_time"]["seconds"]
    if speedup >= PAYS:
        return []
    what = (
        f"{g['linears']} linears in float8, whose casts take back what their faster GEMMs save at hidden "
        f"{c.model.hidden_size:,} and {c.train.micro_batch_size} x {c.train.seq_len:,} tokens"
    )
    return [
        (
            f"fp8: modelled at {speedup:.2f}x bf16-mixed's speed ({what}); below {PAYS:.2f}x float8 does not "
            "pay for its numerics: use train.precision=bf16-mixed"
        )
    ]


def _widths(c: ResolvedConfig) -> str:
    """The smaller dimension of each of a block's linears, as the filter compares it: "64, 176"."""
    block = [s for n, s in param_shapes(c.model) if len(s) == 2 and n.startswith("blocks.0.")]
    return ", ".join(str(w) for w in sorted({min(s) for s in block}))
