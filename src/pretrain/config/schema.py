"""The config schema: its sections and keys, each with its default, meaning, allowed values and what the
trainer runs (`doc`). docs/config.md's key table is generated from it (`docs_markdown`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, cast, get_type_hints

from ..presets import PRESETS


def doc(default: Any, text: str, choices: tuple[Any, ...] | None = None, trains: tuple[Any, ...] | None = None) -> Any:
    """A dataclass field with its documentation, the allowed values (for strings) and, when the trainer runs
    fewer values than the planner models, the ones it runs (`trains`): `check_trainable` refuses the others
    and docs/config.md's key table says so, both from this one place."""
    metadata: dict[str, Any] = {"doc": text, "choices": choices, "trains": trains}
    if isinstance(default, list):
        items = cast(list[Any], default)
        return field(default_factory=lambda: list(items), metadata=metadata)
    return field(default=default, metadata=metadata)


FAMILIES = ("llama", "gpt2")
PRECISIONS = ("fp32", "fp16-mixed", "bf16-mixed", "bf16", "fp8")
OPTIMIZERS = ("adamw", "adafactor", "sgd")
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("cosine", "linear", "inverse_sqrt", "wsd")
LOGGERS = ("tensorboard", "wandb", "mlflow")


@dataclass(frozen=True)
class ModelConfig:
    preset: str | None = doc(None, "named model shape: " + " | ".join(PRESETS) + "; keys given beside it override it")
    hf_config: str | None = doc(None, "a Hugging Face config.json (or its directory) to take the shape from")
    family: str = doc(
        "llama",
        "llama (RMSNorm, RoPE, SwiGLU, no biases) | gpt2 (LayerNorm, learned positions, "
        "GELU MLP, biases, tied embeddings)",
        FAMILIES,
    )
    vocab_size: int = doc(32000, "vocabulary size V")
    hidden_size: int = doc(4096, "model width H")
    intermediate_size: int = doc(11008, "MLP width H' (SwiGLU: each of gate, up; GPT-2: 4H)")
    num_layers: int = doc(32, "transformer blocks L")
    num_heads: int = doc(32, "attention (query) heads")
    num_kv_heads: int | None = doc(
        None, "key/value heads; fewer than num_heads = grouped-query attention (default num_heads)"
    )
    max_seq_len: int = doc(2048, "the model's context length (GPT-2: size of the position table)")
    head_dim: int | None = doc(None, "size of one head (default hidden_size / num_heads)")
    sliding_window: int | None = doc(
        None,
        "the attention window of a checkpoint's config.json (model.hf_config "
        "sets it: Mistral, Qwen2/3 with use_sliding_window); pretrain's full "
        "attention is the window's exactly while train.seq_len <= it, so a longer "
        "train.seq_len is refused",
    )
    tie_embeddings: bool = doc(False, "output layer shares the input embedding matrix")
    qkv_bias: bool = doc(False, "biases on the q, k, v projections (Qwen2 style)")
    qk_norm: bool = doc(
        False,
        "llama family: RMSNorm over each head's query and key before RoPE, a weight of head_dim each (Qwen3 style)",
    )
    qk_norm_over: str = doc(
        "head",
        "model.qk_norm's extent: head (Qwen3: one weight of head_dim shared by the "
        "heads) | projection (OLMoE: one weight over the whole q and the whole k projection)",
        ("head", "projection"),
    )
    bias: bool = doc(True, "gpt2 family: biases in linear layers and LayerNorm (false = nanoGPT bias-free)")
    dropout: float = doc(0.0, "dropout probability (pretraining uses 0)")
    norm_eps: float = doc(1e-5, "epsilon of RMSNorm / LayerNorm")
    rope_theta: float = doc(10000.0, "llama family: RoPE base frequency")
    rope_scaling: dict[str, Any] | None = doc(
        None,
        "llama family: RoPE stretched for a longer context, a mapping as Hugging "
        "Face writes it: {rope_type: llama3, factor: 8, low_freq_factor: 1, "
        "high_freq_factor: 4, original_max_position_embeddings: 8192} (Llama 3.1) or "
        "{rope_type: yarn, factor, original_max_position_embeddings, beta_fast, "
        "beta_slow, attention_factor} (docs/train.md: Long context)",
    )
    position_reset: bool | None = doc(
        None,
        "positions restart at 0 after each <eos> (RoPE angles; GPT-2's learned "
        "positions): null = as train.document_masking (docs/train.md: Document "
        "masking)",
    )
    init_std: float = doc(
        0.02, "std of the normal initialisation; residual projections get init_std / sqrt(2 * num_layers)"
    )
    init_from: str | None = doc(None, "a local Hugging Face model directory to start from (continued pretraining)")
    pad_vocab_to: int = doc(
        1,
        "round the embedding and output-layer rows up to a multiple of this (64: GPT-2's "
        "50,257 -> 50,304, faster matmuls); the padded rows are never a target, export drops them",
    )
    num_experts: int = doc(
        0, "Mixture-of-Experts (llama family): routed experts per MoE layer; 0 = a dense model (docs/moe.md)"
    )
    experts_per_token: int = doc(2, "MoE: routed experts each token is sent to (top-k token-choice routing)")
    moe_intermediate_size: int | None = doc(
        None, "MoE: SwiGLU width of one routed or shared expert (default intermediate_size)"
    )
    num_shared_experts: int = doc(0, "MoE: always-on experts of moe_intermediate_size that every token passes")
    first_dense_layers: int = doc(0, "MoE: the first blocks keep a dense MLP of intermediate_size (DeepSeek-V3: 3)")
    router: str = doc(
        "softmax", "MoE: router scores: softmax (Mixtral, Qwen3, OLMoE) | sigmoid (DeepSeek-V3)", ("softmax", "sigmoid")
    )
    norm_topk_prob: bool = doc(
        True, "MoE: rescale the top-k routing weights to sum to 1 (Mixtral, Qwen3: yes; OLMoE: no)"
    )
    router_aux_loss_coef: float = doc(0.01, "MoE: weight of the Switch-style load-balancing loss (0 = off)")
    router_z_loss_coef: float = doc(
        0.0, "MoE: weight of the router z-loss, mean squared logsumexp of the router logits (OLMoE: 0.001)"
    )
    router_bias_update_rate: float = doc(
        0.0,
        "MoE: DeepSeek-V3's auxiliary-loss-free balancing: after each "
        "optimizer step every expert's routing bias moves by this towards equal "
        "load (0 = off; DeepSeek-V3: 0.001)",
    )
    kv_lora_rank: int = doc(
        0,
        "multi-head latent attention (DeepSeek-V3), planner only: width of the compressed "
        "key/value latent; 0 = ordinary attention. head_dim is then the query/key head (nope + "
        "rope parts)",
    )
    q_lora_rank: int = doc(0, "MLA: width of the compressed query latent (0 = a direct query projection)")
    qk_rope_head_dim: int = doc(0, "MLA: the rotary part of each query/key head, with its key shared by all heads")
    v_head_dim: int | None = doc(None, "MLA: size of a value head (default head_dim)")
    attention_bias: bool = doc(
        False,
        "biases on q, k, v and the attention output projection (gpt-oss), planner "
        "only; model.qkv_bias is q, k, v alone",
    )
    attention_sinks: bool = doc(False, "a learned sink logit per attention head (gpt-oss), planner only")
    expert_bias: bool = doc(
        False, "MoE: biases on the router and on every expert's projections (gpt-oss), planner only"
    )


