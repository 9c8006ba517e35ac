"""The planner: parameters, FLOPs, memory per GPU, data, steps and time of a pretraining run.

Pure Python (no torch, no numpy), so `pretrain plan` answers instantly anywhere. `make_plan(config)` returns the
JSON-ready dict whose keys are documented in docs/plan.md ("The JSON").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import ResolvedConfig, replaced
from ..errors import ConfigError
from ..gpus import gpu_spec
from .advice import advise
from .budget_mode import apply_budget, budget_requested
from .corpus import corpus_supply
from .eval_tasks import eval_tasks_cost
from .explain import Explain
from .flops import basis, flops, utilisation
from .fp8 import CONVENTION as FP8_CONVENTION
from .frameworks import framework_memory
from .hardware import memory_bandwidth_gbps, peak_tflops
from .kernels import planned_switches
from .length import storage_bytes, token_bytes, token_dtype, training_length, wall_clock
from .memory import memory
from .mixture import mixture_supply
from .model_states import model_state_tensors
from .params import count_params, padded_vocab_size, param_shapes
from .step_time import step_time

if TYPE_CHECKING:
    from ..config.job_sections import ParallelConfig
    from ..config.planner_sections import HardwareConfig
    from ..config.schema import ResolvedModelConfig
    from .params import ParamCounts

__all__ = [
    "make_plan",
    "plan_with_explain",
    "planned_config",
    "count_params",
    "param_shapes",
    "storage_bytes",
    "model_state_tensors",
]

# The planner lists every parameter tensor (ZeRO-1's partition is greedy per tensor, as torch's is), so its
# cost grows with the layer count: ~0.3 s at 1,000 layers, minutes and gigabytes at 10^12. 1,000 layers is
# the deepest published Transformer (DeepNet, Wang et al. 2022, "Scaling Transformers to 1,000 Layers").
MAX_LAYERS = 1000


def make_plan(config: ResolvedConfig) -> dict[str, Any]:
    """The plan for a resolved config (see `pretrain.config.load_config`)."""
    return plan_with_explain(config)[0]


def plan_with_explain(config: ResolvedConfig, advice: bool = True) -> tuple[dict[str, Any], Explain]:
    """The plan and its explain trail; `advice=False` skips the warnings (which re-plan modified copies).
    Budget mode (budget.* keys) plans a new config of the model it chooses (pretrain.plan.budget_mode);
    `config` is never changed, and `planned_config(config, result)` rebuilds the config that was planned."""
    c = config
    _check_depth(c.model)
    ex = Explain()
    budget = None
    if budget_requested(c):  # budget mode chooses a model, then that model's config is planned as usual
        budget, c = apply_budget(c, ex)
    c = planned_switches(c)  # train.half_residual: null resolved for the planned device
    counts = count_params(c.model)
    _explain_params(c.model, counts, ex)

    length = training_length(c, counts.active, ex)
    fl = flops(c, counts, length["tokens"], ex)
    if c.train.precision == "fp8":
        fl["convention"] += FP8_CONVENTION
    peak, peak_source = peak_tflops(c.hardware, c.train.precision)
    model_pt, hw_pt, _ = basis(c, fl)
    step = step_time(c, counts, fl, peak, ex)
    time = wall_clock(c, length, model_pt, hw_pt, peak, step, ex)  # the step-time model's, unless hardware.mfu
    if step:  # the model's own figures, also beside a hardware.mfu / hfu override (pretrain.plan.step_time)
        _add_modelled_time(time, step, length["steps"], ex)
    mem = memory(c, counts, ex)
    storage, ckpt = _storage_and_checkpoint(c, length, ex)

    result = {
        "model": {k: v for k, v in vars(c.model).items()},
        "params": counts.as_dict(),
        "flops": fl,
        "tokens": _tokens(length, counts.active),
        "storage_bytes": storage,
        "checkpoint_bytes": ckpt,
        "steps": _steps(length),
        "time": time,
        "step_time": step,
        **_memory_and_fit(mem),
        "parallel": _layout(c.parallel, moe=bool(c.model.num_experts)),
        "hardware": _hardware(c.hardware, mem["fit"]["device_bytes"], peak, peak_source),
    }
    if "moe" in mem:  # Mixture-of-Experts: expert parallelism and the routing imbalance the run can take
        result["moe"] = mem["moe"]
    if budget:
        result["budget"] = budget
    _optional_sections(c, result, length, model_pt, peak, ex)
    if advice:
        result["advice"] = advise(c, result)
    return result, ex


def _check_depth(m: ResolvedModelConfig) -> None:
    if m.num_layers > MAX_LAYERS:
        raise ConfigError(
            f"model.num_layers: {m.num_layers:,} is beyond what the planner models (at most "
            f"{MAX_LAYERS:,}, the deepest published Transformer); give a smaller depth"
        )


def _add_modelled_time(time: dict[str, Any], step: dict[str, Any], steps: int, ex: Explain) -> None:
    """The step-time model's run time, throughput and MFU beside the time the plan uses."""
    time["modelled_seconds"] = ex.add(
        "time",
        "modelled_seconds",
        step["seconds"] * steps,
        f"{steps:,} steps x step_time.seconds {step['seconds']:.4g}",
    )
    time["modelled_tokens_per_second"] = step["tokens_per_second"]
    time["modelled_mfu"] = step["mfu"]


