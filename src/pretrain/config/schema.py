"""The config schema: the whole `Config`, one field per section, the sections by name (`SECTIONS`), and the
values read off a config (`compile_enabled`, `resolved`, `padded_vocab_size`), and the types of a resolved
config (`ResolvedConfig`: the keys that `resolve` derives declared `int`). The sections and their keys, each
with its default, meaning, allowed values and what the trainer runs (`doc`, key_doc.py), are in
model_section.py, job_sections.py (train, parallel, data), planner_sections.py and trainer_sections.py;
docs/config.md's key table is generated from them (`docs_markdown`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from ..gpus import mixed_precision
from .job_sections import DataConfig, ParallelConfig, TrainConfig
from .model_section import ModelConfig
from .planner_sections import BudgetConfig, FlopsConfig, HardwareConfig, MeasuredConfig, PlanConfig
from .trainer_sections import DebugConfig, RunConfig, StabilityConfig


# A whole config: one frozen field per section (`config.model`, `config.train`, ...), each defaulting to its
# section's defaults, in the order `pretrain config` prints them. model, train, parallel and data are read by the
# planner and the trainer alike; hardware, measured, flops, plan and budget are the planner's questions (the
# machine, figures measured on it, what to print, what a budget buys); run, stability and debug the trainer's
# outputs and safeguards. Written out (not made from a list) so a type checker and an editor see each section.
@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    measured: MeasuredConfig = field(default_factory=MeasuredConfig)
    flops: FlopsConfig = field(default_factory=FlopsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    run: RunConfig = field(default_factory=RunConfig)
    stability: StabilityConfig = field(default_factory=StabilityConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# A resolved config's types: what `resolve` returns and the planner takes. The raw sections declare the keys
# that resolve() derives `int | None` (None = "derive it"); these subclasses declare the same fields `int`, the
# type they have after resolve(), and add nothing else: same keys, same defaults, same docs (SECTIONS and the
# key table read the raw Config). A frozen field is read-only, so a type checker accepts the narrower type.
class ResolvedModelConfig(ModelConfig):
    num_kv_heads: int
    head_dim: int


class ResolvedTrainConfig(TrainConfig):
    seq_len: int


class ResolvedConfig(Config):
    model: ResolvedModelConfig
    train: ResolvedTrainConfig


# The sections by name, read from Config's fields so the list is written once.
SECTIONS: dict[str, type[Any]] = get_type_hints(Config)


def compile_enabled(compile_setting: bool | str, device_type: str) -> bool:
    """train.compile resolved for a device: auto compiles on CUDA (where fusing the memory-bound chains pays)
    and not on CPU (where compiling costs more than a short run gains)."""
    return device_type == "cuda" if compile_setting == "auto" else bool(compile_setting)


def half_residual_enabled(train: TrainConfig, device_type: str) -> bool:
    """train.half_residual resolved for a device: null (the default) keeps the residual stream in the 16-bit
    compute dtype where that pays, a *-mixed or fp8 run whose blocks compile on CUDA (inductor fuses the casts
    into the residual adds, which then move half the bytes), and in fp32 everywhere else; true or false as
    given. Only autocast's precisions have an fp32 stream to narrow."""
    mixed = mixed_precision(train.precision)
    if train.half_residual is not None:
        return train.half_residual and mixed
    return mixed and device_type == "cuda" and compile_enabled(train.compile, device_type)


def resolved(value: int | None) -> int:
    """A key that `resolve` fills in (model.num_kv_heads, model.head_dim, train.seq_len) read from a resolved
    config: its declared type is the raw config's `int | None`, its value after `resolve` an int."""
    assert value is not None, "a derived key read before resolve()"
    return value


def padded_vocab_size(model: ModelConfig) -> int:
    """Rows of the embedding and output layer: model.vocab_size rounded up to a multiple of model.pad_vocab_to.
    The one place that computes it; the model, the planner and the export all call it."""
    return -(-model.vocab_size // model.pad_vocab_to) * model.pad_vocab_to
