"""What `pretrain train` runs, as one rule (no torch): `check_trainable` raises the ConfigError the trainer
refuses a config with, before anything heavy is built.

The trainer calls it first thing; `pretrain plan --fit` calls it on every layout it weighs and rejects the
refused ones with the trainer's own reason, so the fit never proposes a layout the trainer would refuse;
`pretrain sweep` calls it on every cell. The planner models more (offload, ZeRO 2/3 per pipeline stage, ...):
those values plan, and this is where they stop at training; `untrained` lists the keys whose `trains`
metadata (key_doc.py) excludes the value set.
"""

from __future__ import annotations

import dataclasses
import os

from ..errors import ConfigError
from ..gpus import caches_weight_casts, mixed_precision
from .key_doc import shown_value
from .model_section import ModelConfig
from .schema import SECTIONS, Config, padded_vocab_size, resolved


def check_trainable(config: Config, needs_data: bool = True) -> None:
    """Config errors the trainer (not the planner) refuses; `needs_data`: a data directory must be set."""
    t, par = config.train, config.parallel
    if t.grad_dtype == "same" and mixed_precision(t.precision):
        raise ConfigError(
            "train.grad_dtype: same (half-precision gradients) is a planning option; autocast keeps "
            "fp32 gradients: use train.grad_dtype=fp32 or train.precision=bf16"
        )
    if t.cache_weight_casts and not caches_weight_casts(t, par):  # a switch that would do nothing is said
        raise ConfigError(
            "train.cache_weight_casts: autocast's cast cache spans a step under bf16-mixed, "
            "fp16-mixed or fp8 without FSDP, tensor or pipeline parallelism; turn it off here"
        )
    if t.half_residual and not mixed_precision(t.precision):
        raise ConfigError(
            f"train.half_residual: {t.precision} has no autocast to keep the residual stream from; "
            "use it with bf16-mixed, fp16-mixed or fp8, or turn it off"
        )
    unbuilt = unbuilt_architecture(config.model)
    if unbuilt:
        raise ConfigError(unbuilt)
    refused = untrained(config)
    if refused:
        raise ConfigError(refused[0])
    if config.model.num_experts:
        check_moe(config)
    if par.gpus % (par.tensor * par.pipeline):  # the world torchrun gave (launched_config), not the YAML's
        raise ConfigError(wrong_process_count(par.tensor, par.pipeline, par.gpus))
    if par.pipeline > 1:
        check_pipelinable(config)
    if par.tensor > 1:
        check_tensor_parallel(config)
    if config.debug.fp8_check and t.precision != "fp8":
        raise ConfigError(
            f"debug.fp8_check: shadows float8 linears, and train.precision is {t.precision}; "
            "use train.precision=fp8 or debug.fp8_check=0"
        )
    if par.async_tp and t.compile is False:
        raise ConfigError(
            "parallel.async_tp: the overlap is a torch.compile pass; use train.compile=auto or true, "
            "or parallel.async_tp=false"
        )
    if needs_data and not (config.data.dir or config.data.mixture):
        raise ConfigError(
            "data.dir: not set; prepare data with `pretrain prepare --out DIR` and set data.dir=DIR "
            "(or data.mixture for several directories)"
        )


def unbuilt_architecture(m: ModelConfig) -> str | None:
    """The refusal of a model the planner counts (DeepSeek-V3, gpt-oss from model.hf_config) but whose blocks the
    model does not build yet, or None."""
    what = (
        "model.kv_lora_rank: multi-head latent attention (DeepSeek-V3)"
        if m.kv_lora_rank
        else "model.attention_sinks: attention sinks (gpt-oss)"
        if m.attention_sinks
        else "model.attention_bias: an attention output-projection bias (gpt-oss)"
        if m.attention_bias
        else "model.expert_bias: router and expert biases (gpt-oss)"
        if m.expert_bias
        else "model.expert_groups: group-limited routing (DeepSeek-V3)"
        if m.expert_groups > 1
        else "model.mtp_layers: multi-token prediction (DeepSeek-V3)"
        if m.mtp_layers
        else None
    )
    return what and (
        f"{what} is not built yet: `pretrain plan` counts this model, `pretrain train` cannot run it; "
        "train a Mixtral, Qwen3-MoE or OLMoE shape instead (docs/moe.md)"
    )


def check_moe(config: Config) -> None:
    """What the Mixture-of-Experts layer (model/moe.py) is not built with yet (docs/moe.md)."""
    m, par = config.model, config.parallel
    if m.family != "llama":
        raise ConfigError(
            f"model.num_experts: Mixture-of-Experts is built for the LLaMA family, not {m.family}; "
            "use model.family=llama or model.num_experts=0"
        )
    if m.experts_per_token > m.num_experts:
        raise ConfigError(
            f"model.experts_per_token: {m.experts_per_token} is more than model.num_experts "
            f"{m.num_experts}; route each token to at most num_experts experts"
        )
    if par.pipeline > 1:
        raise ConfigError(
            "model.num_experts: Mixture-of-Experts with pipeline parallelism is not built yet; use "
            "parallel.pipeline=1 (data, tensor, expert parallelism and FSDP work)"
        )
    if par.tensor > 1 and not par.sequence_parallel:
        raise ConfigError(
            "parallel.sequence_parallel: Mixture-of-Experts under tensor parallelism routes each tensor rank's "
            "part of the sequence (Megatron-Core requires it too); use parallel.sequence_parallel=true"
        )
    if (par.expert > 1 or par.tensor > 1) and par.zero_stage == 1 and par.data_parallel > 1:
        raise ConfigError(
            "parallel.zero_stage: Mixture-of-Experts with expert or tensor parallelism is built with DDP and "
            "FSDP (parallel.zero_stage 0, 2 or 3), not yet with ZeRO-1; use parallel.zero_stage=0 or 3"
        )


