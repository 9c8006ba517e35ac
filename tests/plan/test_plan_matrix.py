"""Every preset, ZeRO stage, precision and optimizer gives a consistent plan."""

import itertools

import pytest

from pretrain.config import load_config
from pretrain.plan import make_plan
from pretrain.presets import PRESETS

PRECISIONS = ["fp32", "fp16-mixed", "bf16-mixed", "bf16"]
OPTIMIZERS = ["adamw", "adafactor", "sgd"]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_plans(preset):
    p = make_plan(load_config(overrides=[f"model.preset={preset}", "parallel.gpus=8", "hardware.gpu=h100-sxm"]))
    mem = p["memory_bytes"]
    # The peak over the phases of a step; the parameters, states and CUDA context are in every phase.
    assert mem["total"] == mem["phases"][mem["peak_phase"]] == max(mem["phases"].values())
    assert min(mem["phases"].values()) >= mem["optimizer"] + mem["cuda_context"]
    assert p["time"]["seconds"] > 0 and p["flops"]["per_token"] > 0


@pytest.mark.parametrize("precision, optimizer", list(itertools.product(PRECISIONS, OPTIMIZERS)))
def test_zero_stages_shrink_model_states(precision, optimizer):
    states = []
    for stage in range(4):
        p = make_plan(
            load_config(
                overrides=[
                    "model.preset=llama-7b",
                    "parallel.gpus=16",
                    f"parallel.zero_stage={stage}",
                    f"train.precision={precision}",
                    f"train.optimizer={optimizer}",
                ]
            )
        )
        m = p["memory_bytes"]
        states.append(m["weights"] + m["gradients"] + m["optimizer"])
    assert states[0] >= states[1] > states[2] > states[3]


def test_precisions_and_optimizers_order_memory():
    def states(precision, optimizer):
        mem = make_plan(
            load_config(
                overrides=["model.preset=llama-7b", f"train.precision={precision}", f"train.optimizer={optimizer}"]
            )
        )["memory_bytes"]
        return mem["weights"] + mem["gradients"] + mem["optimizer"]

    assert states("bf16", "adamw") < states("fp32", "adamw") < states("bf16-mixed", "adamw")
    assert states("fp32", "adafactor") < states("fp32", "sgd") < states("fp32", "adamw")


def test_recomputation_and_micro_batch():
    def act(**kw):
        over = ["model.preset=llama-7b"] + [f"train.{k}={v}" for k, v in kw.items()]
        return make_plan(load_config(overrides=over))["memory_bytes"]["activations"]

    assert act(activation_checkpointing="full") < act(activation_checkpointing="selective") < act()
    assert act(micro_batch_size=4) > 3.5 * act(micro_batch_size=1)
    assert act(attention="eager") > act(attention="sdpa")


def test_tensor_and_pipeline_parallel_divide_the_work():
    base = ["model.preset=llama2-70b", "parallel.gpus=64"]
    one = make_plan(load_config(overrides=base))
    tp = make_plan(load_config(overrides=base + ["parallel.tensor=8"]))
    tp_sp = make_plan(load_config(overrides=base + ["parallel.tensor=8", "parallel.sequence_parallel=true"]))
    pp = make_plan(load_config(overrides=base + ["parallel.pipeline=4"]))
    assert tp["parallel"]["data"] == 8 and pp["parallel"]["data"] == 16
    assert tp["model_states"]["parameters"] < one["model_states"]["parameters"] / 7
    assert tp_sp["memory_bytes"]["activations"] < tp["memory_bytes"]["activations"]
    assert pp["model_states"]["parameters"] < one["model_states"]["parameters"] / 3


def test_fits_and_max_micro_batch():
    p = make_plan(load_config(overrides=["model.preset=gpt2", "hardware.gpu=a100-80gb", "train.micro_batch_size=8"]))
    assert p["fits"] is True and p["max_micro_batch_size"] >= 8
    big = make_plan(load_config(overrides=["model.preset=llama-65b", "hardware.gpu=a100-80gb"]))
    assert big["fits"] is False and big["max_micro_batch_size"] == 0
    # The largest micro-batch that fits does fit, one more does not.
    b = p["max_micro_batch_size"]
    gpt2 = ["model.preset=gpt2", "hardware.gpu=a100-80gb"]
    at = make_plan(load_config(overrides=[*gpt2, f"train.micro_batch_size={b}"]))
    over = make_plan(load_config(overrides=[*gpt2, f"train.micro_batch_size={b + 1}"]))
    assert at["fits"] and not over["fits"]


def test_offload_moves_states_to_host():
    on = make_plan(load_config(overrides=["model.preset=llama-7b"]))
    off = make_plan(load_config(overrides=["model.preset=llama-7b", "parallel.offload=optimizer"]))
    assert off["memory_bytes"]["optimizer"] == 0
    assert off["memory_bytes"]["host"] - on["memory_bytes"]["host"] == on["memory_bytes"]["optimizer"]


def test_host_memory_is_offloaded_states_and_an_imported_checkpoint():
    # The trainer builds the model on the GPU (FSDP on the meta device): nothing on the host by default.
    assert make_plan(load_config(overrides=["model.preset=llama-7b"]))["memory_bytes"]["host"] == 0
    base = ["model.preset=llama-7b", "parallel.gpus=16", "parallel.gpus_per_node=8"]
    imported = make_plan(load_config(overrides=base + ["model.init_from=hf/llama-7b"]))
    assert imported["memory_bytes"]["host"] == 8 * 4 * imported["params"]["total"]  # each process reads it
