"""The checks every loaded config passes (no files, no torch): each failure names the key and what is
allowed; `resolve` fills the derived defaults first. data.mixture's entries are checked by `mixture_sources`
(mixture.py), what the trainer does not run by `check_trainable` (trainable.py)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, TypeVar, cast

from ..errors import ConfigError, UsageError
from ..gpus import gpu_spec
from ..rope_scaling import checked_rope_scaling
from .job_sections import ParallelConfig, TrainConfig
from .mixture import mixture_sources
from .moe_keys import check_moe_keys
from .schema import SECTIONS, Config, ResolvedConfig, ResolvedModelConfig, ResolvedTrainConfig, resolved

_Resolved = TypeVar("_Resolved")


class GridError(ConfigError):
    """parallel.gpus is not a multiple of tensor x pipeline. `pretrain train` says how many processes to launch
    instead (its gpus is the number torchrun started, not a figure to edit)."""

    def __init__(self, message: str, parallel: ParallelConfig):
        super().__init__(message)
        self.tensor, self.pipeline = parallel.tensor, parallel.pipeline


def _positive(key: str, value: float | None, allow_zero: bool = False) -> None:
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{key}: must be {bound}, got {value}")


LARGEST = 2**63 - 1  # int64: what the trainer's tensors and the token file's offsets hold
# The largest world size taken: ten times the largest clusters built (~10^5 GPUs). More is a slip of the keyboard
# (1e9 for 1e3) that every plan would answer with figures for a machine that cannot exist.
MOST_GPUS = 2**20


def _refuse_non_finite(c: Config) -> None:
    """NaN passes every `<` test and infinity every `>`, and a number beyond int64 overflows the planner's
    arithmetic (GB x 1e9, TFLOP/s x 1e12 x GPUs): refuse them for every numeric key before other checks."""
    for section in SECTIONS:
        values = getattr(c, section)
        for f in dataclasses.fields(values):
            value = getattr(values, f.name)
            for x in cast(list[Any], value) if isinstance(value, list) else [value]:
                if isinstance(x, bool) or not isinstance(x, (int, float)):
                    continue
                if not math.isfinite(x):
                    raise ConfigError(f"{section}.{f.name}: must be a finite number, got {x}")
                if abs(x) > LARGEST:
                    raise ConfigError(f"{section}.{f.name}: {x:.3g} is too large; at most 2^63 - 1 (int64)")


def resolve(c: Config) -> ResolvedConfig:
    """The config with its derived defaults filled in (num_kv_heads, head_dim, seq_len), checked: what every
    reader sees. A new object, of the resolved types that declare those keys `int`; the config is frozen, so no
    value changes after this."""
    _refuse_non_finite(c)
    m, t = c.model, c.train
    for name in ("hidden_size", "num_heads", "max_seq_len"):
        _positive(f"model.{name}", getattr(m, name))
    if m.head_dim is None and m.hidden_size % m.num_heads:
        raise ConfigError(
            f"model.num_heads: {m.num_heads} heads do not divide hidden_size {m.hidden_size}; "
            "pick a divisor or set model.head_dim"
        )
    model = _retyped(
        ResolvedModelConfig,
        m,
        num_kv_heads=m.num_heads if m.num_kv_heads is None else m.num_kv_heads,
        head_dim=m.hidden_size // m.num_heads if m.head_dim is None else m.head_dim,
        rope_scaling=checked_rope_scaling(m.rope_scaling),
    )
    default_len = min(2048, m.max_seq_len, m.sliding_window or m.max_seq_len)
    train = _retyped(ResolvedTrainConfig, t, seq_len=default_len if t.seq_len is None else t.seq_len)
    if t.global_batch_tokens is not None:
        train = dataclasses.replace(train, grad_accum_steps=_accumulation(train, c.parallel))
    resolved_config = _retyped(ResolvedConfig, c, model=model, train=train)
    validate(resolved_config)
    return resolved_config


def _retyped(cls: type[_Resolved], section: Any, **derived: Any) -> _Resolved:
    """`section` (a config or one of its sections) as `cls`, its resolved type, with the derived keys set."""
    values = {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}
    return cls(**(values | derived))


def _check_experts(c: Config) -> None:
    """The Mixture-of-Experts keys the planner needs consistent: k of E experts, experts split evenly over the
    expert-parallel ranks (ParallelConfig.expert_pool), and an imbalance no smaller than perfect balance."""
    m, p = c.model, c.parallel
    _positive("parallel.expert", p.expert)
    if m.num_experts and not 0 < m.experts_per_token <= m.num_experts:
        raise ConfigError(
            f"model.experts_per_token: {m.experts_per_token} must be in 1..model.num_experts {m.num_experts}"
        )
    if p.expert_tensor not in (1, p.tensor):
        raise ConfigError(
            f"parallel.expert_tensor: {p.expert_tensor} must be 1 (whole experts) or parallel.tensor {p.tensor} "
            "(each expert split like the dense MLP)"
        )
    ranks = p.expert_pool
    over = "data x tensor ranks" if p.expert_tensor == 1 and p.tensor > 1 else "data-parallel ranks"
    if p.expert > 1 and (not m.num_experts or m.num_experts % p.expert or ranks % p.expert):
        raise ConfigError(
            f"parallel.expert: {p.expert} must divide model.num_experts {m.num_experts} and the {ranks} {over} "
            "an expert-parallel group is taken from; pick a common divisor or 1"
        )
    if c.plan.routing_imbalance < 1:
        raise ConfigError(
            f"plan.routing_imbalance: {c.plan.routing_imbalance} is below 1; the busiest expert "
            "carries at least the mean load (1 = perfectly balanced)"
        )


def _accumulation(t: TrainConfig, p: ParallelConfig) -> int:
    """grad_accum_steps for train.global_batch_tokens on this layout: the global batch is the user's, fixed;
    what one micro-batch step of every data-parallel rank adds (micro-batch x seq x data ranks) must divide
    it. Said in one line with the nearest valid batches when it does not."""
    assert t.global_batch_tokens is not None  # resolve() asks only when it is set
    _positive("train.global_batch_tokens", t.global_batch_tokens)
    for key in ("micro_batch_size", "seq_len"):
        _positive(f"train.{key}", getattr(t, key))
    for key in ("gpus", "tensor", "pipeline"):
        _positive(f"parallel.{key}", getattr(p, key))
    data = max(1, p.gpus // (p.tensor * p.pipeline))
    unit = t.micro_batch_size * resolved(t.seq_len) * data
    accum, rest = divmod(t.global_batch_tokens, unit)
    if rest or not accum:
        nearest = " or ".join(f"{k * unit:,}" for k in (accum, accum + 1) if k)
        raise ConfigError(
            f"train.global_batch_tokens: {t.global_batch_tokens:,} is not a multiple of micro-batch "
            f"{t.micro_batch_size} x seq {t.seq_len} x {data} data-parallel ranks = {unit:,} tokens; "
            f"the nearest that are: {nearest}"
        )
    return accum


def validate(c: Config) -> None:
    """Checks that need no files and no torch; each failure names the key and what is allowed."""
    _refuse_non_finite(c)
    _check_model(c)
    _check_train(c)
    _check_parallel(c)
    _check_hardware_and_budget(c)
    _check_data_and_run(c)


def _check_model(c: Config) -> None:
    """model.* (and debug.fp8_check)."""
    m = c.model
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "max_seq_len"):
        _positive(f"model.{name}", getattr(m, name))
    _positive("model.num_kv_heads", m.num_kv_heads)
    _positive("model.head_dim", m.head_dim)
    _positive("model.sliding_window", m.sliding_window)
    _positive("debug.fp8_check", c.debug.fp8_check, allow_zero=True)
    head_dim = resolved(m.head_dim)
    if m.num_heads % resolved(m.num_kv_heads):
        raise ConfigError(f"model.num_kv_heads: {m.num_kv_heads} must divide num_heads {m.num_heads}")
    if m.family == "gpt2":
        if m.num_heads * head_dim != m.hidden_size:
            raise ConfigError("model.head_dim: the gpt2 family needs num_heads x head_dim == hidden_size")
        if m.num_kv_heads != m.num_heads:
            raise ConfigError(
                "model.num_kv_heads: the gpt2 family has no grouped-query attention; leave num_kv_heads unset"
            )
        if m.qk_norm:
            raise ConfigError("model.qk_norm: the gpt2 family has no QK-norm; set model.qk_norm=false")
        if m.rope_scaling is not None:
            raise ConfigError(
                "model.rope_scaling: the gpt2 family has learned positions, no RoPE; leave model.rope_scaling unset"
            )
    checked_rope_scaling(m.rope_scaling)
    if m.family == "llama" and head_dim % 2:
        raise ConfigError(f"model.head_dim: rotary embeddings need an even head_dim, got {m.head_dim}")
    if not 0 <= m.dropout < 1:
        raise ConfigError(f"model.dropout: must be in [0, 1), got {m.dropout}")
    _positive("model.norm_eps", m.norm_eps)
    _positive("model.pad_vocab_to", m.pad_vocab_to)
    _positive("model.init_std", m.init_std)
    # RoPE's frequencies are rope_theta^(-2i/d): a base <= 0 gives complex or infinite angles (and NaN losses)
    _positive("model.rope_theta", m.rope_theta)
    check_moe_keys(m)


def _check_train(c: Config) -> None:
    """train.*, against the model's length."""
    m, t = c.model, c.train
    for name in ("seq_len", "micro_batch_size", "grad_accum_steps", "epochs"):
        _positive(f"train.{name}", getattr(t, name))
    for name in ("tokens", "examples", "max_steps", "stage_tokens"):
        _positive(f"train.{name}", getattr(t, name))
    seq_len = resolved(t.seq_len)
    if seq_len > m.max_seq_len:
        extend = (
            " (for a LLaMA pretrained at a shorter context, with model.rope_scaling as llama3.1-8b does: "
            "docs/train.md, Long context)"
            if m.family == "llama"
            else ""
        )
        raise ConfigError(
            f"train.seq_len: {t.seq_len} is longer than model.max_seq_len {m.max_seq_len}; "
            f"lower train.seq_len or raise model.max_seq_len{extend}"
        )
    if m.sliding_window is not None and seq_len > m.sliding_window:
        raise ConfigError(
            f"train.seq_len: {t.seq_len} is longer than model.sliding_window {m.sliding_window}, "
            "beyond which the checkpoint's sliding-window attention is not built (pretrain's full "
            f"attention equals it only within the window); use train.seq_len <= {m.sliding_window}"
        )
    _positive("train.lr", t.lr)
    if not 0 <= t.min_lr_ratio <= 1:
        raise ConfigError(f"train.min_lr_ratio: must be in [0, 1], got {t.min_lr_ratio}")
    if isinstance(t.warmup, float) and not 0 <= t.warmup < 1:
        raise ConfigError(
            f"train.warmup: a fraction must be in [0, 1), got {t.warmup}; give an integer for a number of steps"
        )
    _positive("train.warmup", t.warmup, allow_zero=True)
    if not 0 < t.decay_fraction <= 1:
        raise ConfigError(f"train.decay_fraction: must be in (0, 1], got {t.decay_fraction}")
    _positive("train.grad_clip", t.grad_clip, allow_zero=True)
    _positive("train.weight_decay", t.weight_decay, allow_zero=True)
    _positive("train.eps", t.eps)
    _positive("train.batch_ramp_tokens", t.batch_ramp_tokens, allow_zero=True)
    _positive("train.batch_ramp_start", t.batch_ramp_start)
    if len(t.betas) != 2 or not all(0 <= b < 1 for b in t.betas):
        raise ConfigError(f"train.betas: expected two numbers in [0, 1), got {t.betas}")
    if isinstance(t.compile, str) and t.compile != "auto":
        raise ConfigError(f"train.compile: {t.compile!r} is not allowed; choose one of auto | true | false")
    _positive("train.loss_chunk_tokens", t.loss_chunk_tokens)
    if t.device not in ("auto", "cpu", "cuda") and not t.device.startswith("cuda:"):
        raise ConfigError(f"train.device: {t.device!r} is not allowed; choose one of auto | cpu | cuda")