def check_pipelinable(config: Config) -> None:
    """What the pipelined trainer (distributed/pipeline.py) refuses."""
    m, t, par = config.model, config.train, config.parallel
    if m.tie_embeddings:
        raise ConfigError(
            "parallel.pipeline: a tied embedding would live on the first and the last stage at "
            "once; the trainer does not synchronise the two copies: use model.tie_embeddings=false "
            "or parallel.pipeline=1"
        )
    if par.zero_stage >= 2 and par.data_parallel > 1:
        raise ConfigError(
            "parallel.zero_stage: FSDP (stages 2 and 3) per pipeline stage is not built; use "
            "parallel.zero_stage=0 or 1 with parallel.pipeline > 1"
        )
    if t.document_masking or m.position_reset:
        raise ConfigError(
            "train.document_masking / model.position_reset: a later pipeline stage sees no tokens to "
            "find the documents in; use parallel.pipeline=1 or turn them off"
        )
    if t.precision == "fp16-mixed":
        raise ConfigError(
            "train.precision: fp16-mixed's loss scaler would skip steps per stage, not together; "
            "use bf16-mixed with parallel.pipeline > 1"
        )


def check_tensor_parallel(config: Config) -> None:
    """What the tensor-parallel split (distributed/tensor_parallel.py) needs beyond the planner's checks."""
    m, t, par = config.model, config.train, config.parallel
    if m.family != "llama":
        raise ConfigError(
            f"parallel.tensor: tensor parallelism is built for the LLaMA family, not {m.family}; "
            "use parallel.tensor=1 (FSDP: parallel.zero_stage=3)"
        )
    if m.intermediate_size % par.tensor:
        raise ConfigError(
            f"parallel.tensor: {par.tensor} must divide model.intermediate_size "
            f"{m.intermediate_size} (each rank takes whole rows of the MLP)"
        )
    if padded_vocab_size(m) % par.tensor:
        raise ConfigError(
            f"parallel.tensor: {par.tensor} must divide the vocabulary's rows ({padded_vocab_size(m)}: "
            "each rank takes an equal part of the embedding and output layer); pad them with "
            f"model.pad_vocab_to={64 * par.tensor}"
        )
    if m.dropout:
        # Tensor ranks hold the same residual stream: their dropout masks would have to agree.
        raise ConfigError("model.dropout: not supported with parallel.tensor > 1; use model.dropout=0")
    if m.qk_norm:
        # Each tensor rank norms its own heads with the one shared weight: its gradient would have to be summed
        # over the ranks, which the tensor-parallel plan does not do yet.
        raise ConfigError(
            "model.qk_norm: not built with parallel.tensor > 1 yet; use parallel.tensor=1 (FSDP: parallel.zero_stage=3)"
        )
    if par.sequence_parallel and resolved(t.seq_len) % par.tensor:
        raise ConfigError(
            f"parallel.sequence_parallel: train.seq_len {t.seq_len} must be a multiple of "
            f"parallel.tensor {par.tensor} (each rank holds an equal part of the sequence)"
        )


def wrong_process_count(tensor: int, pipeline: int, processes: int, command: str = "train") -> str:
    """The fix when tensor x pipeline ranks per model replica do not divide the processes of `pretrain train`
    (or `command`: sweep): alone, start it under torchrun; under torchrun, start another number of processes."""
    grid = tensor * pipeline
    layout = f"parallel.tensor x parallel.pipeline = {tensor} x {pipeline} = {grid} ranks per model replica"
    if "WORLD_SIZE" not in os.environ:
        return (
            f"{layout}, and this is one process: launch with `torchrun --nproc-per-node {grid} -m pretrain "
            f"{command} ...`, or lower parallel.tensor / parallel.pipeline"
        )
    return (
        f"{layout} do not divide the {processes} processes torchrun started: change --nproc-per-node so that "
        f"they are a multiple of {grid}, or lower parallel.tensor / parallel.pipeline"
    )


def untrained(c: Config) -> list[str]:
    """The keys set to a value the planner models but the trainer does not run, as `section.key: reason`."""
    found: list[str] = []
    for section in SECTIONS:
        values = getattr(c, section)
        for f in dataclasses.fields(values):
            trains = f.metadata["trains"]
            if trains is not None and getattr(values, f.name) not in trains:
                allowed = " | ".join(shown_value(v) for v in trains)
                found.append(
                    f"{section}.{f.name}: {shown_value(getattr(values, f.name))} is planned but not trained "
                    f"(`pretrain plan` models it); `pretrain train` runs {allowed}"
                )
    return found