@dataclass(frozen=True)
class TrainConfig:
    seq_len: int | None = doc(None, "tokens per training sequence (default: the model's max_seq_len, at most 2048)")
    micro_batch_size: int = doc(1, "sequences per GPU per forward/backward")
    grad_accum_steps: int = doc(
        8, "micro-batches accumulated per optimizer step (derived from global_batch_tokens when that is set)"
    )
    global_batch_tokens: int | None = doc(
        None,
        "tokens per optimizer step over all GPUs (e.g. 4M, as LLaMA and "
        "Qwen use): grad_accum_steps is derived from it, so the global batch "
        "stays the same on any GPU count, layout or micro-batch; it must be a "
        "multiple of micro_batch_size x seq_len x data-parallel ranks",
    )
    tokens: int | None = doc(
        None,
        "training tokens; default: max_steps, else examples x epochs, else the "
        "Chinchilla-optimal 20 tokens per parameter",
    )
    examples: int | None = doc(None, "training examples (one example = one seq_len window); with epochs")
    epochs: int = doc(1, "passes over `examples`")
    max_steps: int | None = doc(None, "optimizer steps to run (takes precedence over tokens)")
    device: str = doc("auto", "auto | cpu | cuda (train only; the planner ignores it)")
    precision: str = doc(
        "bf16-mixed",
        "fp32 | fp16-mixed | bf16-mixed (autocast, fp32 master weights) | "
        "bf16 (pure bf16 weights and optimizer states) | fp8 (bf16-mixed, and the blocks' linears "
        "multiply in float8 through torchao: pretrain[fp8]; docs/train.md: FP8 training)",
        PRECISIONS,
    )
    fp8_recipe: str = doc(
        "tensorwise",
        "fp8: scaling of the float8 casts: tensorwise (one scale per tensor; "
        "FSDP all-gathers the weights in float8) | rowwise (one per row: closer to bf16, slower)",
        ("tensorwise", "rowwise"),
    )
    fp8_min_features: int = doc(
        1024,
        "fp8: a linear whose in or out features are below this stays bf16 (small "
        "GEMMs gain less than the casts cost: torchao's H100 tables skip out <= 1024)",
    )
    optimizer: str = doc("adamw", "adamw | adafactor | sgd", OPTIMIZERS)
    activation_checkpointing: str = doc(
        "none",
        "none | selective (operator-level, torchtitan's op policy: "
        "keep attention's and every other matmul's outputs, recompute the rest) | "
        "full (recompute each block)",
        RECOMPUTE,
    )
    attention: str = doc(
        "sdpa",
        "sdpa (flash / memory-efficient, no seq x seq scores kept) | eager (scores materialised)",
        ("sdpa", "eager"),
    )
    document_masking: bool = doc(
        False,
        "each token attends only to earlier tokens of its own document in the "
        "window, the documents found from the <eos> ids (docs/train.md: Document masking)",
    )
    cache_weight_casts: bool = doc(
        False,
        "*-mixed and fp8 without FSDP, tensor or pipeline parallelism (refused "
        "elsewhere): cast the "
        "fp32 weights to the compute dtype once per optimizer step and reuse the copies "
        "over its micro-batches (autocast's cast cache) instead of once per micro-batch; "
        "the plan counts every block's copy held for the whole step. Eager blocks only: a "
        "compiled block casts inside its graph",
    )
    half_residual: bool = doc(
        False,
        "*-mixed and fp8: the residual stream in the 16-bit compute dtype, as "
        "Megatron keeps it, instead of autocast's fp32 (the embedding's output cast); the "
        "plan halves its terms. FSDP's mixed precision and pure bf16 keep it 16-bit anyway; "
        "fp32 and bf16 refuse it",
    )
    grad_dtype: str = doc(
        "fp32", "fp32 | same (gradients in the compute dtype, as the ZeRO paper counts)", ("fp32", "same")
    )
    batch_ramp_tokens: int = doc(0, "tokens over which the global batch grows to its target; 0 = off")
    batch_ramp_start: int = doc(32768, "global batch in tokens at the start of the ramp (GPT-3: 32K)")
    lr: float = doc(3e-4, "peak learning rate")
    min_lr_ratio: float = doc(0.1, "learning-rate floor as a fraction of the peak")
    warmup: float | int = doc(0.005, "linear warm-up: a fraction of the steps (float < 1) or a step count (int)")
    schedule: str = doc(
        "cosine", "decay after warm-up: cosine | linear | inverse_sqrt | wsd (warmup-stable-decay)", SCHEDULES
    )
    decay_fraction: float = doc(0.2, "wsd: fraction of the steps spent in the final linear decay")
    schedule_restart: bool = doc(
        False,
        "on a --resume that changes the run's length, follow the cosine or "
        "linear schedule of the new length (the LR jumps to it); without it such a resume "
        "is refused. wsd extends its stable phase and inverse_sqrt has no end: both go on "
        "without it (docs/train.md)",
    )
    grad_clip: float = doc(1.0, "clip the global gradient norm to this value (0 = off)")
    weight_decay: float = doc(0.1, "AdamW decoupled weight decay, on matrices only")
    betas: list[float] = doc([0.9, 0.95], "AdamW beta1, beta2")
    eps: float = doc(1e-8, "AdamW epsilon")
    momentum: float = doc(0.9, "SGD momentum")
    seed: int = doc(1234, "seed of initialisation, data order and dropout")
    compile: bool | str = doc("auto", "torch.compile: auto (on for CUDA, off for CPU) | true | false")
    loss: str = doc(
        "chunked",
        "cross-entropy: chunked (output layer and loss a chunk of tokens at a time, fp32 "
        "logits only inside a chunk) | plain (full-vocabulary fp32 logits at once)",
        ("chunked", "plain"),
    )
    loss_chunk_tokens: int = doc(4096, "tokens per chunk of the chunked loss")


