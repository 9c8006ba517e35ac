"""One config schema for every subcommand: `plan`, `train`, `sweep` and `bench` read the same sections.

A config is a YAML file plus `section.key=value` overrides. Every field carries a `doc` string; the key table
of docs/config.md is generated from it (`pretrain config --docs`), so the code and the docs cannot drift apart.
Pure Python: importing this module imports neither torch nor numpy.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from .errors import ConfigError
from .gpus import gpu_spec
from .presets import PRESETS, from_hf_config, preset


def doc(default: Any, text: str, choices: tuple | None = None, trains: tuple | None = None):
    """A dataclass field with its documentation, the allowed values (for strings) and, when the trainer runs
    fewer values than the planner models, the ones it runs (`trains`): `check_trainable` refuses the others
    and docs/config.md's key table says so, both from this one place."""
    metadata = {"doc": text, "choices": choices, "trains": trains}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


FAMILIES = ("llama", "gpt2")
PRECISIONS = ("fp32", "fp16-mixed", "bf16-mixed", "bf16")
OPTIMIZERS = ("adamw", "adafactor", "sgd")
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("cosine", "linear", "inverse_sqrt", "wsd")


@dataclass(frozen=True)
class ModelConfig:
    preset: str | None = doc(None, "named model shape: " + " | ".join(PRESETS) + "; keys given beside it override it")
    hf_config: str | None = doc(None, "a Hugging Face config.json (or its directory) to take the shape from")
    family: str = doc("llama", "llama (RMSNorm, RoPE, SwiGLU, no biases) | gpt2 (LayerNorm, learned positions, "
                      "GELU MLP, biases, tied embeddings)", FAMILIES)
    vocab_size: int = doc(32000, "vocabulary size V")
    hidden_size: int = doc(4096, "model width H")
    intermediate_size: int = doc(11008, "MLP width H' (SwiGLU: each of gate, up; GPT-2: 4H)")
    num_layers: int = doc(32, "transformer blocks L")
    num_heads: int = doc(32, "attention (query) heads")
    num_kv_heads: int | None = doc(None, "key/value heads; fewer than num_heads = grouped-query attention "
                                   "(default num_heads)")
    max_seq_len: int = doc(2048, "the model's context length (GPT-2: size of the position table)")
    head_dim: int | None = doc(None, "size of one head (default hidden_size / num_heads)")
    tie_embeddings: bool = doc(False, "output layer shares the input embedding matrix")
    qkv_bias: bool = doc(False, "biases on the q, k, v projections (Qwen2 style)")
    bias: bool = doc(True, "gpt2 family: biases in linear layers and LayerNorm (false = nanoGPT bias-free)")
    dropout: float = doc(0.0, "dropout probability (pretraining uses 0)")
    norm_eps: float = doc(1e-5, "epsilon of RMSNorm / LayerNorm")
    rope_theta: float = doc(10000.0, "llama family: RoPE base frequency")
    init_std: float = doc(0.02, "std of the normal initialisation; residual projections get "
                          "init_std / sqrt(2 * num_layers)")
    init_from: str | None = doc(None, "a local Hugging Face model directory to start from (continued pretraining)")
    pad_vocab_to: int = doc(1, "round the embedding and output-layer rows up to a multiple of this (64: GPT-2's "
                            "50,257 -> 50,304, faster matmuls); the padded rows are never a target, export drops them")


