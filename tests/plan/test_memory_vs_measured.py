"""The planner's memory against what a real training step holds, tensor by tensor, on the CPU.

Model states (parameters, gradients, optimizer states) and autocast's weight copies must match exactly;
activations (every tensor autograd saves for backward, plus what recomputation holds) too, for every family,
precision, recomputation mode and attention kernel. One documented exception: on the CPU, LayerNorm keeps its
mean and rstd in bf16 for bf16 inputs where CUDA keeps fp32; the planner follows CUDA (0.3% here).
"""

import contextlib
import functools
import itertools

import pytest

from support import needs_compiler

torch = pytest.importorskip("torch")
F = torch.nn.functional

from pretrain.config import load_config  # noqa: E402
from pretrain.config.job_sections import RECOMPUTE  # noqa: E402
from pretrain.distributed.optim import build_optimizer  # noqa: E402
from pretrain.distributed.recompute import apply_activation_checkpointing  # noqa: E402
from pretrain.model import Documents, build_model  # noqa: E402
from pretrain.plan import make_plan  # noqa: E402
from pretrain.plan.activations import activation_bytes  # noqa: E402
from pretrain.plan.kernels import planned_document_kernel, planned_native_gqa  # noqa: E402
from pretrain.train.measure import measure_forward, model_state_bytes  # noqa: E402

SHAPES = {
    "llama-gqa": ["model.preset=debug"],
    "llama-mha-bias": ["model.preset=debug", "model.num_kv_heads=4", "model.qkv_bias=true"],
    "llama-tied": ["model.preset=debug", "model.tie_embeddings=true"],
    "gpt2": [
        "model.preset=debug",
        "model.family=gpt2",
        "model.num_kv_heads=4",
        "model.intermediate_size=256",
        "model.tie_embeddings=true",
    ],
}
# model.pad_vocab_to: 512 rows for 500 ids; their states, autocast copy and output matmul are counted.
PADDED = {
    "llama-padded": ["model.preset=debug", "model.vocab_size=500", "model.pad_vocab_to=64"],
    "gpt2-padded": SHAPES["gpt2"] + ["model.vocab_size=500", "model.pad_vocab_to=64"],
}


BASE = ["model.num_layers=3", "train.seq_len=32", "train.micro_batch_size=2", "hardware.gpu=cpu"]
EOS = 0  # the end-of-document id of the masked runs


def batch(vocab_size: int, masked: bool):
    """Two windows of 32 tokens and their targets; masked: <eos> cuts them into 3 and 2 documents."""
    x, y = torch.randint(0, vocab_size, (2, 32)), torch.randint(0, vocab_size, (2, 32))
    if masked:
        x[x == EOS] = 1
        x[0, [5, 20]] = x[1, 11] = EOS
    return x, y


def measure(overrides, optimizer="adamw", kernel=None):
    """kernel: train.document_masking's attention kernel (pretrain.model.documents), positions reset with it."""
    c = load_config(overrides=[*BASE, f"train.optimizer={optimizer}", *overrides])
    torch.manual_seed(0)
    model = build_model(
        c.model,
        attention=c.train.attention,
        loss=c.train.loss,
        loss_chunk_tokens=c.train.loss_chunk_tokens,
        documents=Documents(EOS, True, True, kernel) if kernel else None,
    )
    if c.train.precision == "bf16":
        model = model.to(torch.bfloat16)
    if c.train.half_residual:  # as the trainer sets it
        model.residual_dtype = torch.bfloat16
    apply_activation_checkpointing(model, c.train.activation_checkpointing)
    opt = build_optimizer(model, c.model, c.train)
    x, y = batch(c.model.vocab_size, kernel is not None)
    autocast = functools.partial(
        torch.autocast, "cpu", dtype=torch.bfloat16, cache_enabled=False, enabled=c.train.precision.endswith("-mixed")
    )
    loss, saved = measure_forward(model, x, y, autocast)
    loss.backward()
    opt.step()
    return make_plan(c), model_state_bytes(model, opt), saved


