"""Tokens on disk, optimizer steps with and without the batch ramp, and what --explain says about them."""

from pretrain.config import load_config
from pretrain.plan import make_plan, plan_with_explain
from pretrain.plan.length import ramp_args
from pretrain.plan.schedule import steps_for_tokens, tokens_for_steps

GPT2_EXAMPLES = ["model.preset=gpt2", "train.seq_len=1024", "train.examples=1e6"]


def _explain(config, section, name) -> tuple[str, str]:
    _, ex = plan_with_explain(config, advice=False)
    return next((value, formula) for s, n, value, formula in ex.lines if (s, n) == (section, name))


def test_tokens_on_disk_hold_each_example_once():
    # 1,000,000 windows of 1,024 GPT-2 tokens (uint16): the .bin `pretrain prepare` writes is 2,048,000,000
    # bytes however many epochs read it; the run trains on 4 x as many tokens.
    config = load_config(overrides=GPT2_EXAMPLES + ["train.epochs=4"])
    p = make_plan(config)
    assert p["tokens"]["total"] == 4 * 1_024_000_000
    assert p["storage_bytes"] == 2 * 1_024_000_000
    assert "examples 1,000,000 x seq 1024" in _explain(config, "tokens", "storage_bytes")[1]
    # Tokens given directly: the file holds what is trained on (unchanged).
    assert make_plan(load_config(overrides=["model.preset=gpt2", "train.tokens=1e9"]))["storage_bytes"] == 2e9


def test_examples_with_a_ramp_count_the_steps_the_trainer_runs():
    # The trainer runs `steps` optimizer steps of micro_batches_per_step(tokens seen) micro-batches: the
    # ramp's first steps are smaller, so 15,625 steps (1.024e9 / 65,536) saw only 822,958,080 tokens.
    config = load_config(overrides=GPT2_EXAMPLES + ["train.grad_accum_steps=64", "train.batch_ramp_tokens=5e8"])
    p, args = make_plan(config), ramp_args(config)
    tokens, steps = p["tokens"]["total"], p["steps"]["total"]
    assert tokens == 1_024_000_000
    assert tokens_for_steps(15_625, **args) == 822_958_080
    assert steps == steps_for_tokens(tokens, **args) == 18_693
    assert tokens_for_steps(steps - 1, **args) < tokens <= tokens_for_steps(steps, **args)
    assert "batch growing from 32,768 to 65,536" in _explain(config, "steps", "total")[1]


def test_examples_without_a_ramp_keep_the_hf_trainer_count():
    # A practitioner's Hugging Face Trainer log: 16,527,707 examples, 3 epochs, batch 8 -> 6,197,892 steps (also
    # in test_worked_examples).
    p = make_plan(
        load_config(
            overrides=[
                "model.preset=llama3.2-1b",
                "train.examples=16527707",
                "train.epochs=3",
                "train.micro_batch_size=8",
                "train.grad_accum_steps=1",
            ]
        )
    )
    assert p["steps"]["total"] == 6_197_892


def test_chinchilla_steps_with_a_ramp_say_so():
    # The explain said "ceil(tokens 2,488,796,160 / tokens per step 65,536)" = 37,977, beside 44,112 steps.
    config = load_config(overrides=["model.preset=gpt2", "train.batch_ramp_tokens=1e9", "train.grad_accum_steps=64"])
    value, formula = _explain(config, "steps", "total")
    assert value == "44,112" and "ceil" not in formula and "train.batch_ramp_tokens" in formula
    no_ramp = load_config(overrides=["model.preset=gpt2", "train.grad_accum_steps=64"])
    assert _explain(no_ramp, "steps", "total") == ("37,977", "ceil(tokens 2,488,796,160 / tokens per step 65,536)")
