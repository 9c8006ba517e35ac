"""Memory per GPU under tensor and pipeline parallelism, the fit verdict, and the explain text beside them.

LLaMA-7B numbers used below: one block 4H^2 + 3HH' + 2H = 202,383,360 parameters (H = 4,096, H' = 11,008), of
which 2H = 8,192 are its two RMSNorm weights; embedding and output layer 32,000 x 4,096 = 131,072,000 each.
"""

from pretrain.config import load_config
from pretrain.plan import plan, plan_with_explain
from pretrain.plan.advice import _tensor_options

BLOCK, NORMS, VH, H = 202_383_360, 8_192, 32_000 * 4_096, 4_096


def _explain(config, name) -> tuple[str, str]:
    _, ex = plan_with_explain(config, advice=False)
    return next((value, formula) for s, n, value, formula in ex.lines if (s, n) == ("memory", name))


def test_zero_paper_accounting_divides_by_model_parallelism():
    # ZeRO paper (Rajbhandari et al. 2020), section 5 and table 1: with model parallelism N_m each GPU holds
    # Psi / N_m parameters, and stage 3 shards their (2 + 4 + 12) bytes over N_d: 18 x 6,738,415,616 / 8 / 8
    # bytes = 1.77 GiB (it printed 14.12 GiB, the data-parallel-only figure).
    config = load_config(overrides=["model.preset=llama-7b", "parallel.gpus=64", "parallel.tensor=8",
                                    "parallel.zero_stage=3"])
    value, formula = _explain(config, "model states, ZeRO paper accounting")
    assert value == f"{18 * 6_738_415_616 / 8 / 8 / 1024**3:.2f} GiB" == "1.77 GiB"
    assert "/ model parallel 8" in formula