def _tokens(length: dict[str, Any], params: int) -> dict[str, Any]:
    return {
        "total": length["tokens"],
        "chinchilla": length["chinchilla"],
        "per_parameter": length["tokens"] / params,
    }


def _steps(length: dict[str, Any]) -> dict[str, Any]:
    return {
        "total": length["steps"],
        "tokens_per_step": length["tokens_per_step"],
        "examples_per_step": length["examples_per_step"],
        "warmup": length["warmup"],
    }


def _memory_and_fit(mem: dict[str, Any]) -> dict[str, Any]:
    """The plan's top-level memory keys: bytes per GPU, the model states, and whether the step fits."""
    fit = mem["fit"]
    return {
        "memory_bytes": mem["memory_bytes"],
        "model_states": mem["model_states"],
        "fits": fit["fits"],
        "max_micro_batch_size": fit["max_micro_batch_size"],
        "device_memory_bytes": fit["device_bytes"],
        "usable_memory_bytes": fit["usable_bytes"],
    }


def _layout(par: ParallelConfig, moe: bool) -> dict[str, Any]:
    """The process grid; a Mixture-of-Experts model's also its expert-parallel degree (other plans unchanged)."""
    layout = {
        "world": par.gpus,
        "data": par.data_parallel,
        "tensor": par.tensor,
        "pipeline": par.pipeline,
        "zero_stage": par.zero_stage,
    }
    return {**layout, "expert": par.expert} if moe else layout


def _hardware(hw: HardwareConfig, device_bytes: int | None, peak: float | None, peak_source: str) -> dict[str, Any]:
    return {
        "gpu": gpu_spec(hw.gpu).name,
        "peak_tflops": peak,
        "peak_source": peak_source,
        "memory_bytes": device_bytes,
        "bandwidth_gbps": memory_bandwidth_gbps(hw),
    }


def _explain_params(m: ResolvedModelConfig, counts: ParamCounts, ex: Explain) -> None:
    ex.add("params", "total", counts.total, _params_formula(m, counts))
    ex.add(
        "params",
        "embedding",
        counts.embedding,
        "input lookups: token table V x H" + (" + positions max_seq_len x H" if counts.position_embedding else ""),
    )
    ex.add(
        "params",
        "flops (N of 6N)",
        counts.flops,
        "total - input embedding" + (" + tied output layer V x H" if m.tie_embeddings else ""),
    )