@dataclass(frozen=True)
class ParallelConfig:
    gpus: int = doc(1, "world size (all GPUs of the job), at most 2^20; data parallel = gpus / (tensor x pipeline)")
    tensor: int = doc(1, "tensor-parallel degree (LLaMA family; docs/parallel.md)")
    pipeline: int = doc(1, "pipeline-parallel degree (docs/parallel.md)")
    expert: int = doc(
        1,
        "expert-parallel degree (MoE): the routed experts are split over groups of this many "
        "data-parallel ranks, tokens exchanged by all-to-all; it divides model.num_experts and the "
        "data-parallel degree (docs/moe.md)",
    )
    zero_stage: int = doc(
        0, "0 (DDP) | 1 (optimizer states sharded) | 2 (+ gradients) | 3 (+ weights, FSDP2)", (0, 1, 2, 3)
    )
    sequence_parallel: bool = doc(False, "shard norm/dropout activations over the tensor-parallel group")
    async_tp: bool = doc(
        False,
        "async tensor parallelism: each all-gather/reduce-scatter split into chunks that move while the "
        "matmul beside it runs (torch's micro-pipeline TP, as torchtitan's enable_async_tensor_parallel and "
        "Megatron's --tp-comm-overlap); needs parallel.sequence_parallel, train.compile and CUDA; "
        "docs/parallel.md",
    )
    offload: str = doc(
        "none",
        "none | optimizer | optimizer+params (ZeRO-Offload: states in host memory)",
        ("none", "optimizer", "optimizer+params"),
        trains=("none",),
    )
    gpus_per_node: int = doc(8, "GPUs per machine (for host memory per node)")
    grad_sync: str = doc(
        "micro_batch",
        "FSDP (ZeRO 2/3) with gradient accumulation: micro_batch (reduce-scatter "
        "after every micro-batch: gradients stay sharded) | step (only after the last micro-batch: "
        "less communication, unsharded fp32 gradients held in between)",
        ("micro_batch", "step"),
    )
    pipeline_schedule: str = doc(
        "1f1b",
        "1f1b | interleaved_1f1b (each pipeline rank runs 2 model chunks: a "
        "bubble of (p-1)/(2m+p-1) for more micro-batches in flight; docs/parallel.md)",
        ("1f1b", "interleaved_1f1b"),
    )

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
    gpu: str = doc(
        "a100-80gb",
        "accelerator from the catalog (`pretrain plan --list-gpus` lists it), cpu, or "
        "other-gpu (a card not listed: give memory_gb and peak_tflops)",
    )
    mfu: float | None = doc(
        None,
        "explicit override of the step-time model: an assumed model FLOPs utilisation "
        "(fraction of peak); when set, time = model FLOPs / (gpus x peak x mfu)",
    )
    hfu: float | None = doc(
        None,
        "explicit override of the step-time model: an assumed hardware FLOPs "
        "utilisation; when set, time = hardware FLOPs (recomputation included) / (gpus x peak "
        "x hfu)",
    )
    peak_tflops: float | None = doc(None, "override the catalog's dense peak TFLOP/s for the compute dtype")
    memory_gb: float | None = doc(None, "override the card's memory (GB, 1e9 bytes)")
    bandwidth_gbps: float | None = doc(
        None,
        "override the card's data-sheet memory bandwidth (GB/s), which sets "
        "the step-time model's memory-bound terms: a variant of a catalog card "
        "(an H100 with 96 GB of HBM2e: 2400) or an other-gpu",
    )
    profile: str | None = doc(
        None, "a hardware profile JSON written by `pretrain bench`: its achievable TFLOP/s replaces the data-sheet peak"
    )
    price_per_gpu_hour: float | None = doc(None, "price of one GPU-hour, for a cost estimate")
    intra_node_gbps: float | None = doc(
        None,
        "step-time model: GB/s per GPU per direction between GPUs of a node, "
        "as measured (nccl-tests bus bandwidth); default the catalog's NVLink / "
        "PCIe figure x 0.8 (h100-sxm 450, a100 300)",
    )
    inter_node_gbps: float | None = doc(
        None,
        "step-time model: GB/s per GPU per direction between nodes, as "
        "measured; default the catalog's network x 0.8 (one 400 Gb/s NIC per "
        "H100 = 50, 200 Gb/s per A100 = 25)",
    )
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
    convention: str = doc(
        "palm",
        "FLOPs behind time and MFU: palm (6 x non-embedding N + attention) | "
        "6n (6 x all parameters; 8 x with full recomputation)",
        ("palm", "6n"),
    )