def test_fsdp_reduce_scatter_is_one_block_of_one_tensor_rank():
    # The block's matmuls are split 8 ways, its norms replicated: 4 bytes x ((BLOCK - NORMS) / 8 + NORMS),
    # beside the loss's working set. Chunked (the default): its backward hands autograd dL/dh (bf16 under FSDP,
    # 2 x 2,048 x 4,096) and dL/dW (2 x V*h / 8), a little more than one chunk's logits (6 x 2,048 x 32,000 / 8).
    def plan_of(*extra):
        return plan(load_config(overrides=["model.preset=llama-7b", "parallel.gpus=64", "parallel.tensor=8",
                                           "parallel.zero_stage=3", *extra]))
    p = plan_of()
    reduce_scatter = 4 * ((BLOCK - NORMS) // 8 + NORMS)
    assert reduce_scatter == 101_220_352  # was 809,533,440: a whole block
    assert 2 * 2048 * H + 2 * VH // 8 > 6 * 2048 * 32_000 // 8
    assert p["memory_bytes"]["buffers"] == 2 * 2048 * H + 2 * VH // 8 + reduce_scatter
    # Plain: the backward of the full-vocabulary loss, two fp32 gradients of the logits (8 x 2,048 x 32,000 / 8).
    assert plan_of("train.loss=plain")["memory_bytes"]["buffers"] == 8 * 2048 * 32_000 // 8 + reduce_scatter


def test_zero3_with_a_pipeline_gathers_whole_blocks_of_its_stage():
    # 32 stages of one block each: a stage gathers its whole bf16 block (0.377 GiB) and its end of the model,
    # the heavier being the last stage's final norm and output layer; it printed 0.061 GiB (a 1/32 share).
    one = plan(load_config(overrides=["model.preset=llama-7b", "parallel.gpus=256", "parallel.pipeline=32",
                                      "parallel.zero_stage=3"]))
    assert one["model_states"]["working_copies"] == 2 * (BLOCK + H + VH)
    # 8 stages of 4 blocks: the block being computed and the prefetched next one.
    four = plan(load_config(overrides=["model.preset=llama-7b", "parallel.gpus=64", "parallel.pipeline=8",
                                       "parallel.zero_stage=3"]))
    assert four["model_states"]["working_copies"] == 2 * (2 * BLOCK + H + VH)
    # Without a pipeline: two blocks and the whole root (embedding, final norm, output), as before.
    flat = plan(load_config(overrides=["model.preset=llama-7b", "parallel.gpus=64", "parallel.zero_stage=3"]))
    assert flat["model_states"]["working_copies"] == 2 * (2 * BLOCK + VH + H + VH)


def test_fp32_loss_buffer_text_is_the_value():
    # GPT-2 (V = 50,257) at 1,024 tokens, fp32, tensor 2. Chunked: the one chunk of c = 1,024 tokens holds its
    # fp32 logits, turned in place into their gradient: 4 x c*V / t = 102,926,336. Plain: the backward's two
    # fp32 gradients of the logits beside the kept log-softmax, 8 x b*s*V / t = 205,852,672.
    def buffers(*extra):
        return _explain(load_config(overrides=["model.preset=gpt2", "train.precision=fp32", "parallel.gpus=8",
                                               "parallel.tensor=2", *extra]), "buffers")[1]
    assert buffers().startswith("chunked loss working set 102,926,336: loss chunk of c=1,024 tokens: logits, "
                                "gradient (4 x c*V), V terms / tensor 2")
    assert buffers("train.loss=plain").startswith(
        "plain loss working set 205,852,672: loss backward: fp32 gradients of the log-softmax and the logits "
        "(8 x b*s*V), V terms / tensor 2")


def test_a_card_too_small_for_anything_does_not_fit():
    p = plan(load_config(overrides=["model.preset=debug", "hardware.memory_gb=1e-10"]))  # 0.1 byte -> 0
    assert p["device_memory_bytes"] == 0 and p["fits"] is False and p["max_micro_batch_size"] == 0


def test_max_micro_batch_is_not_capped():
    # One-token sequences of the debug model on an H200: ~11M sequences fit, beyond the old 2^21 - 1 cap.
    base = ["model.preset=debug", "train.seq_len=1", "hardware.gpu=h200"]
    b = plan(load_config(overrides=base))["max_micro_batch_size"]
    assert b > 2**21
    assert plan(load_config(overrides=base + [f"train.micro_batch_size={b}"]))["fits"] is True
    assert plan(load_config(overrides=base + [f"train.micro_batch_size={b + 1}"]))["fits"] is False


def test_advice_offers_only_tensor_sizes_that_divide_the_kv_heads():
    # TinyLlama: 32 query heads, 4 key/value heads: tensor 8 is refused by validation, so never advised.
    config = load_config(overrides=["model.preset=tinyllama-1.1b"])
    options, _ = _tensor_options(config, {})
    assert {o["parallel.tensor"] for o in options} == {2, 4}


def test_autocast_copies_per_pipeline_stage_and_tensor_rank():
    # bf16 copies of the matmul weights autocast keeps for backward, on the last stage (it holds the output
    # layer): with full recomputation only the block being recomputed, else the stage's ceil(32 / 4) = 8 blocks.
    def copies(*extra):
        config = load_config(overrides=["model.preset=llama-7b", "parallel.gpus=16", "parallel.pipeline=4",
                                        "parallel.tensor=2", *extra])
        return plan(config)["model_states"]["working_copies"]
    # The chunked loss (the default) casts the output weight per call and keeps no copy of it; plain keeps one.
    assert copies("train.activation_checkpointing=full") == 2 * (BLOCK - NORMS) // 2
    assert copies("train.activation_checkpointing=none") == 2 * 8 * (BLOCK - NORMS) // 2
    assert copies("train.activation_checkpointing=full", "train.loss=plain") == 2 * ((BLOCK - NORMS) + VH) // 2
    assert copies("train.activation_checkpointing=none", "train.loss=plain") == 2 * (8 * (BLOCK - NORMS) + VH) // 2