def _storage_and_checkpoint(c: ResolvedConfig, length: dict[str, Any], ex: Explain) -> tuple[int, int]:
    """Bytes of the token files (each example once: the epochs re-read the same file) and of one checkpoint."""
    data, tokens = length["data_tokens"], length["tokens"]
    storage = storage_bytes(data, c.model.vocab_size)
    ex.add(
        "tokens",
        "storage_bytes",
        storage,
        f"{data:,} tokens"
        + (f" (examples {c.train.examples:,} x seq {c.train.seq_len})" if data != tokens else "")
        + f" x {token_bytes(c.model.vocab_size)} bytes "
        f"({token_dtype(c.model.vocab_size)} for vocabulary {c.model.vocab_size:,})",
    )
    full = _unsharded(c)
    ckpt = full["parameters"] + full["optimizer_states"]
    ex.add(
        "tokens",
        "checkpoint_bytes",
        ckpt,
        f"parameters {full['parameters']:,} + optimizer states {full['optimizer_states']:,} (all ranks together)",
    )
    return storage, ckpt


def _optional_sections(
    c: ResolvedConfig, result: dict[str, Any], length: dict[str, Any], model_pt: int, peak: float | None, ex: Explain
) -> None:
    """The sections only some configs have: another framework's memory, the corpus, a mixture, in-loop
    evaluations, a measured run."""
    time, tokens = result["time"], length["tokens"]
    if c.plan.framework != "pretrain":  # the default plan stays as it was, key for key
        result["framework"] = framework_memory(c, ex)
    supply = corpus_supply(c, tokens, ex)
    if supply:
        result["data"] = supply
    mixture = mixture_supply(c, tokens, ex)
    if mixture:
        result["mixture"] = mixture
    tasks = eval_tasks_cost(
        c,
        length["steps"],
        model_pt,
        peak,
        (supply or {}).get("bytes_per_token"),
        time["seconds"],
        time["utilisation"],
        ex,
    )
    if tasks:  # run.eval_tasks: the in-loop evaluations' time beside the training's
        result["eval_tasks"] = tasks
        time["eval_tasks_seconds"], time["eval_tasks_share"] = tasks["seconds"], tasks["share_of_run"]
    measured = utilisation(c, result["flops"], length["tokens_per_step"], peak, ex)
    if measured:
        result["measured"] = measured
        result["mfu"] = measured["mfu"]
        result["hfu"] = measured["hfu"]


def planned_config(config: ResolvedConfig, result: dict[str, Any]) -> ResolvedConfig:
    """The config a plan describes: `config` itself, or in budget mode the chosen model's (a new object)."""

    return replaced(config, result["budget"]["overrides"]) if "budget" in result else config


def _unsharded(c: ResolvedConfig) -> dict[str, Any]:
    """Model-state tensors of the whole job on one imaginary device (for the checkpoint size)."""
    import dataclasses

    single = dataclasses.replace(
        c,
        parallel=dataclasses.replace(c.parallel, gpus=1, tensor=1, pipeline=1, zero_stage=0, expert=1, expert_tensor=1),
    )
    return model_state_tensors(single)


def _params_formula(m: ResolvedModelConfig, counts: ParamCounts) -> str:
    if (
        m.family == "llama"
        and m.num_kv_heads == m.num_heads
        and m.head_dim * m.num_heads == m.hidden_size
        and not m.qkv_bias
        and not m.qk_norm
    ):
        V, H, I, L = padded_vocab_size(m), m.hidden_size, m.intermediate_size, m.num_layers
        head = "2VH" if not m.tie_embeddings else "VH"
        padded = f" (vocabulary {m.vocab_size:,} padded to a multiple of {m.pad_vocab_to})" if V != m.vocab_size else ""
        return (
            f"{head} + H + L(4H^2 + 3HH' + 2H) with V={V:,}{padded}, H={H:,}, H'={I:,}, L={L}: "
            f"{'' if m.tie_embeddings else '2x'}{V * H:,} + {H:,} + {L} x {counts.per_layer:,}"
        )
    padded = f" (vocabulary {m.vocab_size:,} padded to {padded_vocab_size(m):,})" if m.pad_vocab_to > 1 else ""
    return (
        f"embedding {counts.token_embedding:,}{padded} + positions {counts.position_embedding:,} + {m.num_layers} "
        f"layers x {counts.per_layer:,} (attention {counts.attention // m.num_layers:,}, MLP "
        f"{counts.mlp // m.num_layers:,}, norms) + final norm + output {counts.output:,}"
    )
