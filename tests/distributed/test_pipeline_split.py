"""The model split into pipeline stages (no process group needed): which layers and parameters each stage
holds, under the whole model's names, and the stages run one after another compute the model's loss."""

import pytest

from pretrain.config import load_config
from pretrain.plan.params import param_shapes
from pretrain.plan.stages import in_flight, stage_layers, stage_param_shapes

torch = pytest.importorskip("torch")


def test_layers_split_evenly_and_the_later_stages_take_the_rest():
    assert stage_layers(8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    # 10 layers on 4 stages: 2, 2, 3, 3 (the first stage holds the most micro-batches in flight)
    assert [len(r) for r in stage_layers(10, 4)] == [2, 2, 3, 3]
    assert stage_layers(2, 1) == [range(0, 2)]


def test_first_stage_holds_p_micro_batches_in_flight_under_1f1b():
    # Narayanan et al. 2021, section 2.2.1: stage k runs p - k forwards before its first backward.
    assert [in_flight(k, 4, 8) for k in range(4)] == [4, 3, 2, 1]
    assert [in_flight(k, 4, 2) for k in range(4)] == [2, 2, 2, 1]


def config(*extra):
    return load_config(None, ["model.preset=debug", "model.num_layers=5", *extra])


def test_every_parameter_is_on_exactly_one_stage_under_its_own_name():
    m = config().model
    stages = [stage_param_shapes(m, k, 3) for k in range(3)]
    names = [n for stage in stages for n, _ in stage]
    assert sorted(names) == sorted(n for n, _ in param_shapes(m))
    assert stages[0][0][0] == "embed.weight" and stages[-1][-1][0] == "lm_head.weight"
    assert {n.split(".")[1] for n, _ in stages[1] if n.startswith("blocks.")} == {"1", "2"}


def test_stage_modules_chained_compute_the_models_loss():
    from pretrain.distributed.pipeline import StageModule
    from pretrain.model import build_model

    c = config()
    model = build_model(c.model, device="cpu", seed=0)
    stages = [StageModule(model, k, 3) for k in range(3)]
    for k, stage in enumerate(stages):
        assert [n for n, _ in stage.named_parameters()] == [n for n, _ in stage_param_shapes(c.model, k, 3)]
    tokens = torch.randint(0, c.model.vocab_size, (2, 16))
    targets = torch.randint(0, c.model.vocab_size, (2, 16))
    h = tokens
    for stage in stages:
        h = stage(h)
    loss = model.loss(h, model.lm_head.weight, targets)
    assert torch.equal(loss, model(tokens, targets))


@pytest.mark.parametrize(
    "extra, message",
    [
        (("model.tie_embeddings=true",), "parallel.pipeline: a tied embedding"),
        (("parallel.zero_stage=3",), "parallel.zero_stage: FSDP (stages 2 and 3) per pipeline stage is not built"),
        (("train.precision=fp16-mixed",), "train.precision: fp16-mixed's loss scaler"),
    ],
)
def test_what_the_pipelined_trainer_refuses(extra, message):
    from pretrain.config.trainable import check_pipelinable
    from pretrain.errors import ConfigError

    c = config("parallel.gpus=8", "parallel.pipeline=2", *extra)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_pipelinable(c)


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_pipeline_x_tensor_x_data_is_trainable(zero_stage):
    # A pipeline averages its stages' gradients itself (and ZeRO-1 broadcasts each rank's local parts): no
    # DDP or ZeroRedundancyOptimizer, which take no DTensor parameters, as tensor x data without a pipeline would.
    from pretrain.config.trainable import check_trainable

    check_trainable(
        config("parallel.gpus=8", "parallel.pipeline=2", "parallel.tensor=2", f"parallel.zero_stage={zero_stage}"),
        needs_data=False,
    )


def test_the_planner_holds_each_stage_to_its_own_tensor_rank_parts():
    # Pipeline x tensor: a rank holds its stage's parameters, each its tensor rank's part; the stages' parts
    # add up to one tensor rank's part of the whole model (the planner once scaled the heaviest stage's share).
    from pretrain.plan.model_states import model_state_tensors, numel, tensor_parallel_shape

    c = config("parallel.gpus=6", "parallel.pipeline=3", "parallel.tensor=2", "train.precision=fp32")
    per_stage = [model_state_tensors(c, stage=k)["parameters"] for k in range(3)]
    assert sum(per_stage) == 4 * sum(numel(tensor_parallel_shape(n, s, 2)) for n, s in param_shapes(c.model))
    assert model_state_tensors(c)["parameters"] == max(per_stage)  # the heaviest stage by default


def test_interleaved_1f1b_gives_each_rank_chunks_p_apart():
    from pretrain.plan.stages import bubble_fraction, chunk_indices, chunks_in_flight

    assert chunk_indices(1, 4, 2) == [1, 5] and chunk_indices(1, 4, 1) == [1]
    # 8 layers, 2 ranks x 2 chunks: rank 0 runs layers 0-1 and 4-5 (and the embedding), rank 1 the rest
    c = config(
        "model.num_layers=8", "parallel.gpus=2", "parallel.pipeline=2", "parallel.pipeline_schedule=interleaved_1f1b"
    )
    held = [
        {n.split(".")[1] for n, _ in stage_param_shapes(c.model, k, 2, 2) if n.startswith("blocks.")} for k in range(2)
    ]
    assert held == [{"0", "1", "4", "5"}, {"2", "3", "6", "7"}]
    assert bubble_fraction(4, 8) == 3 / 11 and bubble_fraction(4, 8, 2) == 3 / 19
    # The first rank's warm-up: (v - 1) p + 2 (p - 1) chunk forwards, then its first backward's: v p + p - 1
    # chunk activations, 1 + (p - 1) / (v p) times 1F1B's p stages of v chunks (section 2.2.2).
    assert [chunks_in_flight(k, 4, 8, 2) for k in range(4)] == [11, 9, 7, 5]
    assert chunks_in_flight(0, 4, 2, 2) == 4  # capped by the step's v m chunk micro-batches


def test_the_planner_counts_the_interleaved_ranks_in_flight_activations():
    from pretrain.plan.activations import activation_bytes

    base = ("model.num_layers=8", "parallel.gpus=4", "parallel.pipeline=4", "train.grad_accum_steps=8")
    plain, inter = (config(*base, *extra) for extra in ((), ("parallel.pipeline_schedule=interleaved_1f1b",)))
    a = activation_bytes(plain.model, plain.train, plain.parallel)
    b = activation_bytes(inter.model, inter.train, inter.parallel)
    assert (a["layers"], a["in_flight"]) == (2, 4)  # 2 layers x p micro-batches on the first stage
    assert (b["layers"], b["in_flight"]) == (1, 11)  # 1-layer chunks x (v p + p - 1)
    assert b["total"] - b["once"] == (a["total"] - a["once"]) * 11 // 8


def test_interleaving_needs_two_layers_per_stage():
    from pretrain.errors import ConfigError

    with pytest.raises(ConfigError, match="parallel.pipeline_schedule: interleaved_1f1b runs 2 chunks"):
        config("parallel.gpus=4", "parallel.pipeline=4", "parallel.pipeline_schedule=interleaved_1f1b")