@dataclass(frozen=True)
class TrainConfig:
    seq_len: int | None = doc(None, "tokens per training sequence (default: the model's max_seq_len, at most 2048)")
    micro_batch_size: int = doc(1, "sequences per GPU per forward/backward")
    grad_accum_steps: int = doc(8, "micro-batches accumulated per optimizer step")
    tokens: int | None = doc(None, "training tokens; default: max_steps, else examples x epochs, else the "
                             "Chinchilla-optimal 20 tokens per parameter")
    examples: int | None = doc(None, "training examples (one example = one seq_len window); with epochs")
    epochs: int = doc(1, "passes over `examples`")
    max_steps: int | None = doc(None, "optimizer steps to run (takes precedence over tokens)")
    device: str = doc("auto", "auto | cpu | cuda (train only; the planner ignores it)")
    precision: str = doc("bf16-mixed", "fp32 | fp16-mixed | bf16-mixed (autocast, fp32 master weights) | "
                         "bf16 (pure bf16 weights and optimizer states)", PRECISIONS)
    optimizer: str = doc("adamw", "adamw | adafactor | sgd", OPTIMIZERS)
    activation_checkpointing: str = doc("none", "none | selective (recompute all but matmul and attention "
                                        "outputs) | full (recompute each block)", RECOMPUTE)
    attention: str = doc("sdpa", "sdpa (flash / memory-efficient, no seq x seq scores kept) | eager "
                         "(scores materialised)", ("sdpa", "eager"))
    grad_dtype: str = doc("fp32", "fp32 | same (gradients in the compute dtype, as the ZeRO paper counts)",
                          ("fp32", "same"))
    batch_ramp_tokens: int = doc(0, "tokens over which the global batch grows to its target; 0 = off")
    batch_ramp_start: int = doc(32768, "global batch in tokens at the start of the ramp (GPT-3: 32K)")
    lr: float = doc(3e-4, "peak learning rate")
    min_lr_ratio: float = doc(0.1, "learning-rate floor as a fraction of the peak")
    warmup: float | int = doc(0.005, "linear warm-up: a fraction of the steps (float < 1) or a step count (int)")
    schedule: str = doc("cosine", "decay after warm-up: cosine | linear | inverse_sqrt | wsd "
                        "(warmup-stable-decay)", SCHEDULES)
    decay_fraction: float = doc(0.2, "wsd: fraction of the steps spent in the final linear decay")
    grad_clip: float = doc(1.0, "clip the global gradient norm to this value (0 = off)")
    weight_decay: float = doc(0.1, "AdamW decoupled weight decay, on matrices only")
    betas: list[float] = doc([0.9, 0.95], "AdamW beta1, beta2")
    eps: float = doc(1e-8, "AdamW epsilon")
    momentum: float = doc(0.9, "SGD momentum")
    seed: int = doc(1234, "seed of initialisation, data order and dropout")
    compile: bool | str = doc("auto", "torch.compile: auto (on for CUDA, off for CPU) | true | false")
    loss: str = doc("chunked", "cross-entropy: chunked (output layer and loss a chunk of tokens at a time, fp32 "
                    "logits only inside a chunk) | plain (full-vocabulary fp32 logits at once)",
                    ("chunked", "plain"))
    loss_chunk_tokens: int = doc(4096, "tokens per chunk of the chunked loss")


@dataclass(frozen=True)
class ParallelConfig:
    gpus: int = doc(1, "world size (all GPUs of the job); data parallel = gpus / (tensor x pipeline)")
    tensor: int = doc(1, "tensor-parallel degree (LLaMA family; docs/parallel.md)")
    pipeline: int = doc(1, "pipeline-parallel degree (docs/parallel.md)")
    zero_stage: int = doc(0, "0 (DDP) | 1 (optimizer states sharded) | 2 (+ gradients) | 3 (+ weights, FSDP2)",
                          (0, 1, 2, 3))
    sequence_parallel: bool = doc(False, "shard norm/dropout activations over the tensor-parallel group")
    offload: str = doc("none", "none | optimizer | optimizer+params (ZeRO-Offload: states in host memory)",
                       ("none", "optimizer", "optimizer+params"), trains=("none",))
    gpus_per_node: int = doc(8, "GPUs per machine (for host memory per node)")
    grad_sync: str = doc("micro_batch", "FSDP (ZeRO 2/3) with gradient accumulation: micro_batch (reduce-scatter "
                         "after every micro-batch: gradients stay sharded) | step (only after the last micro-batch: "
                         "less communication, unsharded fp32 gradients held in between)", ("micro_batch", "step"))
    pipeline_schedule: str = doc("1f1b", "1f1b | interleaved_1f1b (each pipeline rank runs 2 model chunks: a "
                                 "bubble of (p-1)/(2m+p-1) for more micro-batches in flight; docs/parallel.md)",
                                 ("1f1b", "interleaved_1f1b"))

    @property
    def data_parallel(self) -> int:
        """Ranks that hold the same model shard and split the batch: gpus / (tensor x pipeline)."""
        return self.gpus // (self.tensor * self.pipeline)

    @property
    def fsdp(self) -> bool:
        """Sharded by FSDP2 (ZeRO 2/3 over more than one data-parallel rank); one rank keeps a plain model."""
        return self.zero_stage >= 2 and self.data_parallel > 1


