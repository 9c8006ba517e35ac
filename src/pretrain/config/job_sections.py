"""The sections of the training job beside the model: `train:` (length, batch, precision, optimizer,
learning-rate schedule, loss), `parallel:` (its layout over the GPUs) and `data:` (the prepared tokens it reads).
The planner and the trainer read them alike, so they are one module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .key_doc import doc

PRECISIONS = ("fp32", "fp16-mixed", "bf16-mixed", "bf16", "fp8")
OPTIMIZERS = ("adamw", "adafactor", "sgd")
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("cosine", "linear", "inverse_sqrt", "wsd")


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
    stage_tokens: int | None = doc(
        None,
        "with --resume at another train.seq_len (a stage of context extension): the tokens this stage "
        "trains (e.g. 2M); the run then ends that many tokens after the checkpoint, in its train.tokens "
        "(or train.max_steps), with the schedule of that length (docs/train.md)",
    )
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
    half_residual: bool | None = doc(
        None,
        "*-mixed and fp8: the residual stream in the 16-bit compute dtype, as "
        "Megatron keeps it, instead of autocast's fp32 (the embedding's output cast); the "
        "plan halves its terms. null: on where it pays, blocks compiled on CUDA (inductor "
        "fuses the casts into the adds), off elsewhere (a CPU trains as before). FSDP's "
        "mixed precision and pure bf16 keep it 16-bit anyway; fp32 and bf16 refuse true",
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
        "expert-parallel degree (MoE): the routed experts are split over groups of this many ranks, "
        "tokens exchanged by all-to-all; it divides model.num_experts and the data x tensor ranks of a "
        "pipeline stage (expert_tensor 1: the group may take tensor ranks, Megatron's parallel folding) or "
        "the data-parallel degree (expert_tensor = tensor) (docs/moe.md)",
    )
    expert_tensor: int = doc(
        1,
        "expert tensor-parallel degree (MoE): 1 (each routed expert whole on its rank; under tensor "
        "parallelism the MoE layer runs on each tensor rank's part of the sequence) or parallel.tensor "
        "(each expert's width split like the dense MLP's; planned, not trained) (docs/moe.md)",
        trains=(1,),
    )
    expert_dispatch: str = doc(
        "all_to_all",
        "MoE with parallel.expert > 1: how tokens reach their experts' ranks, as the step time prices it "
        "(docs/moe.md: Dispatch). all_to_all: one NCCL all-to-all of every (token, expert) row (what "
        "`pretrain train`, torchtitan and Megatron's alltoall dispatcher run) | deepep / hybridep: a token "
        "sent once per node and once per rank, forwarded over NVLink inside the node (DeepEP, NVIDIA's "
        "HybridEP: Megatron's flex dispatcher)",
        ("all_to_all", "deepep", "hybridep"),
        trains=("all_to_all",),
    )
    expert_dispatch_overlap: bool = doc(
        False,
        "MoE with parallel.expert > 1: each micro-batch's token exchanges run behind another micro-batch's "
        "compute (Megatron's --overlap-moe-expert-parallel-comm, as DeepSeek-V3's DualPipe), planned only",
        trains=(False,),
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
    pipeline_split: str = doc(
        "even",
        "how the blocks split over pipeline stages, for the step time: even (as `pretrain train` splits "
        "them: the output layer on the last stage besides its share of blocks) | balanced (the input "
        "embedding and the output layer each counted as a block: Megatron's "
        "account_for_embedding/loss_in_pipeline_split, Llama 3's one block fewer on the first and last "
        "stages), planned only",
        ("even", "balanced"),
        trains=("even",),
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
    def expert_pool(self) -> int:
        """The ranks of one pipeline stage that an expert-parallel group is taken from. With whole experts
        (expert_tensor 1) the MoE layer is data-parallel over data x tensor ranks, each tensor rank routing its
        part of the sequence, so the group may span both (Megatron-Core's parallel folding, torchtitan's ETP
        1); with experts split over the tensor ranks (expert_tensor = tensor) it holds data ranks only."""
        return self.data_parallel * (self.tensor if self.expert_tensor == 1 else 1)

    @property
    def expert_data_parallel(self) -> int:
        """The ranks that hold the same experts (the expert-data-parallel group): expert_pool / expert."""
        return self.expert_pool // self.expert

    @property
    def fsdp(self) -> bool:
        """Sharded by FSDP2 (ZeRO 2/3 over more than one data-parallel rank); one rank keeps a plain model."""
        return self.zero_stage >= 2 and self.data_parallel > 1


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