@dataclass(frozen=True)
class DataConfig:
    dir: str | None = doc(
        None,
        "a directory written by `pretrain prepare` (the planner reads its meta.json: tokens "
        "available and bytes per token)",
    )
    raw_bytes: float | None = doc(
        None,
        "planner: size of the raw text corpus in bytes (300e9 = 300 GB), for the "
        "tokens it holds and the epochs the run needs",
    )
    bytes_per_token: float | None = doc(
        None,
        "planner: UTF-8 bytes per token of the tokenizer on this text (from "
        "`pretrain tokenizer stats`); with data.raw_bytes",
    )
    verify: str = doc(
        "auto",
        "checks of data.dir at train start beyond sizes and headers (always done): full = "
        "re-hash train.bin / val.bin against meta.json's sha256, auto = full when they total at most "
        "1 GiB, size = no hashing",
        ("auto", "full", "size"),
    )
    mean_doc_tokens: float | None = doc(
        None,
        "planner: mean document length in tokens (<eos> included), for the "
        "attention FLOPs of train.document_masking when data.dir's meta.json (or "
        "a data.mixture source's) has no doc_length_histogram",
    )
    mixture: list[dict[str, Any]] = doc(
        [],
        "train on several prepared directories in chosen proportions: a list of {dir, "
        "weight, name, max_epochs}; weights count tokens and are normalised, name defaults "
        "to the directory's base name; exclusive with data.dir (docs/data.md: Mixtures)",
    )