@dataclass(frozen=True)
class HardwareConfig:
    gpu: str = doc("a100-80gb", "accelerator from the catalog (`pretrain plan --list-gpus` lists it), cpu, or "
                   "other-gpu (a card not listed: give memory_gb and peak_tflops)")
    mfu: float = doc(0.4, "assumed model FLOPs utilisation (fraction of peak) for time estimates")
    hfu: float | None = doc(None, "assumed hardware FLOPs utilisation; when set, time = hardware FLOPs "
                            "(recomputation included) / (gpus x peak x hfu)")
    peak_tflops: float | None = doc(None, "override the catalog's dense peak TFLOP/s for the compute dtype")
    memory_gb: float | None = doc(None, "override the card's memory (GB, 1e9 bytes)")
    profile: str | None = doc(None, "a hardware profile JSON written by `pretrain bench`: its achievable "
                              "TFLOP/s replaces the data-sheet peak")
    price_per_gpu_hour: float | None = doc(None, "price of one GPU-hour, for a cost estimate")
    intra_node_gbps: float | None = doc(None, "step-time model: GB/s per GPU per direction between GPUs of a node, "
                                        "as measured (nccl-tests bus bandwidth); default the catalog's NVLink / "
                                        "PCIe figure x 0.8 (h100-sxm 450, a100 300)")
    inter_node_gbps: float | None = doc(None, "step-time model: GB/s per GPU per direction between nodes, as "
                                        "measured; default the catalog's network x 0.8 (one 400 Gb/s NIC per "
                                        "H100 = 50, 200 Gb/s per A100 = 25)")
    cuda_context_gb: float = doc(1.3, "memory taken by the CUDA context and kernels (GB)")
    fragmentation: float = doc(0.1, "fraction of the card kept free for allocator fragmentation")


@dataclass(frozen=True)
class MeasuredConfig:
    tokens_per_second: float | None = doc(None, "measured throughput of the whole job")
    iterations_per_second: float | None = doc(None, "measured optimizer steps per second")
    step_time_seconds: float | None = doc(None, "measured seconds per optimizer step")


@dataclass(frozen=True)
class FlopsConfig:
    causal_attention: bool = doc(False, "count the attention term halved (causal) instead of PaLM's full")
    convention: str = doc("palm", "FLOPs behind time and MFU: palm (6 x non-embedding N + attention) | "
                          "6n (6 x all parameters; 8 x with full recomputation)", ("palm", "6n"))


@dataclass(frozen=True)
class DataConfig:
    dir: str | None = doc(None, "a directory written by `pretrain prepare` (the planner reads its meta.json: tokens "
                          "available and bytes per token)")
    raw_bytes: float | None = doc(None, "planner: size of the raw text corpus in bytes (300e9 = 300 GB), for the "
                                  "tokens it holds and the epochs the run needs")
    bytes_per_token: float | None = doc(None, "planner: UTF-8 bytes per token of the tokenizer on this text (from "
                                        "`pretrain tokenizer stats`); with data.raw_bytes")
    verify: str = doc("auto", "checks of data.dir at train start beyond sizes and headers (always done): full = "
                      "re-hash train.bin / val.bin against meta.json's sha256, auto = full when they total at most "
                      "1 GiB, size = no hashing", ("auto", "full", "size"))
    mixture: list[dict] = doc([], "train on several prepared directories in chosen proportions: a list of {dir, "
                              "weight, name, max_epochs}; weights count tokens and are normalised, name defaults "
                              "to the directory's base name; exclusive with data.dir (docs/data.md: Mixtures)")


@dataclass(frozen=True)
class PlanConfig:
    framework: str = doc("pretrain", "memory accounting of `pretrain plan`: pretrain (what our trainer holds) | "
                         "megatron | deepspeed | zero-paper (each framework's published formulas, added to the plan "
                         "as `framework`; sources in --explain)", ("pretrain", "megatron", "deepspeed", "zero-paper"))


@dataclass(frozen=True)
class BudgetConfig:
    gpu_hours: float | None = doc(None, "planner budget mode: GPU-hours to spend; the plan then chooses the "
                                  "Chinchilla-optimal model and tokens for that compute (docs/plan.md: Budget mode)")
    days: float | None = doc(None, "budget mode: days of parallel.gpus GPUs")
    cost: float | None = doc(None, "budget mode: money to spend, at hardware.price_per_gpu_hour")


@dataclass(frozen=True)
class RunConfig:
    dir: str = doc("runs/default", "everything of a run: metrics.jsonl, events.jsonl, plan_vs_run.json, "
                   "checkpoints/, tensorboard/")
    log_every: int = doc(10, "optimizer steps between metric lines")
    eval_every: int = doc(200, "optimizer steps between validation passes (0 = only at the end)")
    eval_batches: int = doc(20, "micro-batches per validation pass")
    checkpoint_every: int = doc(500, "optimizer steps between checkpoints (0 = only at the end)")
    keep_checkpoints: int = doc(3, "checkpoints kept; older ones are deleted")
    resume: str = doc("never", "auto (continue from the newest complete checkpoint) | never", ("auto", "never"))
    progress: bool = doc(True, "show a progress bar")