def _check_parallel(c: Config) -> None:
    """parallel.*: the grid against the model and the batch."""
    m, t, p = c.model, c.train, c.parallel
    for name in ("gpus", "tensor", "pipeline", "gpus_per_node"):
        _positive(f"parallel.{name}", getattr(p, name))
    if p.gpus > MOST_GPUS:
        raise ConfigError(
            f"parallel.gpus: {p.gpus:,} is more than the {MOST_GPUS:,} (2^20) a config takes, ten "
            "times the largest clusters built; give the job's world size"
        )
    if p.gpus % (p.tensor * p.pipeline):
        raise GridError(
            f"parallel.gpus: {p.gpus} is not divisible by tensor x pipeline = "
            f"{p.tensor} x {p.pipeline}; make gpus a multiple of {p.tensor * p.pipeline}",
            p,
        )
    global_batch = t.micro_batch_size * resolved(t.seq_len) * t.grad_accum_steps * (p.gpus // (p.tensor * p.pipeline))
    if t.batch_ramp_tokens and t.batch_ramp_start > global_batch:  # the ramp would start above its end: no ramp
        raise ConfigError(
            f"train.batch_ramp_start: {t.batch_ramp_start:,} tokens is above the global batch "
            f"{global_batch:,} the ramp grows to; lower it (e.g. {global_batch // 8:,}) or set "
            "train.batch_ramp_tokens=0 for no ramp"
        )
    if p.tensor > 1 and m.num_heads % p.tensor:
        raise ConfigError(f"parallel.tensor: {p.tensor} must divide model.num_heads {m.num_heads}")
    if p.tensor > 1 and resolved(m.num_kv_heads) % p.tensor:  # Megatron splits whole key/value groups over the ranks
        raise ConfigError(
            f"parallel.tensor: {p.tensor} must divide model.num_kv_heads {m.num_kv_heads} "
            "(each tensor rank holds whole key/value heads); pick a divisor"
        )
    if p.pipeline > m.num_layers:
        raise ConfigError(
            f"parallel.pipeline: {p.pipeline} stages for {m.num_layers} layers; use at most one stage per layer"
        )
    if p.sequence_parallel and p.tensor == 1:
        raise ConfigError("parallel.sequence_parallel: needs parallel.tensor > 1")
    if p.async_tp and not p.sequence_parallel:
        raise ConfigError(
            "parallel.async_tp: overlaps sequence parallelism's all-gathers and reduce-scatters; "
            "set parallel.sequence_parallel=true (with parallel.tensor > 1)"
        )
    _check_experts(c)
    if p.offload == "optimizer+params" and (p.zero_stage != 3 or p.gpus == p.tensor * p.pipeline):
        # Parameters live off the GPU only when ZeRO-3 gathers them per block (DeepSpeed ZeRO-Infinity).
        raise ConfigError(
            "parallel.offload: optimizer+params needs parallel.zero_stage=3 with data parallel > 1 "
            "(parameter offload exists only with ZeRO-3); set it, or use parallel.offload=optimizer"
        )
    if p.pipeline_schedule == "interleaved_1f1b" and p.pipeline > 1 and 2 * p.pipeline > m.num_layers:
        raise ConfigError(
            f"parallel.pipeline_schedule: interleaved_1f1b runs 2 chunks of layers per stage, "
            f"{2 * p.pipeline} for {m.num_layers} layers; use 1f1b or parallel.pipeline <= "
            f"{m.num_layers // 2}"
        )


def _check_hardware_and_budget(c: Config) -> None:
    """hardware.*, measured.* and budget.*."""
    h = c.hardware
    gpu_spec(h.gpu)  # raises with the list of known cards
    for name in ("mfu", "hfu"):
        value = getattr(h, name)
        if value is not None and not 0 < value <= 1:
            raise ConfigError(f"hardware.{name}: must be in (0, 1], got {value}")
    for name in (
        "peak_tflops",
        "memory_gb",
        "bandwidth_gbps",
        "price_per_gpu_hour",
        "intra_node_gbps",
        "inter_node_gbps",
    ):
        _positive(f"hardware.{name}", getattr(h, name))
    _positive("hardware.cuda_context_gb", h.cuda_context_gb, allow_zero=True)
    if not 0 <= h.fragmentation < 1:
        raise ConfigError(f"hardware.fragmentation: must be in [0, 1), got {h.fragmentation}")
    for name in ("tokens_per_second", "iterations_per_second", "step_time_seconds"):
        _positive(f"measured.{name}", getattr(c.measured, name))
    given = [f"budget.{k}" for k in ("gpu_hours", "days", "cost") if getattr(c.budget, k) is not None]
    for key in given:
        _positive(key, getattr(c.budget, key.split(".")[1]))
    if len(given) > 1:
        raise ConfigError(
            f"budget: {' and '.join(given)} both given; give one of budget.gpu_hours, budget.days, budget.cost"
        )
    if c.budget.cost is not None and not h.price_per_gpu_hour:
        raise ConfigError("budget.cost: needs hardware.price_per_gpu_hour (the price of one GPU-hour)")


def _check_data_and_run(c: Config) -> None:
    """data.*, run.* and stability.*."""
    _positive("data.raw_bytes", c.data.raw_bytes)
    _positive("data.bytes_per_token", c.data.bytes_per_token)
    if c.data.raw_bytes and not c.data.bytes_per_token:
        raise ConfigError(
            "data.raw_bytes: needs data.bytes_per_token too (measure it with `pretrain tokenizer "
            "stats --tokenizer DIR --input CORPUS`)"
        )
    if c.data.mixture and c.data.dir:
        raise ConfigError(
            "data.mixture: exclusive with data.dir; remove data.dir (each mixture source names its own directory)"
        )
    mixture_sources(c.data)
    r = c.run
    for name in ("log_every", "eval_batches", "keep_checkpoints"):
        _positive(f"run.{name}", getattr(r, name))
    for name in ("eval_every", "checkpoint_every"):
        _positive(f"run.{name}", getattr(r, name), allow_zero=True)
    _check_eval_tasks(c)
    st = c.stability
    for name in ("window", "min_history", "threshold", "patience", "max_rollbacks", "rollback_window", "lr_scale"):
        _positive(f"stability.{name}", getattr(st, name))
    _positive("stability.min_rise", st.min_rise, allow_zero=True)
    _positive("stability.lr_scale_steps", st.lr_scale_steps, allow_zero=True)
    if st.min_history > st.window:  # the history is the window: it would never be long enough to judge
        raise ConfigError(
            f"stability.min_history: {st.min_history} is more than stability.window {st.window}, so "
            f"no spike would ever be judged; raise stability.window or lower stability.min_history"
        )


def _check_eval_tasks(c: Config) -> None:
    r = c.run
    if r.eval_tasks_every is not None:
        _positive("run.eval_tasks_every", r.eval_tasks_every, allow_zero=True)
    if r.eval_tasks_limit is not None:
        _positive("run.eval_tasks_limit", r.eval_tasks_limit)
    if not r.eval_tasks:
        return
    from ..task_catalog import task_names

    try:
        task_names(",".join(r.eval_tasks))
    except UsageError as e:
        raise ConfigError(f"run.eval_tasks: {e}") from None