@pytest.mark.parametrize(
    "shape, precision, recompute, attention, loss",
    list(
        itertools.product(
            {**SHAPES, **PADDED},
            ["fp32", "bf16-mixed", "bf16"],
            ["none", "selective", "full"],
            ["sdpa", "eager"],
            ["chunked", "plain"],
        )
    ),
)
def test_activations_and_copies_exact(shape, precision, recompute, attention, loss):
    # train.loss_chunk_tokens=24 does not divide b*s = 64: three chunks, the last one short.
    p, states, saved = measure(
        {**SHAPES, **PADDED}[shape]
        + [
            f"train.precision={precision}",
            f"train.activation_checkpointing={recompute}",
            f"train.attention={attention}",
            f"train.loss={loss}",
            "train.loss_chunk_tokens=24",
        ]
    )
    assert p["model_states"]["working_copies"] == saved["working_copies"]
    planned = p["memory_bytes"]["activations"]
    if shape.startswith("gpt2") and precision == "bf16":
        assert saved["activations"] == pytest.approx(planned, rel=0.01)
    else:
        assert saved["activations"] == planned


@pytest.mark.parametrize(
    "shape, recompute, loss",
    list(itertools.product(["llama-gqa", "gpt2"], ["none", "selective", "full"], ["chunked", "plain"])),
)
def test_half_residual_activations_exact(shape, recompute, loss):
    # train.half_residual: the residual stream in bf16 under bf16-mixed; the norms still keep fp32 (RMSNorm casts
    # its input itself, LayerNorm is autocast to fp32), the block inputs, the loss's input and gradient halve.
    # torch 2.6's F.rms_norm promotes a bf16 input with an fp32 weight to an fp32 output and keeps other tensors
    # than 2.13's, which returns bf16 as the planner counts: there the LLaMA cases are not exact.
    if (
        shape.startswith("llama")
        and F.rms_norm(torch.ones(1, 2, dtype=torch.bfloat16), (2,), torch.ones(2)).dtype != torch.bfloat16
    ):
        pytest.skip(f"F.rms_norm of torch {torch.__version__} promotes mixed dtypes to fp32")
    p, states, saved = measure(
        SHAPES[shape]
        + [
            "train.precision=bf16-mixed",
            "train.half_residual=true",
            f"train.activation_checkpointing={recompute}",
            f"train.loss={loss}",
            "train.loss_chunk_tokens=24",
        ]
    )
    assert saved["activations"] == p["memory_bytes"]["activations"]


@pytest.mark.parametrize(
    "precision, recompute, attention",
    list(itertools.product(["fp32", "bf16-mixed", "bf16"], ["none", "selective"], ["sdpa", "eager"])),
)
def test_qk_norm_activations_exact(precision, recompute, attention):
    # Qwen3's QK-norm keeps a norm's fp32 tensors per head of q and k; in fp32 its input is a view of the qkv
    # output, which eager attention otherwise lets go.
    p, _, saved = measure(
        [
            "model.preset=debug",
            "model.qk_norm=true",
            f"train.precision={precision}",
            f"train.activation_checkpointing={recompute}",
            f"train.attention={attention}",
        ]
    )
    assert saved["activations"] == p["memory_bytes"]["activations"]


@pytest.mark.parametrize(
    "shape, precision, recompute, attention, kernel",
    [
        (*case, *kernel)
        for case in itertools.product(["llama-gqa", "gpt2"], ["fp32", "bf16-mixed"], ["none", "selective", "full"])
        for kernel in [("eager", "mask"), ("sdpa", "loop"), ("sdpa", "mask")]
    ],
)
def test_masked_activations_exact(shape, precision, recompute, attention, kernel):
    # train.document_masking, positions reset with it: eager attention's masked_fill keeps the inverted
    # (b, 1, s, s) mask per block; SDPA under the boolean mask (the compiled CPU kernel, run eagerly here: its
    # compiled graph keeps the same) an additive mask in the compute dtype per block; the CPU's loop of SDPA
    # calls each document's output; the rotary tables (GPT-2's position ids) are per token, and recomputation
    # holds the mask and the tables as the blocks' inputs (selective: the loop's per-document outputs kept, its
    # concatenation remade). The plan's activations are the trainer's kernel's: the mask under eager
    # attention, the loop under SDPA on the CPU.
    overrides = [
        *SHAPES[shape],
        f"train.precision={precision}",
        f"train.activation_checkpointing={recompute}",
        f"train.attention={attention}",
        "train.document_masking=true",
    ]
    p, _, saved = measure(overrides, kernel=kernel)
    c = load_config(overrides=[*BASE, *overrides])
    planned = activation_bytes(c.model, c.train, c.parallel, native_gqa=planned_native_gqa(c), documents=kernel)[
        "total"
    ]
    assert saved["activations"] == planned
    if (attention, kernel) != ("sdpa", "mask"):
        assert p["memory_bytes"]["activations"] == planned