@dataclass(frozen=True)
class StabilityConfig:
    spike_detection: bool = doc(True, "watch the loss for spikes and non-finite values, roll back on one")
    window: int = doc(100, "recent steps whose losses form the reference (median and MAD)")
    min_history: int = doc(20, "steps of history before spikes are judged")
    threshold: float = doc(6.0, "a spike: loss > median + threshold x 1.4826 x MAD of the window ...")
    min_rise: float = doc(0.1, "... and loss > median x (1 + min_rise), so a flat curve's noise is no spike")
    patience: int = doc(3, "consecutive spike steps before a rollback (non-finite losses roll back at once)")
    max_rollbacks: int = doc(3, "rollbacks allowed within rollback_window steps before the run stops")
    rollback_window: int = doc(1000, "steps over which max_rollbacks is counted")
    lr_scale: float = doc(1.0, "multiply the learning rate by this after a rollback (1 = unchanged)")
    lr_scale_steps: int = doc(0, "steps the lowered learning rate lasts after a rollback")


@dataclass(frozen=True)
class DebugConfig:
    inject_nan_batches: list[int] = doc([], "testing: micro-batches (by position in the data stream) whose "
                                        "loss becomes NaN")
    inject_spike_batches: list[int] = doc([], "testing: micro-batches whose loss is multiplied by "
                                          "inject_spike_factor")
    inject_spike_factor: float = doc(20.0, "testing: the factor of inject_spike_batches")
    check_sharding: bool = doc(False, "assert each rank holds exactly the model-state bytes the planner "
                               "predicts for it")
    plan_vs_run_per_rank: bool = doc(False, "every rank also writes RUN_DIR/plan_vs_run.rank<R>.json: its own "
                                     "measured bytes beside the planner's for its place in the grid")
    step_sleep: float = doc(0.0, "testing: seconds to sleep after each optimizer step (crash tests)")
    stop_after_step: int = doc(0, "testing: behave as if preempted after this optimizer step (checkpoint, exit 0)")
    inject_disk_full_step: int = doc(0, "testing: the checkpoint of this step fails as on a full disk (ENOSPC)")
    checkpoint_sleep: float = doc(0.0, "testing: seconds to pause in the middle of writing each checkpoint, so a "
                                  "crash test can kill the process there")


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

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def compile_enabled(compile_setting: bool | str, device_type: str) -> bool:
    """train.compile resolved for a device: auto compiles on CUDA (where fusing the memory-bound chains pays)
    and not on CPU (where compiling costs more than a short run gains)."""
    return device_type == "cuda" if compile_setting == "auto" else bool(compile_setting)


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(Config)}  # type: ignore


# --- loading -------------------------------------------------------------------------------------------

def load_config(path: str | Path | dict | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML file (or a dict), apply `section.key=value` overrides, resolve the model, validate."""
    raw = _read_yaml(path) if not isinstance(path, dict) else _deep_copy(path)
    for item in overrides:
        key, value = _split_override(item)
        section, name = key.split(".", 1)
        if raw.get(section) is None:  # absent, or `train:` with nothing under it
            raw[section] = {}
        if not isinstance(raw[section], dict):
            raise ConfigError(f"{section}: must be a mapping of keys, got {_shown(raw[section])}")
        raw[section][name] = value
    return from_dict(raw)


def replaced(config: Config, overrides: dict) -> Config:
    """A new Config: `config` with {"section.key": value} applied (values already typed), then validated.
    `config` itself is left as loaded: the planner's budget mode and `--fit` plan the configs they choose
    through this, never by writing into the caller's."""
    by_section: dict[str, dict] = {}
    for key, value in overrides.items():
        section, name = key.split(".", 1)
        if section not in SECTIONS or name not in {f.name for f in dataclasses.fields(SECTIONS[section])}:
            raise ConfigError(_unknown(key, [f"{s}.{f.name}" for s, cls in SECTIONS.items()
                                             for f in dataclasses.fields(cls)], "key"))
        by_section.setdefault(section, {})[name] = value
    new = dataclasses.replace(config, **{s: dataclasses.replace(getattr(config, s), **v)
                                         for s, v in by_section.items()})
    return resolve(new)


def from_dict(raw: dict) -> Config:
    raw = _deep_copy(raw)
    for section in raw:
        if section not in SECTIONS:  # a YAML key may be a number or a boolean
            raise ConfigError(_unknown(str(section), list(SECTIONS), "section"))
        if raw[section] is None:
            raw[section] = {}
        if not isinstance(raw[section], dict):
            raise ConfigError(f"{section}: must be a mapping of keys, got {_shown(raw[section])}")
    raw["model"] = _resolve_model(raw.get("model", {}))
    sections = {name: _build(name, cls, raw.get(name, {})) for name, cls in SECTIONS.items()}
    return resolve(Config(**sections))


def _read_yaml(path) -> dict:
    if path is None:
        return {}
    import yaml  # PyYAML: a light import, only when a file is read

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; give a YAML file (see configs/)") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory; give a YAML file (see configs/)") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {e.start}); give a YAML file "
                          "(see configs/)") from None
    try:
        data = _load_yaml(text, path)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" line {where.line + 1}" if where else ""
        problem = str(getattr(e, "problem", e))
        raise ConfigError(f"{path}{line}: not valid YAML ({problem[:200]})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a config; give sections of key: value") from None
    if data is None:  # an empty file
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model:, train:, ...)")
    return data


