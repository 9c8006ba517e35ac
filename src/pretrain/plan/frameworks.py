"""Memory per GPU as other frameworks account for it (`plan.framework`), each formula with its source.

  pretrain    what our trainer holds (pretrain.plan.memory): the default, and the only byte-exact one.
  megatron    Megatron-LM: bf16 parameters (2 bytes), fp32 main gradients (4), fp32 master weights and Adam
              moments (12), the 12 sharded over data parallel by its distributed optimizer (our
              parallel.zero_stage >= 1): 18 or 6 + 12/dp bytes per parameter of the most loaded shard,
              (layers / pp + embedding) / tp, plus the untied output layer when pp = 1 (Megatron-LM
              megatron/training/theoretical_memory_usage.py, commit 00caa53).
  deepspeed   DeepSpeed ZeRO's model-state estimators, estimate_zero2_model_states_mem_needs (ZeRO-1 and -2
              share its optimizer and its estimate) and estimate_zero3_model_states_mem_needs, as the code that
              printed the tables of DeepSpeed's docs/code-docs/source/memory.rst ("Memory Requirements": t5-3b on
              8 GPUs, t5-large on 4) computes them (DeepSpeed #965, commit 0c1802c; stage 3 unchanged through
              38327e0): per GPU 4 + 16/N bytes per parameter for stages 1-2, 2 with the optimizer offloaded;
              4 x the largest layer gathered + 18/N for stage 3 (+ 2/N with the optimizer offloaded, nothing more
              with parameters offloaded too); per node the host RAM the estimator adds its 1.5 buffer to (stage
              3: with zero.Init, zero_init=1, as our trainer builds a sharded model, and without it). Since
              v0.14.3 (#5099) the stage 1-2 estimate is 2 + 18/N: --explain gives both.
              Stage 0 is the ZeRO paper's baseline, 16 bytes per parameter.
  zero-paper  Rajbhandari et al. 2020 ("ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
              section 5.1, figure 1): fp16 weights 2, fp16 gradients 2 and K = 12 bytes of fp32 master weights,
              momentum and variance per parameter; stage 1 shards the 12, stage 2 also the gradients, stage 3
              also the weights; model parallelism divides the parameters first (its table 1).
The estimators count model states only. So that the total says whether a run fits, every framework mode adds
the activations as Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
section 4, table 2) count them for 16-bit activations, per layer:
  no parallelism sbh(34 + 5as/h); tensor parallel sbh(10 + 24/t + 5as/ht); + sequence parallel sbh/t (34 +
  5as/h); selective recomputation (Megatron's: core attention) drops the 5as/h scores term, as flash attention
  does (no s x s scores kept; our train.attention=sdpa); full recomputation keeps 2sbh (the layer input).
The 34 is the paper's GPT layer (4h MLP with GeLU, dropout): its MLP term 16 becomes 4 x 2 x H'/h for SwiGLU
(gate|up output, silu and product) and 2 x 2 x H'/h for a GELU MLP of width H'; no dropout drops the two 1-byte
masks and the attention-dropout share of the scores term (5as/h -> 2as/h); grouped-query attention shrinks
the K and V terms by kv_heads / heads. The first pipeline stage holds min(p, m) micro-batches of L/p layers
(the paper's section 4.2.3; Megatron's report_theoretical_memory), the embedding's 8sb ids and sbh dropout
mask per micro-batch in flight, and with p = 1 the output layer's input and fp32 logits, 4sbh + 4sbV
(Megatron-LM's estimator). With sequence parallelism every term is divided by t, as that estimator does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..gpus import gpu_spec
from ..units import gib
from .explain import Explain
from .hardware import device_memory_bytes
from .params import param_shapes

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig, ResolvedModelConfig

FRAMEWORKS = ("pretrain", "megatron", "deepspeed", "zero-paper")

SOURCES = {
    "megatron": "Megatron-LM megatron/training/theoretical_memory_usage.py (commit 00caa53): 18 bytes/param, "
    "6 + 12/dp with the distributed optimizer, on the most loaded shard (layers/pp + embedding)/tp",
    "deepspeed": "DeepSpeed estimate_zero2/zero3_model_states_mem_needs (deepspeed/runtime/zero/stage_1_and_2.py, "
    "stage3.py) as they printed docs/code-docs/source/memory.rst 'Memory Requirements' tables "
    "(DeepSpeed #965, commit 0c1802c)",
    "zero-paper": "Rajbhandari et al. 2020, ZeRO, section 5.1 and figure 1: (2 + 2 + 12) bytes/param, K = 12",
    "activations": "Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large Transformer Models', "
    "section 4 and table 2 (16-bit activations)",
}
DEEPSPEED_HOST_BUFFER = 1.5  # the estimators' additional_buffer_factor for host RAM


def layer_activation_bytes(
    s: int,
    b: int,
    h: int,
    heads: int,
    t: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    flash: bool = False,
    mlp: float = 16.0,
    dropout: bool = True,
    kv_ratio: float = 1.0,
) -> float:
    """Korthikanti et al. 2022, table 2: bytes one transformer layer keeps for backward, per micro-batch.
    `mlp`: the MLP's sharded term in units of sbh (16 for the paper's 4h GeLU MLP); `kv_ratio`: kv heads / heads.
    """
    if recompute == "full":  # section 4.2: only the layer's input, 2sbh, split by t with sequence parallelism
        return 2 * s * b * h / (t if sequence_parallel else 1)
    replicated = 4 + 2 + 2 + (2 if dropout else 0)  # norm inputs, QKV and MLP inputs, two dropout masks
    sharded = 2 + 2 * kv_ratio + 2 * kv_ratio + 2 + mlp  # Q, K, V, output-projection input, MLP
    scores = 0.0 if recompute == "selective" or flash else (5 if dropout else 2) * heads * s / h
    if sequence_parallel:
        return s * b * h * (replicated + sharded + scores) / t
    return s * b * h * (replicated + (sharded + scores) / t)


def korthikanti_flops_per_token(
    s: int, layers: int, h: int, vocab: int, recompute: str = "none"
) -> tuple[float, float]:
    """(model, hardware) FLOPs per token, Korthikanti et al. 2022, appendix A (and section 6's table 5):
    model 72 l h^2 (1 + s/6h + V/12lh) per token (their 72Bslh^2 per iteration over Bs tokens); selective
    recomputation adds the attention scores' forward, 72 l h^2 (1 + s/3h + V/12lh); full recomputation
    repeats the layers' forward, 96 l h^2 (1 + s/6h + V/16lh)."""
    base = 72 * layers * h * h
    model = base * (1 + s / (6 * h) + vocab / (12 * layers * h))
    if recompute == "selective":
        return model, base * (1 + s / (3 * h) + vocab / (12 * layers * h))
    if recompute == "full":
        return model, 96 * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))
    return model, model