@dataclass(frozen=True)
class PlanConfig:
    framework: str = doc(
        "pretrain",
        "memory accounting of `pretrain plan`: pretrain (what our trainer holds) | "
        "megatron | deepspeed | zero-paper (each framework's published formulas, added to the plan "
        "as `framework`; sources in --explain)",
        ("pretrain", "megatron", "deepspeed", "zero-paper"),
    )
    routing_imbalance: float = doc(
        1.72,
        "MoE: the busiest expert's tokens over the mean, for the routed tokens' "
        "activations and the expert GEMMs' time; 1.72 = 1 + MaxVio_global 0.72 of the "
        "auxiliary-loss-balanced 1B MoE of Wang et al. 2024 (arXiv 2408.15664, table 2); "
        "1 = perfectly balanced (docs/moe.md)",
    )


@dataclass(frozen=True)
class BudgetConfig:
    gpu_hours: float | None = doc(
        None,
        "planner budget mode: GPU-hours to spend. No model given: the plan chooses "
        "the Chinchilla-optimal model and tokens for that compute; a model given "
        "(model.preset, model.hf_config or a shape key away from its default): it keeps "
        "that model and sets train.tokens to what the budget buys at the plan's own time; "
        "train.tokens, max_steps or examples beside a budget are refused (docs/plan.md: "
        "Budget mode)",
    )
    days: float | None = doc(None, "budget mode: days of parallel.gpus GPUs (as budget.gpu_hours)")
    cost: float | None = doc(None, "budget mode: money to spend, at hardware.price_per_gpu_hour (as budget.gpu_hours)")