# Values a YAML file may expand to, aliases (*name) counted as often as they are used: a config has ~100. The
# bound refuses a "billion laughs" file (nested aliases: 300 bytes that expand to ~10^9 values) before
# anything walks or prints the expansion.
MAX_YAML_VALUES = 100_000


def _load_yaml(text: str, path: Path):
    """yaml.safe_load, refusing (one line each) a key given twice in one mapping (YAML 1.2 forbids it; PyYAML
    keeps the last silently), a duplicate section, and aliases expanding to more than MAX_YAML_VALUES."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_yaml_nodes(root, path)
        return loader.construct_document(root)
    finally:
        loader.dispose()


def _check_yaml_nodes(root, path: Path) -> None:
    import yaml

    expanded: dict[int, int] = {}  # id(node) -> values it expands to: each shared node is counted once

    def size(node, open_nodes: set) -> int:
        if id(node) in expanded:
            return expanded[id(node)]
        if id(node) in open_nodes:
            raise ConfigError(f"{path} line {node.start_mark.line + 1}: an alias refers to a value that contains "
                              "it (a recursive structure); write the values out")
        open_nodes.add(id(node))
        n = 1
        if isinstance(node, yaml.MappingNode):
            _refuse_duplicate_keys(node, path, node is root)
            n += sum(size(key, open_nodes) + size(value, open_nodes) for key, value in node.value)
        elif isinstance(node, yaml.SequenceNode):
            n += sum(size(item, open_nodes) for item in node.value)
        open_nodes.discard(id(node))
        if n > MAX_YAML_VALUES:
            raise ConfigError(f"{path}: its aliases expand to more than {MAX_YAML_VALUES:,} values (a config has "
                              "~100); write the values out instead of nesting aliases")
        expanded[id(node)] = n
        return n

    size(root, set())


def _refuse_duplicate_keys(node, path: Path, top_level: bool) -> None:
    first: dict[tuple, int] = {}  # (tag, text) of a key -> the line it first appears on
    for key, _ in node.value:
        if not isinstance(key.value, str) or key.tag == "tag:yaml.org,2002:merge":
            continue  # a complex key, or `<<: *defaults` (YAML's merge key: its keys may be overridden)
        line = key.start_mark.line + 1
        if (key.tag, key.value) in first:
            what = "section" if top_level else "key"
            raise ConfigError(f"{path} line {line}: {what} {_shown(key.value)} is given twice (first at line "
                              f"{first[key.tag, key.value]}); YAML would keep only the last: keep one")
        first[key.tag, key.value] = line


def _shown(value, limit: int = 80) -> str:
    """A value echoed in an error, at most `limit` characters of its repr (a value from a file can be huge)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _split_override(item: str) -> tuple[str, str]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value (e.g. train.lr=3e-4)")
    key, value = item.split("=", 1)
    key = key.strip()
    if "." not in key:
        raise ConfigError(f"override {item!r} must name a section: section.key=value (e.g. model.preset=gpt2)")
    return key, value.strip()


def _resolve_model(user: dict) -> dict:
    """preset or hf_config first, then the keys the user gave on top of it."""
    base: dict = {}
    if user.get("preset") not in (None, "", "null", "none"):
        base = preset(str(user["preset"]))
    if user.get("hf_config") not in (None, "", "null"):
        base = from_hf_config(str(user["hf_config"]))
    base.update({k: v for k, v in user.items()})
    return base


def _build(section: str, cls: type, values: dict):
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(_unknown(f"{section}.{key}", [f"{section}.{n}" for n in names], "key"))
        kwargs[key] = coerce(f"{section}.{key}", value, hints[key])
    obj = cls(**kwargs)
    for f in dataclasses.fields(cls):
        choices = f.metadata.get("choices")
        value = getattr(obj, f.name)
        if choices and value not in choices:
            allowed = " | ".join(str(c) for c in choices)
            raise ConfigError(f"{section}.{f.name}: {_shown(value)} is not allowed; choose one of {allowed}")
    return obj


def _unknown(name: str, allowed: list[str], what: str) -> str:
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else "see `pretrain config --docs` for all keys"
    return f"unknown config {what} {name!r}; {hint}"


