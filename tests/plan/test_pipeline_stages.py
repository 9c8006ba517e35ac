"""The planner's pipeline stages: each stage's model states counted from its own parameters (the ones the
trainer's stage holds, tests/distributed/test_pipeline.py checks them per rank), the heaviest stage named,
and the activations of the stage holding the most micro-batches under 1F1B."""

from pretrain.config import load_config
from pretrain.plan import plan_with_explain
from pretrain.plan.activations import activation_bytes
from pretrain.plan.model_states import heaviest_stage, model_state_tensors
from pretrain.plan.stages import stage_param_shapes


def config(*extra):
    return load_config(
        None, ["model.preset=debug", "train.precision=fp32", "parallel.gpus=2", "parallel.pipeline=2", *extra]
    )


def numel(shapes):
    total = 0
    for _, shape in shapes:
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def test_each_stage_holds_its_own_parameters_exactly():
    c = config()
    for stage in (0, 1):
        n = numel(stage_param_shapes(c.model, stage, 2))
        st = model_state_tensors(c, stage=stage)
        # fp32 AdamW: 4 bytes of weight, 4 of gradient, 8 of moments and a 4-byte step per tensor
        tensors = len(stage_param_shapes(c.model, stage, 2))
        assert (st["parameters"], st["gradients"], st["optimizer_states"]) == (4 * n, 4 * n, 8 * n + 4 * tensors)


def test_the_heaviest_stage_is_the_plans_and_the_plan_says_which():
    # Untied debug model: stage 0 holds the embedding (V x H), stage 1 the output layer (V x H) and the final
    # norm (H): stage 1 is heavier by the norm's 64 weights.
    c = config()
    assert heaviest_stage(c) == 1
    p, ex = plan_with_explain(c, advice=False)
    assert p["model_states"]["parameters"] == model_state_tensors(c, stage=1)["parameters"]
    (line,) = [x for x in ex.lines if x[1] == "pipeline stage"]
    assert line[2] == "1" and "the final norm, the output layer and layer 1" in line[3]


def test_the_first_stage_holds_p_micro_batches_of_activations():
    # Narayanan et al. 2021 (1F1B): the first stage runs p forwards before its first backward, so it keeps
    # p micro-batches' activations of its layers; fewer when the step has fewer micro-batches.
    c = config("model.num_layers=4", "parallel.gpus=4", "parallel.pipeline=4", "train.grad_accum_steps=8")
    act = activation_bytes(c.model, c.train, c.parallel)
    assert (act["layers"], act["in_flight"]) == (1, 4)
    c = config("model.num_layers=4", "parallel.gpus=4", "parallel.pipeline=4", "train.grad_accum_steps=2")
    assert activation_bytes(c.model, c.train, c.parallel)["in_flight"] == 2