@pytest.mark.parametrize(
    "shape, precision, optimizer",
    list(itertools.product({**SHAPES, **PADDED}, ["fp32", "bf16-mixed", "bf16"], ["adamw", "adafactor", "sgd"])),
)
def test_model_states_exact(shape, precision, optimizer):
    p, states, _ = measure({**SHAPES, **PADDED}[shape] + [f"train.precision={precision}"], optimizer=optimizer)
    assert {k: p["model_states"][k] for k in states} == states


def _allocator_peak(fn) -> int:
    """Peak bytes the CPU allocator holds while fn runs, above what was held before: every allocation and free
    that torch.profiler records, replayed in time order."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
        fn()
    sizes = []

    def walk(node):
        if node.tag == _EventType.Allocation:
            sizes.append((node.start_time_ns, node.extra_fields.alloc_size))
        for child in node.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    live = peak = 0
    for _, size in sorted(sizes):
        live += size
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(
    "shape, precision, recompute, accum, loss",
    list(
        itertools.product(
            {**SHAPES, **PADDED},
            ["fp32", "bf16-mixed", "bf16"],
            ["none", "selective", "full"],
            [1, 2],
            ["plain", "chunked"],
        )
    ),
)
def test_peak_over_phases_against_the_allocator(shape, precision, recompute, accum, loss):
    # memory_bytes.total, the peak over the phases of a step, against the allocator's peak over a whole step
    # (optimizer states made by a first step, as in every later one), for both losses and padded vocabularies.
    # Without full recomputation the peak is the plain loss's backward (12 x b*s*V of fp32 log-softmax and
    # gradients beside all activations, and the CPU generator state each checkpoint keeps) or the end of the
    # chunked loss's forward (its kept gradients, a chunk's fp32 logits and logsumexp's temporary beside all
    # activations), and it is exact to 0.1% (fp32 LLaMA: the 2 KB rotary table is shared). With recomputation
    # the peak is inside a block's backward, where freed activations and new gradients overlap in ways the
    # plan models only roughly (a tied output layer's gradient also waits in autograd's buffer for the
    # embedding's): full from 2.5% below to 6.4% above the plan on these tiny shapes, selective (operator-level:
    # one block's recomputed tensors beside the kept matmul outputs) from 2.6% below to 3.6% above.
    c = _peak_config(shape, precision, recompute, accum, loss)
    planned = make_plan(c)["memory_bytes"]["total"]
    assert _step_peak(c) == pytest.approx(planned, rel=0.07 if recompute != "none" else 0.001)


@pytest.mark.parametrize("shape, recompute", list(itertools.product(["llama-gqa", "gpt2"], ["none", "full"])))
def test_the_weight_cast_cache_in_the_peak(shape, recompute):
    # train.cache_weight_casts: one autocast context with its cast cache over the step's micro-batches, as the
    # trainer opens it; every block's copy stays to the end of the last backward, full recomputation included.
    c = _peak_config(shape, "bf16-mixed", recompute, 2, "chunked", cache=True)
    planned = make_plan(c)["memory_bytes"]["total"]
    assert _step_peak(c) == pytest.approx(planned, rel=0.07 if recompute == "full" else 0.001)


def _peak_config(shape, precision, recompute, accum, loss, cache=False):
    return load_config(
        overrides=[
            "model.num_layers=3",
            "train.seq_len=32",
            "train.micro_batch_size=2",
            "hardware.gpu=cpu",
            f"train.grad_accum_steps={accum}",
            f"train.loss={loss}",
            *{**SHAPES, **PADDED}[shape],
            f"train.cache_weight_casts={str(cache).lower()}",
            f"train.precision={precision}",
            f"train.activation_checkpointing={recompute}",
        ]
    )


@pytest.mark.parametrize(
    "shape, precision, recompute, loss, attention, kernel",
    [
        ("llama-gqa", "bf16-mixed", "none", "chunked", "sdpa", "loop"),
        ("llama-gqa", "fp32", "none", "plain", "eager", "mask"),
        ("gpt2", "fp32", "selective", "chunked", "eager", "mask"),
        ("gpt2", "bf16-mixed", "none", "plain", "sdpa", "loop"),
    ],
)
def test_masked_peak_against_the_allocator(shape, precision, recompute, loss, attention, kernel):
    # train.document_masking's step, as above to 0.1%: the boolean mask, document ids and per-token positions
    # are made once per micro-batch and gone when its blocks have run (the loss's peak comes after); what the
    # blocks keep of them is in the activations (test_masked_activations_exact).
    c = load_config(
        overrides=[
            *BASE,
            f"train.loss={loss}",
            *SHAPES[shape],
            f"train.precision={precision}",
            f"train.activation_checkpointing={recompute}",
            f"train.attention={attention}",
            "train.document_masking=true",
        ]
    )
    assert _step_peak(c, kernel) == pytest.approx(make_plan(c)["memory_bytes"]["total"], rel=0.001)


def _step_peak(c, kernel=None) -> int:
    """Model states + the allocator's peak over a whole step (optimizer states made by a first step, as in
    every later one); kernel: train.document_masking's (pretrain.model.documents), positions reset with it."""
    t = c.train
    torch.manual_seed(0)
    model = build_model(
        c.model,
        attention=t.attention,
        loss=t.loss,
        loss_chunk_tokens=t.loss_chunk_tokens,
        documents=Documents(EOS, True, True, kernel) if kernel else None,
    )
    if t.precision == "bf16":
        model = model.to(torch.bfloat16)
    apply_activation_checkpointing(model, t.activation_checkpointing)
    opt = build_optimizer(model, c.model, t)
    cache = t.cache_weight_casts
    autocast = functools.partial(
        torch.autocast, "cpu", dtype=torch.bfloat16, cache_enabled=cache, enabled=t.precision.endswith("-mixed")
    )  # as the trainer casts

    def step():
        with autocast() if cache else contextlib.nullcontext():  # the trainer's step_context
            for _ in range(t.grad_accum_steps):
                x, y = batch(c.model.vocab_size, kernel is not None)
                with autocast():
                    loss = model(x, y)
                (loss / t.grad_accum_steps).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    return sum(model_state_bytes(model, opt).values()) + _allocator_peak(step)


