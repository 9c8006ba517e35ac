"""The CPU step-time model's op counts (pretrain.plan.cpu_time) against the aten ops the trainer's own step
dispatches, counted below autograd with a TorchDispatchMode: per micro-batch (blocks and what is around them)
and per step (clipping, AdamW, zero_grad). A small model's CPU step is these ops' overhead, so a count that
drifts from the model's makes the plan's tokens/s drift with it. The table was counted on torch 2.13; other
releases dispatch a few ops more or less (within 15 %)."""

import pytest

from pretrain.config import load_config
from pretrain.plan import cpu_time

torch = pytest.importorskip("torch")

BASE = ["train.seq_len=16", "train.micro_batch_size=2", "train.precision=fp32", "train.device=cpu", "hardware.gpu=cpu"]
BASE += ["hardware.peak_tflops=0.05", "run.progress=false", "run.checkpoint_every=0", "train.max_steps=100"]
CASES = {
    "debug": ["model.preset=debug"],
    "bf16-mixed": ["model.preset=debug", "train.precision=bf16-mixed"],
    "full recomputation": ["model.preset=debug", "train.activation_checkpointing=full"],
    "qk-norm": ["model.preset=debug", "model.qk_norm=true"],
    "gpt2": ["model.family=gpt2", "model.vocab_size=512", "model.hidden_size=64", "model.num_heads=4"]
    + ["model.intermediate_size=256", "model.max_seq_len=64", "model.tie_embeddings=true", "model.bias=true"],
    "moe-debug": ["model.preset=moe-debug"],
    "two loss chunks": ["model.preset=debug", "train.loss_chunk_tokens=16"],
    # torchao's eager float8: each converted linear's casts (every block linear at hidden 128)
    "fp8": ["model.preset=debug", "model.hidden_size=128", "model.intermediate_size=352", "model.num_heads=4"]
    + ["train.precision=fp8", "train.fp8_min_features=16"],
}


def dispatched(config) -> int:
    """aten ops of the trainer's third step (the optimizer's states exist from the second on)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from pretrain.distributed.runtime import init_runtime
    from pretrain.sweep.synthetic import SyntheticTokens
    from pretrain.train.trainer import Trainer

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    loader = SyntheticTokens(config.model.vocab_size, config.train.seq_len, seed=0)
    trainer = Trainer(config, init_runtime("cpu"), loader=loader, quiet=True)
    try:
        trainer.step(), trainer.step()
        with Count():
            trainer.step()
    finally:
        trainer.batches.close()
    return Count.ops


@pytest.mark.parametrize("case", list(CASES))
def test_the_planned_ops_are_the_ops_the_step_dispatches(case, tmp_path):
    if case == "fp8":
        pytest.importorskip("torchao")
    one, two = (
        load_config(None, [*BASE, *CASES[case], f"train.grad_accum_steps={a}", f"run.dir={tmp_path / str(a)}"])
        for a in (1, 2)
    )
    per_step, per_two = dispatched(one), dispatched(two)
    layers = one.model.num_layers
    planned_micro = cpu_time.micro_batch_ops(one, layers)
    planned_step = cpu_time.STEP_OPS + cpu_time.MOE_STEP_OPS * bool(one.model.num_experts)
    exact = torch.__version__.startswith("2.13")
    for counted, planned in ((per_two - per_step, planned_micro), (2 * per_step - per_two, planned_step)):
        assert counted == planned if exact else counted == pytest.approx(planned, rel=0.15), (case, counted, planned)
