"""Memory per GPU under tensor and pipeline parallelism, the fit verdict, and the explain text beside them.

LLaMA-7B numbers used below: one block 4H^2 + 3HH' + 2H = 202,383,360 parameters (H = 4,096, H' = 11,008), of
which 2H = 8,192 are its two RMSNorm weights; embedding and output layer 32,000 x 4,096 = 131,072,000 each.
"""

import re
from pathlib import Path

import pytest

from pretrain.config import load_config
from pretrain.plan import make_plan, plan_with_explain
from pretrain.plan.fit_fixes import _tensor_options
from pretrain.plan.table import render

BLOCK, NORMS, VH, H = 202_383_360, 8_192, 32_000 * 4_096, 4_096


def _explain(config, name) -> tuple[str, str]:
    _, ex = plan_with_explain(config, advice=False)
    return next((value, formula) for s, n, value, formula in ex.lines if (s, n) == ("memory", name))


def test_zero_paper_accounting_divides_by_model_parallelism():
    # ZeRO paper (Rajbhandari et al. 2020), section 5 and table 1: with model parallelism N_m each GPU holds
    # Psi / N_m parameters, and stage 3 shards their (2 + 4 + 12) bytes over N_d: 18 x 6,738,415,616 / 8 / 8
    # bytes = 1.77 GiB (it printed 14.12 GiB, the data-parallel-only figure).
    config = load_config(
        overrides=["model.preset=llama-7b", "parallel.gpus=64", "parallel.tensor=8", "parallel.zero_stage=3"]
    )
    value, formula = _explain(config, "model states, ZeRO paper accounting")
    assert value == f"{18 * 6_738_415_616 / 8 / 8 / 1024**3:.2f} GiB" == "1.77 GiB"
    assert "/ model parallel 8" in formula