def _mlp_units(m: ResolvedModelConfig) -> float:
    """The MLP's sharded activation term in units of sbh (16 for the paper's 4h GeLU MLP)."""
    tensors = 4 if m.family == "llama" else 2  # SwiGLU: gate|up (2 wide), silu, product; GeLU: fc out, gelu out
    return 2 * tensors * m.intermediate_size / m.hidden_size


def activations(cfg: ResolvedConfig, ex: Explain) -> int:
    """Activation bytes of the most loaded (first) pipeline stage, Korthikanti et al.'s accounting."""
    m, t, par = cfg.model, cfg.train, cfg.parallel
    s, b, h = t.seq_len, t.micro_batch_size, m.hidden_size
    tp, pp, sp = par.tensor, par.pipeline, par.sequence_parallel
    split = tp if sp else 1
    dropout = m.dropout > 0
    flash = t.attention == "sdpa"
    per_layer = layer_activation_bytes(
        s,
        b,
        h,
        m.num_heads,
        tp,
        sp,
        t.activation_checkpointing,
        flash,
        _mlp_units(m),
        dropout,
        m.num_kv_heads / m.num_heads,
    )
    in_flight = min(pp, t.grad_accum_steps)
    layers = -(-m.num_layers // pp)
    total = per_layer * layers * in_flight
    ex.add(
        "framework",
        "activations per layer",
        gib(per_layer),
        f"table 2, recompute {t.activation_checkpointing}"
        + (", flash attention (no scores term)" if flash and t.activation_checkpointing != "selective" else "")
        + (f", tensor {tp}" if tp > 1 else "")
        + (", sequence parallel" if sp else "")
        + f": s={s}, b={b}, h={h}, heads={m.num_heads}, MLP term {_mlp_units(m):.4g} sbh",
    )
    working = 0.0
    if t.activation_checkpointing == "full":  # backward holds one recomputed layer's tensors at a time
        working = layer_activation_bytes(
            s,
            b,
            h,
            m.num_heads,
            tp,
            sp,
            "none",
            flash,
            _mlp_units(m),
            dropout,
            m.num_kv_heads / m.num_heads,
        )
    embedding = in_flight * (8 * s * b + (s * b * h if dropout else 0)) / split
    output = (4 * s * b * h / split + 4 * s * b * m.vocab_size / tp) if pp == 1 else 0
    total += working + embedding + output
    ex.add(
        "framework",
        "activations",
        gib(total),
        f"{layers} layers x {in_flight} micro-batch(es) in flight x {per_layer:,.0f}"
        + (f" + one recomputed layer {working:,.0f}" if working else "")
        + f" + embedding ids and dropout mask {embedding:,.0f}"
        + (f" + output layer input and fp32 logits 4sbh + 4sbV = {output:,.0f}" if output else ""),
    )
    return int(total)


def shard_params(cfg: ResolvedConfig) -> int:
    """Parameters on the most loaded (pipeline stage, tensor rank), as Megatron's estimator counts them:
    (blocks / pp + input embedding) / tp, plus the untied output layer when the one stage holds it."""
    m, par = cfg.model, cfg.parallel
    shapes = param_shapes(m)
    blocks = sum(_numel(s) for n, s in shapes if n.startswith(("blocks.", "norm.")))
    embedding = sum(_numel(s) for n, s in shapes if n in ("embed.weight", "pos_embed.weight"))
    output = sum(_numel(s) for n, s in shapes if n == "lm_head.weight")
    shard = (blocks / par.pipeline + embedding) / par.tensor
    if par.pipeline == 1:
        shard += output / par.tensor
    return int(shard)


def largest_layer_params(cfg: ResolvedConfig) -> int:
    """The largest module's parameters (DeepSpeed's largest_layer_params): ZeRO-3 gathers one module at a time."""
    modules: dict[str, int] = {}
    for name, shape in param_shapes(cfg.model):
        module = name.rsplit(".", 1)[0]
        modules[module] = modules.get(module, 0) + _numel(shape)
    return max(modules.values()) // cfg.parallel.tensor


def model_states(cfg: ResolvedConfig, ex: Explain) -> dict[str, Any]:
    """weights, gradients, optimizer (per GPU) and host (per node) bytes under the framework's accounting."""
    par = cfg.parallel
    dp = par.data_parallel
    states = framework_states(
        cfg.plan.framework,
        shard_params(cfg),
        dp,
        par.zero_stage if dp > 1 else 0,
        par.offload,
        largest_layer_params(cfg),
        min(par.gpus, par.gpus_per_node),
        par.gpus,
    )
    ex.add(
        "framework",
        "model states",
        gib(states["weights"] + states["gradients"] + states["optimizer"]),
        states.pop("formula"),
    )
    if "host_formula" in states:
        ex.add("framework", "host per node", gib(states["host"]), states.pop("host_formula"))
    if "differs" in states:
        ex.add("framework", "differs", cfg.plan.framework, states.pop("differs"))
    return states


def framework_states(
    name: str,
    psi: int,
    dp: int,
    stage: int,
    offload: str = "none",
    largest: int = 0,
    gpus_per_node: int = 8,
    gpus: int = 1,
) -> dict[str, Any]:
    """Model-state bytes per GPU of `psi` parameters (one model-parallel rank's) over `dp` data-parallel ranks,
    and host bytes per node, under framework `name`'s formulas (the module docstring lists their sources)."""
    if name == "deepspeed" and stage >= 1:
        return deepspeed_states(psi, dp, stage, offload, largest, gpus_per_node, gpus)
    if name == "megatron":
        distributed = stage >= 1
        weights, grads, optimizer = 2 * psi, 4 * psi, 12 * psi / (dp if distributed else 1)
        formula = (
            f"(2 bf16 params + 4 fp32 main grads + 12{f'/dp {dp}' if distributed else ''} fp32 master "
            f"weights and Adam moments) x {psi:,} params on the most loaded shard"
            + (" (distributed optimizer: parallel.zero_stage >= 1)" if distributed else "")
        )
    elif name == "zero-paper":
        weights = 2 * psi / (dp if stage >= 3 else 1)
        grads = 2 * psi / (dp if stage >= 2 else 1)
        optimizer = 12 * psi / (dp if stage >= 1 else 1)
        formula = f"2 + 2 + K=12 bytes x {psi:,} params per model-parallel rank, stage {stage} over data parallel {dp}"
    else:  # deepspeed without ZeRO
        weights, grads, optimizer = 2 * psi, 2 * psi, 12 * psi
        formula = f"no ZeRO: (2 + 2 + 12) x {psi:,} params (the ZeRO paper's baseline)"
    return dict(weights=int(weights), gradients=int(grads), optimizer=int(optimizer), host=0, formula=formula)


def deepspeed_states(
    psi: int, n: int, stage: int, offload: str, largest: int, gpus_per_node: int, gpus: int
) -> dict[str, Any]:
    """DeepSpeed's estimate_zero2/zero3_model_states_mem_needs for `psi` params over `n` GPUs, integer for integer:
    its per-GPU gpu_mem split into 16-bit weights, gradients and the fp32 master weights with Adam's moments
    (the optimizer), and its per-node cpu_mem as `host` (zero_init=1) and, for stage 3, `host_without_zero_init`.
    The tables of memory.rst are these figures in GiB (printed "GB") for t5-3b on one node of 8 GPUs."""
    buffer = DEEPSPEED_HOST_BUFFER
    optimizer = int(12 * psi / n)  # 4 fp32 master weights + 4 momentum + 4 variance, partitioned
    if stage in (1, 2) and offload != "none":  # only the 16-bit weights stay: gpu_mem = 2 * total_params
        return dict(
            weights=2 * psi,
            gradients=0,
            optimizer=0,
            host=int(psi * max(4 * gpus, 16) * buffer),
            formula=f"estimate_zero2, offload_optimizer=cpu: 2 x {psi:,}",
            host_formula=f"estimate_zero2, offload_optimizer=cpu: {psi:,} x max(4 x {gpus} GPUs, 16) x "
            f"{buffer} (the estimator's code counts all GPUs here, its docs' prose the node's: "
            "the same on one node)",
        )
    if stage in (1, 2):
        gpu = 4 * psi + int(16 * psi / n)  # the tables' (#965) gpu_mem: 16-bit weights and gradients whole
        now = 2 * psi + int(18 * psi / n)
        return dict(
            weights=2 * psi,
            gradients=gpu - 2 * psi - optimizer,
            optimizer=optimizer,
            host=int(psi * 4 * gpus_per_node * buffer),
            formula=f"estimate_zero2: 4 x {psi:,} + 16 x {psi:,} / {n} GPUs",
            host_formula=f"estimate_zero2: {psi:,} x 4 x {gpus_per_node} GPUs per node x {buffer} (the "
            "fp32 model each process builds before the engine moves it to its GPU)",
            differs=f"DeepSpeed's code since v0.14.3 (#5099, commit f4cb866) estimates 2 x {psi:,} + 18 x "
            f"{psi:,} / {n} = {gib(now)} per GPU, counting the 16-bit gradients partitioned "
            "with the fp32 states; the published tables and this mode keep #965's 4 + 16/N "
            f"({gib(gpu)}): 16-bit weights and gradients whole on every GPU",
        )
    live = 4 * largest  # the largest layer gathered: its 2-byte params and their 2-byte gradients
    nodes = gpus / gpus_per_node
    factor = 1 / nodes  # the estimator's gpus_factor
    if offload == "optimizer+params":
        weights, grads, optimizer = live // 2, live - live // 2, 0
        host, cold = psi * 18 * factor * buffer, psi * max(4 * gpus_per_node, 18 * factor) * buffer
        formula = f"estimate_zero3, offload_param=cpu, offload_optimizer=cpu: 4 x largest layer {largest:,}"
        host_formula = f"{psi:,} x 18 (fp32 params, grads, Adam moments + 16-bit params) / {nodes:g} nodes"
    elif offload == "optimizer":
        weights, grads, optimizer = live // 2 + int(2 * psi / n), live - live // 2, 0
        host, cold = psi * 16 * factor * buffer, psi * max(4 * gpus_per_node, 16 * factor) * buffer
        formula = f"estimate_zero3, offload_optimizer=cpu: 4 x largest layer {largest:,} + 2 x {psi:,} / {n} GPUs"
        host_formula = f"{psi:,} x 16 (fp32 params, grads, Adam moments) / {nodes:g} nodes"
    else:
        gpu = live + int(18 * psi / n)  # 16-bit params 2 + fp32 params 4, gradients 4, moments 8, partitioned
        grads = live - live // 2 + int(4 * psi / n)
        weights = gpu - grads - optimizer
        host, cold = largest * 4 * gpus_per_node * buffer, psi * 4 * gpus_per_node * buffer
        formula = f"estimate_zero3: 4 x largest layer {largest:,} + 18 x {psi:,} / {n} GPUs"
        host_formula = f"largest layer {largest:,} x 4 (fp32) x {gpus_per_node} GPUs per node"
    return dict(
        weights=weights,
        gradients=grads,
        optimizer=optimizer,
        host=int(host),
        host_without_zero_init=int(cold),
        formula=formula,
        host_formula=f"zero_init=1: {host_formula} x {buffer}; zero_init=0 (each of the {gpus_per_node} "
        f"processes builds the fp32 model on the host first): {gib(cold)}",
    )


MOE_NOT_MODELLED = (
    "Mixture-of-Experts is not modelled in this framework's published accounting (Megatron's "
    "theoretical memory ignores MoE activations, Megatron-LM #1784; DeepSpeed's and the ZeRO "
    "paper's estimators are dense): see the plan's own memory_bytes"
)


def framework_memory(cfg: ResolvedConfig, ex: Explain) -> dict[str, Any]:
    """The plan's "framework" entry: {"name", "memory_bytes": {...}, "fits", "sources"}."""
    name = cfg.plan.framework
    ex.add("framework", "name", name, SOURCES[name])
    if cfg.model.num_experts:  # their published formulas are dense: a number from them would be wrong
        ex.add("framework", "not modelled", name, MOE_NOT_MODELLED)
        return {"name": name, "not_modelled": MOE_NOT_MODELLED, "sources": [SOURCES[name]]}
    states = model_states(cfg, ex)
    act = activations(cfg, ex)
    on_gpu = gpu_spec(cfg.hardware.gpu).name != "cpu"
    context = int(cfg.hardware.cuda_context_gb * 1e9) if on_gpu else 0
    mem = dict(
        weights=states["weights"],
        gradients=states["gradients"],
        optimizer=states["optimizer"],
        activations=act,
        buffers=0,
        cuda_context=context,
    )
    mem["total"] = sum(mem.values())
    mem["host"] = states["host"]
    ex.add(
        "framework",
        "total",
        gib(mem["total"]),
        "model states + activations + cuda_context (no buffers: "
        "the framework's own communication buckets are not modelled)",
    )
    device = device_memory_bytes(cfg.hardware)
    fits = None if device is None else mem["total"] <= int(device * (1 - cfg.hardware.fragmentation))
    out = {"name": name, "memory_bytes": mem, "fits": fits, "sources": [SOURCES[name], SOURCES["activations"]]}
    if "host_without_zero_init" in states:  # DeepSpeed ZeRO-3: the estimator's zero_init=0 row
        out["host_without_zero_init"] = states["host_without_zero_init"]
    m = cfg.model
    model_flops, hardware_flops = korthikanti_flops_per_token(
        cfg.train.seq_len,
        m.num_layers,
        m.hidden_size,
        m.vocab_size,
        cfg.train.activation_checkpointing,
    )
    out["flops_per_token"] = {"model": model_flops, "hardware": hardware_flops}
    ex.add(
        "framework",
        "flops_per_token",
        model_flops,
        "72 l h^2 (1 + s/6h + V/12lh) (Korthikanti et al. 2022, "
        f"appendix A); hardware {hardware_flops:.4g} with {cfg.train.activation_checkpointing} recomputation",
    )
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for x in shape:
        n *= x
    return n