@dataclass(frozen=True)
class RunConfig:
    dir: str = doc(
        "runs/default", "everything of a run: metrics.jsonl, events.jsonl, plan_vs_run.json, checkpoints/, tensorboard/"
    )
    log_every: int = doc(10, "optimizer steps between metric lines")
    eval_every: int = doc(200, "optimizer steps between validation passes (0 = only at the end)")
    eval_batches: int = doc(20, "micro-batches per validation pass")
    eval_tasks: list[str] = doc(
        [],
        "downstream multiple-choice tasks scored in the loop, as `pretrain eval --tasks`: "
        "names (pretrain[eval]), small, all, or .jsonl paths (docs/eval.md)",
    )
    eval_tasks_every: int | None = doc(
        None, "optimizer steps between task evaluations (default run.eval_every; 0 = only at the end)"
    )
    eval_tasks_limit: int | None = doc(500, "examples per task in each in-loop evaluation (null: all)")
    checkpoint_every: int = doc(
        500,
        "optimizer steps between checkpoints, and one at the end; 0 = none at all (a "
        "benchmark: a SIGTERM then stops without one, a loss spike or NaN stops the run "
        "instead of rolling back)",
    )
    keep_checkpoints: int = doc(3, "checkpoints kept; older ones are deleted")
    resume: str = doc("never", "auto (continue from the newest complete checkpoint) | never", ("auto", "never"))
    progress: bool = doc(True, "show a progress bar")
    loggers: list[str] = doc(
        ["tensorboard"],
        "where the scalars of metrics.jsonl also go, any of: tensorboard, "
        "wandb (pretrain[wandb]; offline into RUN_DIR/wandb/ unless WANDB_MODE or a W&B login "
        "says otherwise), mlflow (pretrain[mlflow]; RUN_DIR/mlruns/ unless "
        "MLFLOW_TRACKING_URI is set)",
        LOGGERS,
    )


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
    inject_nan_batches: list[int] = doc(
        [], "testing: micro-batches (by position in the data stream) whose loss becomes NaN"
    )
    inject_spike_batches: list[int] = doc([], "testing: micro-batches whose loss is multiplied by inject_spike_factor")
    inject_spike_factor: float = doc(20.0, "testing: the factor of inject_spike_batches")
    inject_inf_grad_batches: list[int] = doc(
        [],
        "testing: micro-batches in which rank 0's gradient of one "
        "embedding row becomes inf (an fp16 overflow that one rank's "
        "shard holds); each rank writes RUN_DIR/faults.rank<R>.json",
    )
    fp8_check: int = doc(
        0,
        "fp8: after each of the first N optimizer steps, a bf16 shadow of the first, middle "
        "and last blocks' float8 linears logs each one's relative output error (metrics.jsonl "
        "fp8_rel_err; an eager forward outside the step, compiled or not); 0: off",
    )
    check_sharding: bool = doc(
        False, "assert each rank holds exactly the model-state bytes the planner predicts for it"
    )
    plan_vs_run_per_rank: bool = doc(
        False,
        "every rank also writes RUN_DIR/plan_vs_run.rank<R>.json: its own "
        "measured bytes beside the planner's for its place in the grid",
    )
    step_sleep: float = doc(0.0, "testing: seconds to sleep after each optimizer step (crash tests)")
    stop_after_step: int = doc(0, "testing: behave as if preempted after this optimizer step (checkpoint, exit 0)")
    inject_disk_full_step: int = doc(0, "testing: the checkpoint of this step fails as on a full disk (ENOSPC)")
    checkpoint_sleep: float = doc(
        0.0,
        "testing: seconds to pause in the middle of writing each checkpoint, so a "
        "crash test can kill the process there",
    )


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


# The sections by name, read from Config's fields so the list is written once.
SECTIONS: dict[str, type[Any]] = get_type_hints(Config)


def compile_enabled(compile_setting: bool | str, device_type: str) -> bool:
    """train.compile resolved for a device: auto compiles on CUDA (where fusing the memory-bound chains pays)
    and not on CPU (where compiling costs more than a short run gains)."""
    return device_type == "cuda" if compile_setting == "auto" else bool(compile_setting)


def shown_value(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def resolved(value: int | None) -> int:
    """A key that `resolve` fills in (model.num_kv_heads, model.head_dim, train.seq_len) read from a resolved
    config: its declared type is the raw config's `int | None`, its value after `resolve` an int."""
    assert value is not None, "a derived key read before resolve()"
    return value


def padded_vocab_size(model: ModelConfig) -> int:
    """Rows of the embedding and output layer: model.vocab_size rounded up to a multiple of model.pad_vocab_to.
    The one place that computes it; the model, the planner and the export all call it."""
    return -(-model.vocab_size // model.pad_vocab_to) * model.pad_vocab_to