def test_fsdp_reduce_scatter_is_one_block_of_one_tensor_rank():
    # The block's matmuls are split 8 ways, its norms replicated: 4 bytes x ((BLOCK - NORMS) / 8 + NORMS),
    # beside the loss's working set at the end of forward. Chunked (the default): its input h (bf16 under FSDP,
    # 2 x 2,048 x 4,096) and one chunk's fp32 logits with logsumexp's temporary (8 x 2,048 x 32,000 / 8).
    def plan_of(*extra):
        return make_plan(
            load_config(
                overrides=[
                    "model.preset=llama-7b",
                    "parallel.gpus=64",
                    "parallel.tensor=8",
                    "parallel.zero_stage=3",
                    *extra,
                ]
            )
        )

    p = plan_of()
    reduce_scatter = 4 * ((BLOCK - NORMS) // 8 + NORMS)
    assert reduce_scatter == 101_220_352  # was 809,533,440: a whole block
    nccl = 3 * 32 * 10 * 2**20  # NCCL's buffers: the job's, the data- and the tensor-parallel communicators
    assert p["memory_bytes"]["buffers"] == 2 * 2048 * H + 8 * 2048 * 32_000 // 8 + reduce_scatter + nccl
    # Plain: the full-vocabulary logits in bf16 and in fp32 (6 x 2,048 x 32,000 / 8); its backward's two fp32
    # gradients of the logits (8 x 2,048 x 32,000 / 8) are the loss_backward phase's.
    assert plan_of("train.loss=plain")["memory_bytes"]["buffers"] == 6 * 2048 * 32_000 // 8 + reduce_scatter + nccl


def test_zero3_with_a_pipeline_gathers_whole_blocks_of_its_stage():
    # 32 stages of one block each: a stage gathers its whole bf16 block (0.377 GiB) and its end of the model,
    # the heavier being the last stage's final norm and output layer; it printed 0.061 GiB (a 1/32 share).
    one = make_plan(
        load_config(
            overrides=["model.preset=llama-7b", "parallel.gpus=256", "parallel.pipeline=32", "parallel.zero_stage=3"]
        )
    )
    assert one["model_states"]["working_copies"] == 2 * (BLOCK + H + VH)
    # 8 stages of 4 blocks: the block being computed and the prefetched next one.
    four = make_plan(
        load_config(
            overrides=["model.preset=llama-7b", "parallel.gpus=64", "parallel.pipeline=8", "parallel.zero_stage=3"]
        )
    )
    assert four["model_states"]["working_copies"] == 2 * (2 * BLOCK + H + VH)
    # Without a pipeline: two blocks and the whole root (embedding, final norm, output), as before.
    flat = make_plan(load_config(overrides=["model.preset=llama-7b", "parallel.gpus=64", "parallel.zero_stage=3"]))
    assert flat["model_states"]["working_copies"] == 2 * (2 * BLOCK + VH + H + VH)


def test_fp32_loss_buffer_text_is_the_value():
    # GPT-2 (V = 50,257) at 1,024 tokens, fp32, tensor 2: the loss's working set at the end of forward.
    # Chunked: its input h, 4 x b*s*h = 3,145,728, and the one chunk of c = 1,024 tokens: its fp32 logits and
    # logsumexp's temporary of their size, 8 x c*V / t = 205,852,672. Plain: the fp32 logits of all b*s tokens,
    # 4 x b*s*V / t (its backward adds the two fp32 gradients of the logits, 8 x b*s*V / t).
    def buffers(*extra):
        return _explain(
            load_config(
                overrides=["model.preset=gpt2", "train.precision=fp32", "parallel.gpus=8", "parallel.tensor=2", *extra]
            ),
            "buffers",
        )[1]

    assert buffers().startswith(
        "chunked loss working set at the end of forward 208,998,400: loss input h "
        "(4 x b*s*h) + loss chunk of c=1,024 tokens: logits, logsumexp (8 x c*V), "
        "V terms / tensor 2"
    )
    assert buffers("train.loss=plain").startswith(
        "plain loss working set at the end of forward 102,926,336: loss logits (4 x b*s*V), V terms / tensor 2"
    )


def test_a_card_too_small_for_anything_does_not_fit():
    p = make_plan(load_config(overrides=["model.preset=debug", "hardware.memory_gb=1e-10"]))  # 0.1 byte -> 0
    assert p["device_memory_bytes"] == 0 and p["fits"] is False and p["max_micro_batch_size"] == 0


def test_max_micro_batch_is_not_capped():
    # One-token sequences of the debug model on an H200: ~11M sequences fit, beyond the old 2^21 - 1 cap.
    base = ["model.preset=debug", "train.seq_len=1", "hardware.gpu=h200"]
    b = make_plan(load_config(overrides=base))["max_micro_batch_size"]
    assert b > 2**21
    assert make_plan(load_config(overrides=base + [f"train.micro_batch_size={b}"]))["fits"] is True
    assert make_plan(load_config(overrides=base + [f"train.micro_batch_size={b + 1}"]))["fits"] is False


def test_advice_offers_only_tensor_sizes_that_divide_the_kv_heads():
    # TinyLlama: 32 query heads, 4 key/value heads: tensor 8 is refused by validation, so never advised.
    config = load_config(overrides=["model.preset=tinyllama-1.1b"])
    options, _ = _tensor_options(config, {})
    assert {o["parallel.tensor"] for o in options} == {2, 4}


def test_autocast_copies_per_pipeline_stage_and_tensor_rank():
    # bf16 copies of the matmul weights autocast keeps for backward, on the last stage (it holds the output
    # layer): with full recomputation only the block being recomputed, else the stage's ceil(32 / 4) = 8 blocks.
    def copies(*extra):
        config = load_config(
            overrides=["model.preset=llama-7b", "parallel.gpus=16", "parallel.pipeline=4", "parallel.tensor=2", *extra]
        )
        return make_plan(config)["model_states"]["working_copies"]

    # The chunked loss (the default) casts the output weight per call and keeps no copy of it; plain keeps one.
    assert copies("train.activation_checkpointing=full") == 2 * (BLOCK - NORMS) // 2
    assert copies("train.activation_checkpointing=none") == 2 * 8 * (BLOCK - NORMS) // 2
    assert copies("train.activation_checkpointing=full", "train.loss=plain") == 2 * ((BLOCK - NORMS) + VH) // 2
    assert copies("train.activation_checkpointing=none", "train.loss=plain") == 2 * (8 * (BLOCK - NORMS) + VH) // 2


def _memory(*overrides) -> dict:
    return make_plan(load_config(overrides=list(overrides)))["memory_bytes"]


def test_one_micro_batch_holds_no_gradients_beside_the_activations():
    # Issue 13: the trainer frees the gradients after each optimizer step (zero_grad(set_to_none=True)), so with
    # one micro-batch they do not exist yet at the end of forward; with two, the first micro-batch's are there.
    base = [
        "model.preset=llama3.2-1b",
        "hardware.gpu=h100-sxm",
        "train.micro_batch_size=4",
        "train.seq_len=2048",
        "train.loss=plain",
    ]
    one = _memory(*base, "train.grad_accum_steps=1")
    two = _memory(*base, "train.grad_accum_steps=2")
    assert one["peak_phase"] == two["peak_phase"] == "loss_backward"
    assert {k: two["phases"][k] - one["phases"][k] for k in ("forward", "loss_backward", "optimizer_step")} == {
        "forward": one["gradients"],
        "loss_backward": one["gradients"],
        "optimizer_step": 0,
    }
    # End of forward on one GPU: parameters (here the fp32 master weights, under optimizer), autocast's bf16
    # copies, all activations, the loss's bf16 and fp32 logits (the only buffer) and the CUDA context.
    assert one["phases"]["forward"] == (
        one["weights"] + one["optimizer"] + one["activations"] + one["buffers"] + one["cuda_context"]
    )
    # The loss's backward: 8 x b*s*V of fp32 gradients beside the kept log-softmax, where the forward had the
    # 6 x b*s*V logits: 2 x 4 x 2,048 x 128,256 more.
    assert one["phases"]["loss_backward"] - one["phases"]["forward"] == 2 * 4 * 2048 * 128_256
    # The plain sum counted the gradients beside the activations: 2.3 GiB more than the peak.
    plain_sum = sum(one[k] for k in ("weights", "gradients", "optimizer", "activations", "buffers", "cuda_context"))
    assert plain_sum - one["total"] == one["gradients"] - 2 * 4 * 2048 * 128_256


def test_fsdp_gradient_sync_per_step_holds_unsharded_fp32_gradients():
    # Issue 13, item 1: FSDP2 without gradient sync between micro-batches keeps every gradient unsharded in fp32
    # (its reduce dtype): 4 x 6,738,415,616 bytes = 26.95 GB per GPU beside the activations, where the default
    # (reduce-scatter every micro-batch) keeps the 64-way sharded gradients.
    config = Path(__file__).resolve().parents[2] / "configs/llama-7b-64xh100.yaml"
    micro = make_plan(load_config(config))["memory_bytes"]
    step = make_plan(load_config(config, ["parallel.grad_sync=step"]))["memory_bytes"]
    unsharded = 4 * 6_738_415_616
    assert step["phases"]["forward"] - micro["phases"]["forward"] == unsharded - micro["gradients"]
    assert step["total"] - micro["total"] == unsharded - micro["gradients"]
    # They are there in backward too, beside every block's activations when the first block's backward runs.
    assert step["phases"]["backward"] - micro["phases"]["backward"] == unsharded - micro["gradients"]
    # With one micro-batch there is nothing to hold between micro-batches.
    one = ["train.grad_accum_steps=1"]
    assert (
        make_plan(load_config(config, one + ["parallel.grad_sync=step"]))["memory_bytes"]
        == make_plan(load_config(config, one))["memory_bytes"]
    )


def test_gradients_make_backward_the_peak_of_a_short_sequence():
    # fp32 LLaMA-7B on one GPU with 128-token sequences: the 25.1 GiB of gradients outweigh the activations.
    mem = _memory("model.preset=llama-7b", "train.precision=fp32", "train.seq_len=128", "train.grad_accum_steps=1")
    assert mem["peak_phase"] == "backward"
    assert mem["phases"]["backward"] - mem["phases"]["optimizer_step"] < mem["activations"]


def test_every_phase_is_explained_with_its_numbers():
    config = load_config(overrides=["model.preset=llama3.2-1b", "parallel.gpus=8", "hardware.gpu=h100-sxm"])
    p, ex = plan_with_explain(config, advice=False)
    lines = {n: (value, formula) for s, n, value, formula in ex.lines if s == "memory"}
    for phase, nbytes in p["memory_bytes"]["phases"].items():
        value, formula = lines[f"phase {phase}"]
        assert value == f"{nbytes / 1024**3:.2f} GiB"
        assert sum(int(n.replace(",", "")) for n in re.findall(r" ([\d,]+)(?: \+|$)", formula)) == nbytes
    assert lines["total"][1].startswith(f"the largest phase: {p['memory_bytes']['peak_phase']} ")


def test_the_compiled_peak_is_planned_where_compile_is_on():
    # Issue 31, item 3: a number wherever train.compile turns the compiler on, none where it resolves to eager.
    gpu = _memory("model.preset=gpt2", "hardware.gpu=h100-sxm")  # auto: on for CUDA
    assert isinstance(gpu["compiled"], int) and gpu["compiled_basis"].startswith("eager phases with the blocks'")
    assert _memory("model.preset=gpt2", "hardware.gpu=h100-sxm", "train.compile=false")["compiled"] is None
    assert _memory("model.preset=gpt2", "hardware.gpu=cpu")["compiled"] is None  # auto: off for a CPU
    assert isinstance(_memory("model.preset=gpt2", "hardware.gpu=cpu", "train.compile=true")["compiled"], int)
    config = load_config(overrides=["model.preset=gpt2", "hardware.gpu=h100-sxm"])
    row = f"compiled       {gpu['compiled'] / 2**30:>9.2f}   peak with train.compile"
    assert row in render(config, make_plan(config))


def test_compiled_blocks_keep_less_than_eager_ones():
    # Llama-3.2-1B at seq 2048, bf16-mixed on one GPU: per layer, what inductor's partitioner saves against
    # what eager ops save (pretrain.plan.activations): 0.70x without recomputation, and with recomputation the
    # same tensors (selective: what the policy tags, which the partitioner honours; full: the block input).
    # The compiled peak is the eager one's phases with those.
    from pretrain.plan.activations import activation_bytes

    for recompute, ratio in [("none", 0.698), ("selective", 1.0), ("full", 1.0)]:
        c = load_config(
            overrides=[
                "model.preset=llama3.2-1b",
                "train.seq_len=2048",
                "hardware.gpu=h100-sxm",
                f"train.activation_checkpointing={recompute}",
            ]
        )
        eager, compiled = (
            activation_bytes(c.model, c.train, c.parallel, compiled=x)["per_layer"] for x in (False, True)
        )
        assert compiled / eager == pytest.approx(ratio, abs=0.001)
        mem = make_plan(c)["memory_bytes"]
        assert mem["compiled"] < mem["total"] if recompute == "none" else mem["compiled"] <= mem["total"]


def test_nccl_buffers_only_between_gpus():
    # Issue 31, item 12: 32 ring channels x 10 MiB (NCCL's LL + LL128 + Simple FIFOs of one connection) per
    # communicator, in every phase; none on one GPU or on CPUs (gloo), whose plans are unchanged.
    channels = 32 * 10 * 2**20
    for layout, communicators in [
        ([], 0),
        (["parallel.gpus=8"], 1),  # the job's: DDP's and the loss's
        (["parallel.gpus=8", "parallel.zero_stage=3"], 2),  # + the mesh's data group
        (["parallel.gpus=8", "parallel.tensor=2"], 3),
    ]:  # the job's, data 4, tensor 2
        # GPT-2: its LayerNorms keep the same tensors on both devices (RMSNorm's do not: fused on CUDA)
        # and the residual stream in fp32 on both (a compiled GPU run's default is bf16: train.half_residual)
        gpu = _memory("model.preset=gpt2", "hardware.gpu=h100-sxm", "train.half_residual=false", *layout)
        cpu = _memory("model.preset=gpt2", "hardware.gpu=cpu", *layout)
        assert gpu["buffers"] - cpu["buffers"] == communicators * channels, layout
        for phase, nbytes in gpu["phases"].items():  # + the CUDA context, and the CPU's checkpoint RNG states
            assert nbytes - cpu["phases"][phase] == communicators * channels + gpu["cuda_context"], (layout, phase)


def test_adafactor_step_makes_a_second_moment_estimate_per_parameter():
    # torch.optim.Adafactor's foreach path (the default on CUDA) holds ~ sizeof(params) more at its peak.
    base = ["model.preset=llama-7b", "hardware.gpu=h100-sxm", "train.precision=bf16", "train.grad_accum_steps=1"]
    ada, sgd = _memory(*base, "train.optimizer=adafactor"), _memory(*base, "train.optimizer=sgd", "train.momentum=0")
    n = 6_738_415_616
    assert sgd["optimizer"] == 0  # SGD without momentum keeps no state and updates in place
    assert ada["phases"]["optimizer_step"] - ada["optimizer"] - sgd["phases"]["optimizer_step"] == 2 * n


def test_ddp_buckets_are_the_gradients_in_every_phase():
    # Issue 13, item 6: DDP with gradient_as_bucket_view (distributed/parallelize.py) makes the gradients views
    # into its buckets, allocated when DDP wraps the model: they are in every phase, even with one
    # micro-batch, and never a second time (the default DDP kept the buckets beside the gradients).
    base = ["model.preset=llama3.2-1b", "hardware.gpu=h100-sxm", "train.grad_accum_steps=1"]
    one = _memory(*base)
    ddp = _memory(*base, "parallel.gpus=8")
    g, nccl = one["gradients"], 32 * 10 * 2**20  # and one NCCL communicator's buffers (the job's)
    assert ddp["gradients"] == g and ddp["buffers"] == one["buffers"] + nccl  # the loss's working set, NCCL's
    assert ddp["phases"]["forward"] - one["phases"]["forward"] == g + nccl
    assert ddp["phases"]["optimizer_step"] == one["phases"]["optimizer_step"] + nccl
    accumulating = _memory(*base, "parallel.gpus=8", "train.grad_accum_steps=4")
    assert accumulating["phases"]["forward"] == ddp["phases"]["forward"]


def test_the_chunked_loss_at_the_end_of_forward_and_in_its_backward():
    # Llama-3.2-1B, bf16 autocast, 4 x 2,048 tokens, chunks of 4,096: at the end of forward the loss holds its
    # fp32 input h, one chunk's fp32 logits with logsumexp's temporary, the bf16 cast of the fp32 output weight
    # and of one chunk of h; in its backward only the scaled dL/dh (fp32) and dL/dW (fp32, the weight's dtype).
    # Its kept dL/dh and dL/dW (bf16) are activations, in both phases; the plain loss keeps 4 x b*s*V instead.
    # The residual stream in fp32 (a compiled GPU run's default is bf16: train.half_residual).
    base = [
        "model.preset=llama3.2-1b",
        "hardware.gpu=h100-sxm",
        "train.half_residual=false",
        "train.micro_batch_size=4",
        "train.seq_len=2048",
        "train.grad_accum_steps=1",
    ]
    chunked, plain = _memory(*base), _memory(*base, "train.loss=plain")
    bs, c, h, V = 4 * 2048, 4096, 2048, 128_256
    forward = 4 * bs * h + 8 * c * V + 2 * V * h + 2 * c * h
    assert chunked["buffers"] == forward
    assert chunked["phases"]["loss_backward"] - chunked["phases"]["forward"] == 4 * bs * h + 4 * V * h - forward
    # Plain: autocast's bf16 copy of the output weight and the output matmul's bf16 input, the 4 x b*s*V
    # log-softmax and the target ids, where chunked keeps dL/dh and dL/dW in bf16.
    kept = dict(chunked=2 * bs * h + 2 * V * h, plain=8 * bs + 2 * bs * h + 4 * bs * V + 4)
    assert plain["activations"] - chunked["activations"] == kept["plain"] - kept["chunked"]
    assert plain["weights"] - chunked["weights"] == 2 * V * h
    assert chunked["total"] < plain["total"] - 4 * bs * V


def test_selective_recomputation_says_what_it_keeps_as_torchtitans_op_policy():
    # Ours is torchtitan's selective_ac_option 'op' (pretrain.distributed.recompute): it saves SDPA's and every
    # other matmul's outputs and recomputes the rest, the output projection's matmul included; --explain says
    # what it keeps.
    selective = load_config(overrides=["model.preset=llama3-8b", "train.activation_checkpointing=selective"])
    value, formula = _explain(selective, "selective recomputation")
    assert value == "operator-level" and "every other matmul" in formula and "output projection" in formula
    _, ex = plan_with_explain(load_config(overrides=["model.preset=llama3-8b"]), advice=False)
    assert not [line for line in ex.lines if line[1] == "selective recomputation"]


@pytest.mark.parametrize("precision, kept", [("bf16-mixed", 4), ("bf16", 2)])
def test_rms_norm_terms_are_what_the_device_kernel_keeps(precision, kept):
    """On CUDA F.rms_norm runs its fused kernel (torch >= 2.8), which keeps its input (fp32 under autocast,
    which casts a norm's input up; pure bf16's 16-bit input) and 1/rms, not the fp32 normalised x that the
    CPU's composite also keeps (tests/model/test_norm.py): the CUDA plan counts what the kernel keeps, the CPU
    plan stays as it was."""
    from pretrain.plan.activations import activation_bytes
    from pretrain.plan.kernels import fused_rms_norm, planned_fused_norm

    shape = ["model.preset=llama3.2-1b", "model.qk_norm=true", "train.seq_len=2048", "train.micro_batch_size=2"]
    shape.append(f"train.precision={precision}")
    cpu, gpu = (load_config(overrides=[*shape, f"hardware.gpu={g}"]) for g in ("cpu", "h100-sxm"))
    assert not planned_fused_norm(cpu) and planned_fused_norm(gpu)
    assert fused_rms_norm("cuda", "2.7.1+cu126") is False and fused_rms_norm("cuda", "2.11.0+cu130") is True
    m, t, par = gpu.model, gpu.train, gpu.parallel
    eager = activation_bytes(m, t, par)  # the CPU's terms
    fused = activation_bytes(m, t, par, fused_norm=True)
    names = {x.name: x.bytes for x in fused["layer_terms"]}
    bsh, bs = 2 * 2048 * m.hidden_size, 2 * 2048
    assert "RMSNorm fp32 normalised x" not in names and "QK-norm fp32 normalised q, k" not in names
    inputs = next(v for k, v in names.items() if k.startswith("RMSNorm") and k.endswith("inputs"))
    assert inputs == 2 * kept * bsh and names["RMSNorm reciprocal rms"] == 2 * 4 * bs
    width = (m.num_heads + m.num_kv_heads) * m.head_dim  # QK-norm (Qwen3's): per head of q and k
    dropped = 2 * 4 * bsh + 4 * bs * width  # the fp32 normalised x of both norms, and of q and k
    if kept == 2:  # pure bf16: the 16-bit inputs kept, not fp32 copies; q and k are views of the qkv output
        dropped += 2 * 2 * bsh + 4 * bs * width  # that SDPA keeps whole already
    assert eager["per_layer"] - fused["per_layer"] == dropped
    final = {x.name: x.bytes for x in fused["once_terms"]}["final RMSNorm"]
    assert final == kept * bsh + 4 * bs
    assert make_plan(gpu)["memory_bytes"]["activations"] == fused["total"]
    assert (
        make_plan(cpu)["memory_bytes"]["activations"] == activation_bytes(cpu.model, cpu.train, cpu.parallel)["total"]
    )