@needs_compiler
@pytest.mark.slow
@pytest.mark.parametrize(
    "shape, precision, recompute, masked",
    [
        ("llama-gqa", "bf16-mixed", "selective", False),
        pytest.param("gpt2", "bf16-mixed", "none", False, marks=pytest.mark.kernels),
        ("llama-gqa", "bf16-mixed", "selective", True),
    ],
)
def test_compiled_step_against_the_plan(shape, precision, recompute, masked):
    # Issue 31, item 3: a step with the trainer's torch.compile (parallelize(): each block, and the output layer
    # with the loss, compiled) on the CPU. What the compiled graphs save is exactly the plan's compiled
    # activations (pretrain.plan.activations: the partitioner's per-layer tensors, the working copies). The
    # allocator's peak over the step is memory_bytes.compiled within what the compiled backward's temporaries
    # move it from machine to machine (issue #48): its reductions' scratch buffers are inductor's choice for
    # the CPU and the threads. Measured (measured / planned, this container's Zen 4 under ATEN_CPU_CAPABILITY
    # avx512, avx2 and default, each with 1 and 2 OpenMP threads; another x86 machine with 1): GPT-2 without
    # recomputation 0.991 with 1 thread, 1.016 with 2, 0.981 on the other machine (the eager peak: 0.984); the
    # LLaMA with selective recomputation 0.976-0.978 with 1 thread, 0.992 with 2 (its compiled backward
    # remakes the recomputed tensors as it needs them where the plan holds one block's at once, as eager mode
    # does). The tolerances are that spread and half as much again: 2.5 % and 3.5 %. The phases are eager
    # mode's; other settings, measured the same way, land from 0.957 (the plain loss, whose compiled graph keeps
    # less than eager's log-softmax) to 1.030 (fp32 LLaMA without recomputation); full recomputation 0.995.
    # Masked (train.document_masking), SDPA runs under the boolean mask, and each compiled block keeps it as an
    # additive bf16 mask, as eager SDPA does.
    from pretrain.distributed.parallelize import parallelize
    from pretrain.distributed.runtime import init_runtime
    from pretrain.train.measure import SavedTensorMeter

    torch._dynamo.reset()
    c = load_config(
        overrides=[
            "model.num_layers=3",
            "train.seq_len=32",
            "train.micro_batch_size=2",
            "hardware.gpu=cpu",
            "train.grad_accum_steps=1",
            "train.compile=true",
            "train.loss_chunk_tokens=24",
            *SHAPES[shape],
            f"train.precision={precision}",
            f"train.activation_checkpointing={recompute}",
            f"train.document_masking={masked}",
        ]
    )
    torch.manual_seed(0)
    kernel = planned_document_kernel(c, compiled=True)  # the boolean mask, as pretrain.model.documents picks it
    model = build_model(
        c.model,
        loss=c.train.loss,
        loss_chunk_tokens=c.train.loss_chunk_tokens,
        documents=Documents(EOS, True, True, kernel) if masked else None,
    )
    engine = parallelize(model, c, init_runtime("cpu"))
    autocast = functools.partial(
        torch.autocast, "cpu", dtype=torch.bfloat16, cache_enabled=False, enabled=precision.endswith("-mixed")
    )
    meter = SavedTensorMeter(engine.module)

    def step(count=False):
        x, y = batch(c.model.vocab_size, masked)
        with meter(checkpoints=False) if count else contextlib.nullcontext(), autocast():
            loss = engine.module(x, y)
        saved = meter.split() if count else None  # before the step changes the weights its casts are found by
        loss.backward()
        engine.optimizer.step()
        engine.optimizer.zero_grad(set_to_none=True)
        return saved

    saved = step(count=True)  # compiles, and counts what the compiled graphs save
    meter.storages.clear()
    p = make_plan(c)
    act = activation_bytes(c.model, c.train, c.parallel, compiled=True, documents=kernel)
    # The recomputed block's tensors and weight casts exist only inside the compiled backward, out of the meter's
    # sight: what forward keeps is the rest.
    block_copies = (
        2 * sum(w.numel() for w in engine.module.blocks[0].parameters() if w.dim() == 2)
        if recompute != "none" and precision.endswith("-mixed")
        else 0
    )
    assert saved == {
        "activations": act["total"] - act["recompute_working"],
        "working_copies": p["model_states"]["working_copies"] - block_copies,
    }
    measured = sum(model_state_bytes(engine.module, engine.optimizer).values()) + _allocator_peak(step)
    assert measured == pytest.approx(p["memory_bytes"]["compiled"], rel=0.025 if recompute == "none" else 0.035)