_NULLS = ("null", "~", "None")
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def coerce(key: str, value: Any, tp: Any) -> Any:
    """Turn a YAML value or a command-line string into the field's type, or say what was expected."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value in _NULLS):
            if type(None) in typing.get_args(tp):
                return None
        # Prefer int over float for "100" and float over int for "0.005".
        errors = []
        for option in sorted(options, key=lambda t: 0 if t is int else 1):
            try:
                return coerce(key, value, option)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[-1])
    if origin is list:
        (inner,) = typing.get_args(tp)
        if isinstance(value, str) and inner is dict:  # data.mixture=[{dir: a, weight: 0.7}, ...]
            import yaml

            try:
                value = _load_yaml(value, Path(key))
            except yaml.YAMLError as e:
                raise ConfigError(f"{key}: not a YAML list ({' '.join(str(e).split())[:120]})") from None
        if isinstance(value, str):
            value = [v for v in value.strip("[]() ").split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list like [0.9, 0.95], got {_shown(value)}")
        return [coerce(key, v, inner) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise ConfigError(f"{key}: expected true or false, got {_shown(value)}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {_shown(value)}")
        if isinstance(value, int):
            return value
        try:  # exactly, before a float would round a large integer
            return int(str(value).replace("_", ""))
        except ValueError:
            pass
        number = _number(value)  # 1.4e12 and 2_000 are integers too
        if number is not None and float(number).is_integer():
            return int(number)
        raise ConfigError(f"{key}: expected an integer, got {_shown(value)}")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {_shown(value)}")
        number = _number(value)
        if number is None:
            raise ConfigError(f"{key}: expected a number, got {_shown(value)}")
        return float(number)
    if tp is dict:  # a data.mixture entry; on the command line the whole list is YAML: [{dir: a, weight: 1}]
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping like {{dir: DIR, weight: 0.7}}, got {_shown(value)}")
        return dict(value)
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: expected a string, got {_shown(value)}")
        return str(value)
    raise ConfigError(f"{key}: unsupported type {tp}")  # pragma: no cover - schema bug


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value.replace("_", ""))
        except ValueError:
            return None
    return None


def _deep_copy(data: dict) -> dict:
    return {k: (_deep_copy(v) if isinstance(v, dict) else v) for k, v in (data or {}).items()}


# --- validation -----------------------------------------------------------------------------------------

def _positive(key: str, value, allow_zero: bool = False):
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{key}: must be {bound}, got {value}")


LARGEST = 2**63 - 1  # int64: what the trainer's tensors and the token file's offsets hold


def _refuse_non_finite(c: Config) -> None:
    """NaN passes every `<` test and infinity every `>`, and a number beyond int64 overflows the planner's
    arithmetic (GB x 1e9, TFLOP/s x 1e12 x GPUs): refuse them for every numeric key before other checks."""
    for section in SECTIONS:
        values = getattr(c, section)
        for f in dataclasses.fields(values):
            value = getattr(values, f.name)
            for x in value if isinstance(value, list) else [value]:
                if isinstance(x, bool) or not isinstance(x, (int, float)):
                    continue
                if not math.isfinite(x):
                    raise ConfigError(f"{section}.{f.name}: must be a finite number, got {x}")
                if abs(x) > LARGEST:
                    raise ConfigError(f"{section}.{f.name}: {x:.3g} is too large; at most 2^63 - 1 (int64)")


def resolve(c: Config) -> Config:
    """The config with its derived defaults filled in (num_kv_heads, head_dim, seq_len), checked: what every
    reader sees. A new object; the config is frozen, so no value changes after this."""
    _refuse_non_finite(c)
    m, t = c.model, c.train
    for name in ("hidden_size", "num_heads", "max_seq_len"):
        _positive(f"model.{name}", getattr(m, name))
    if m.head_dim is None and m.hidden_size % m.num_heads:
        raise ConfigError(f"model.num_heads: {m.num_heads} heads do not divide hidden_size {m.hidden_size}; "
                          "pick a divisor or set model.head_dim")
    model = dataclasses.replace(m, num_kv_heads=m.num_heads if m.num_kv_heads is None else m.num_kv_heads,
                                head_dim=m.hidden_size // m.num_heads if m.head_dim is None else m.head_dim)
    train = dataclasses.replace(t, seq_len=min(2048, m.max_seq_len) if t.seq_len is None else t.seq_len)
    c = dataclasses.replace(c, model=model, train=train)
    validate(c)
    return c


def validate(c: Config) -> None:
    """Checks that need no files and no torch; each failure names the key and what is allowed."""
    _refuse_non_finite(c)
    m, t, p, h = c.model, c.train, c.parallel, c.hardware
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "max_seq_len"):
        _positive(f"model.{name}", getattr(m, name))
    _positive("model.num_kv_heads", m.num_kv_heads)
    _positive("model.head_dim", m.head_dim)
    if m.num_heads % m.num_kv_heads:
        raise ConfigError(f"model.num_kv_heads: {m.num_kv_heads} must divide num_heads {m.num_heads}")
    if m.family == "gpt2":
        if m.num_heads * m.head_dim != m.hidden_size:
            raise ConfigError("model.head_dim: the gpt2 family needs num_heads x head_dim == hidden_size")
        if m.num_kv_heads != m.num_heads:
            raise ConfigError("model.num_kv_heads: the gpt2 family has no grouped-query attention; "
                              "leave num_kv_heads unset")
    if m.family == "llama" and m.head_dim % 2:
        raise ConfigError(f"model.head_dim: rotary embeddings need an even head_dim, got {m.head_dim}")
    if not 0 <= m.dropout < 1:
        raise ConfigError(f"model.dropout: must be in [0, 1), got {m.dropout}")
    _positive("model.norm_eps", m.norm_eps)
    _positive("model.pad_vocab_to", m.pad_vocab_to)
    _positive("model.init_std", m.init_std)

    for name in ("seq_len", "micro_batch_size", "grad_accum_steps", "epochs"):
        _positive(f"train.{name}", getattr(t, name))
    for name in ("tokens", "examples", "max_steps"):
        _positive(f"train.{name}", getattr(t, name))
    if t.seq_len > m.max_seq_len:
        raise ConfigError(f"train.seq_len: {t.seq_len} is longer than model.max_seq_len {m.max_seq_len}; "
                          "lower train.seq_len or raise model.max_seq_len")
    _positive("train.lr", t.lr)
    if not 0 <= t.min_lr_ratio <= 1:
        raise ConfigError(f"train.min_lr_ratio: must be in [0, 1], got {t.min_lr_ratio}")
    if isinstance(t.warmup, float) and not 0 <= t.warmup < 1:
        raise ConfigError(f"train.warmup: a fraction must be in [0, 1), got {t.warmup}; "
                          "give an integer for a number of steps")
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

    for name in ("gpus", "tensor", "pipeline", "gpus_per_node"):
        _positive(f"parallel.{name}", getattr(p, name))
    if p.gpus % (p.tensor * p.pipeline):
        raise ConfigError(f"parallel.gpus: {p.gpus} GPUs are not divisible by tensor x pipeline = "
                          f"{p.tensor} x {p.pipeline}; make gpus a multiple of {p.tensor * p.pipeline}")
    if p.tensor > 1 and m.num_heads % p.tensor:
        raise ConfigError(f"parallel.tensor: {p.tensor} must divide model.num_heads {m.num_heads}")
    if p.tensor > 1 and m.num_kv_heads % p.tensor:  # Megatron splits whole key/value groups over the ranks
        raise ConfigError(f"parallel.tensor: {p.tensor} must divide model.num_kv_heads {m.num_kv_heads} "
                          "(each tensor rank holds whole key/value heads); pick a divisor")
    if p.pipeline > m.num_layers:
        raise ConfigError(f"parallel.pipeline: {p.pipeline} stages for {m.num_layers} layers; "
                          "use at most one stage per layer")
    if p.sequence_parallel and p.tensor == 1:
        raise ConfigError("parallel.sequence_parallel: needs parallel.tensor > 1")
    if p.offload == "optimizer+params" and (p.zero_stage != 3 or p.gpus == p.tensor * p.pipeline):
        # Parameters live off the GPU only when ZeRO-3 gathers them per block (DeepSpeed ZeRO-Infinity).
        raise ConfigError("parallel.offload: optimizer+params needs parallel.zero_stage=3 with data parallel > 1 "
                          "(parameter offload exists only with ZeRO-3); set it, or use parallel.offload=optimizer")
    if p.pipeline_schedule == "interleaved_1f1b" and p.pipeline > 1 and 2 * p.pipeline > m.num_layers:
        raise ConfigError(f"parallel.pipeline_schedule: interleaved_1f1b runs 2 chunks of layers per stage, "
                          f"{2 * p.pipeline} for {m.num_layers} layers; use 1f1b or parallel.pipeline <= "
                          f"{m.num_layers // 2}")

    gpu_spec(h.gpu)  # raises with the list of known cards
    if not 0 < h.mfu <= 1:
        raise ConfigError(f"hardware.mfu: must be in (0, 1], got {h.mfu}")
    if h.hfu is not None and not 0 < h.hfu <= 1:
        raise ConfigError(f"hardware.hfu: must be in (0, 1], got {h.hfu}")
    for name in ("peak_tflops", "memory_gb", "price_per_gpu_hour", "intra_node_gbps", "inter_node_gbps"):
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
        raise ConfigError(f"budget: {' and '.join(given)} both given; give one of budget.gpu_hours, budget.days, "
                          "budget.cost")
    if c.budget.cost is not None and not h.price_per_gpu_hour:
        raise ConfigError("budget.cost: needs hardware.price_per_gpu_hour (the price of one GPU-hour)")
    _positive("data.raw_bytes", c.data.raw_bytes)
    _positive("data.bytes_per_token", c.data.bytes_per_token)
    if c.data.raw_bytes and not c.data.bytes_per_token:
        raise ConfigError("data.raw_bytes: needs data.bytes_per_token too (measure it with `pretrain tokenizer "
                          "stats --tokenizer DIR --input CORPUS`)")
    if c.data.mixture and c.data.dir:
        raise ConfigError("data.mixture: exclusive with data.dir; remove data.dir (each mixture source names its "
                          "own directory)")
    mixture_sources(c.data)
    r = c.run
    for name in ("log_every", "eval_batches", "keep_checkpoints"):
        _positive(f"run.{name}", getattr(r, name))
    for name in ("eval_every", "checkpoint_every"):
        _positive(f"run.{name}", getattr(r, name), allow_zero=True)
    st = c.stability
    for name in ("window", "min_history", "threshold", "patience", "max_rollbacks", "rollback_window", "lr_scale"):
        _positive(f"stability.{name}", getattr(st, name))
    _positive("stability.min_rise", st.min_rise, allow_zero=True)
    _positive("stability.lr_scale_steps", st.lr_scale_steps, allow_zero=True)
    if st.min_history > st.window:  # the history is the window: it would never be long enough to judge
        raise ConfigError(f"stability.min_history: {st.min_history} is more than stability.window {st.window}, so "
                          f"no spike would ever be judged; raise stability.window or lower stability.min_history")


def untrained(c: Config) -> list[str]:
    """The keys set to a value the planner models but the trainer does not run, as `section.key: reason`."""
    found = []
    for section in SECTIONS:
        values = getattr(c, section)
        for f in dataclasses.fields(values):
            trains = f.metadata["trains"]
            if trains is not None and getattr(values, f.name) not in trains:
                allowed = " | ".join(_value(v) for v in trains)
                found.append(f"{section}.{f.name}: {_value(getattr(values, f.name))} is planned but not trained "
                             f"(`pretrain plan` models it); `pretrain train` runs {allowed}")
    return found


def _value(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


MIXTURE_KEYS = ("dir", "weight", "name", "max_epochs")


def mixture_sources(data: DataConfig) -> list[dict]:
    """data.mixture checked and completed: [{name, dir, weight (normalised to sum 1), max_epochs or None}].
    The trainer and the planner both read the mixture through this, so they agree on names and shares."""
    sources = []
    for i, entry in enumerate(data.mixture):
        key = f"data.mixture[{i}]"
        unknown = [k for k in entry if k not in MIXTURE_KEYS]
        if unknown:
            raise ConfigError(_unknown(f"{key}.{unknown[0]}", [f"{key}.{k}" for k in MIXTURE_KEYS], "key"))
        for required in ("dir", "weight"):
            if entry.get(required) in (None, ""):
                raise ConfigError(f"{key}: no {required}; each source is {{dir: DIR, weight: W}} (weights count "
                                  "tokens)")
        directory = coerce(f"{key}.dir", entry["dir"], str)
        weight = coerce(f"{key}.weight", entry["weight"], float)
        if not math.isfinite(weight) or weight <= 0:
            raise ConfigError(f"{key}.weight: must be a finite number > 0, got {weight}")
        max_epochs = entry.get("max_epochs")
        if max_epochs is not None:
            max_epochs = coerce(f"{key}.max_epochs", max_epochs, float)
            if not math.isfinite(max_epochs) or max_epochs <= 0:
                raise ConfigError(f"{key}.max_epochs: must be a finite number > 0, got {max_epochs}")
        name = coerce(f"{key}.name", entry.get("name") or Path(directory.rstrip("/")).name, str)
        if not name or "/" in name:  # names become metric keys: val_loss/<name>, source_tokens/<name>
            raise ConfigError(f"{key}.name: {_shown(name)} is not a usable name; give a non-empty name without '/'")
        if any(s["name"] == name for s in sources):
            raise ConfigError(f"{key}.name: two sources are named {name!r}; give each a distinct name")
        sources.append({"name": name, "dir": directory, "weight": weight, "max_epochs": max_epochs})
    total = sum(s["weight"] for s in sources)
    return [{**s, "weight": s["weight"] / total} for s in sources]


# --- documentation -------------------------------------------------------------------------------------

def docs_markdown() -> str:
    """The key table of docs/config.md: every section, key, default and meaning."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            shown = "null" if default is None else str(default).lower() if isinstance(default, bool) else default
            trains = f.metadata["trains"]
            note = f" *Planner only beyond {' / '.join(f'`{_value(v)}`' for v in trains)}: the trainer runs " \
                   "only that.*" if trains else ""
            lines.append(f"| `{section}.{f.name}` | `{shown}` | {f.metadata['doc']}{note} |")
    return "\n".join(lines)