MOE = {
    # moe-debug: a dense first block, 8 softmax experts top-2 (norm_topk_prob), no shared expert
    "moe-dense-first": ["model.preset=moe-debug"],
    # every block MoE, sigmoid scores without their norm, two shared experts (one SwiGLU twice as wide)
    "moe-shared-sigmoid": [
        "model.preset=moe-debug",
        "model.first_dense_layers=0",
        "model.router=sigmoid",
        "model.norm_topk_prob=false",
        "model.num_shared_experts=2",
    ],
}


@pytest.mark.parametrize(
    "shape, precision, recompute", list(itertools.product(MOE, ["fp32", "bf16-mixed", "bf16"], RECOMPUTE))
)
def test_moe_activations_exact(shape, precision, recompute):
    # An MoE block keeps its router's fp32 logits and scores, the choice's ids, each routed pair's order, token
    # and weight, the experts' inputs, SwiGLU tensors and outputs (pretrain.plan.moe_activations); its weighted
    # sum keeps only the token ids (index_put_: index_add_ kept a copy of every routed output for its shape).
    # Selective keeps the top-k choice and remakes the routed part; full keeps the block input. Each kind of
    # block counted as its own (the dense first block holds less without recomputation, more recomputed than
    # an MoE one: recomputation holds the larger). The working copies are every block's matmul weights, one
    # block's with recomputation: the planner's heaviest (the MoE one) where the meter runs the dense block
    # again, its activations being the larger.
    p, _, saved = measure(MOE[shape] + [f"train.precision={precision}", f"train.activation_checkpointing={recompute}"])
    assert saved["activations"] == p["memory_bytes"]["activations"]
    copies = p["model_states"]["working_copies"]
    if shape == "moe-dense-first" and recompute == "full":
        assert saved["working_copies"] <= copies
    else:
        assert saved["working_copies"] == copies
