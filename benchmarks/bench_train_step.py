"""Our training step against a minimal hand-written PyTorch loop: same model, batch, precision, optimizer.

The minimal loop is what a reader of nanoGPT writes: forward under autocast, backward, clip, AdamW step,
zero_grad. Ours adds the batch ramp, the LR schedule, the global loss, spike detection and the non-finite
check. It must not be slower (ratio >= 1.0 within noise on CPU; on a GPU with torch.compile, the ~1B LLaMA
at seq 2048 in bf16 should reach MFU >= 50% on an H100).

  python benchmarks/bench_train_step.py [section.key=value ...] [--steps N] [--rounds R]

Rounds alternate the two loops (and which goes first) so that a busy machine slows both alike; the median
of each is compared.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pretrain.config import compile_enabled, load_config
from pretrain.distributed.optim import build_optimizer
from pretrain.distributed.recompute import apply_activation_checkpointing
from pretrain.distributed.runtime import init_runtime
from pretrain.model import build_model
from pretrain.plan import make_plan
from pretrain.plan.flops import mfu
from pretrain.precision import autocast as precision_context
from pretrain.train.trainer import Trainer

# The model when no model.* key is given (a model.* key, e.g. model.preset=gpt2, replaces all of these).
MODEL_DEFAULTS = [
    "model.preset=debug",
    "model.hidden_size=256",
    "model.intermediate_size=688",
    "model.num_layers=4",
    "model.num_heads=8",
    "model.num_kv_heads=4",
    "model.vocab_size=2048",
]
DEFAULTS = [
    "train.seq_len=256",
    "train.micro_batch_size=8",
    "train.grad_accum_steps=1",
    "train.precision=fp32",
    "train.max_steps=100000",
    "train.device=cpu",
    "hardware.peak_tflops=1",
    "stability.spike_detection=true",
]


class RandomTokens:
    """Synthetic batches with the loader interface (the data is not what is measured)."""

    def __init__(self, vocab: int, seq_len: int, seed: int = 0):
        self.vocab, self.seq_len = vocab, seq_len
        self.generator = torch.Generator().manual_seed(seed)

    def next_batch(self, batch_size):
        rows = torch.randint(0, self.vocab, (batch_size, self.seq_len + 1), generator=self.generator)
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ours(config, rt, steps):
    trainer = Trainer(config, rt, loader=RandomTokens(config.model.vocab_size, config.train.seq_len), quiet=True)
    for _ in range(3):
        trainer.step()

    def run():
        sync(rt.device)
        start = time.perf_counter()
        for _ in range(steps):
            trainer.step()
        sync(rt.device)
        return time.perf_counter() - start

    return run


def minimal(config, rt, steps):
    t = config.train
    torch.manual_seed(t.seed)
    # The same work as ours: its loss, recomputation and attention kernel.
    model = build_model(config.model, device=rt.device, loss=t.loss, loss_chunk_tokens=t.loss_chunk_tokens)
    apply_activation_checkpointing(model, t.activation_checkpointing)
    model.fix_attention_kernel(rt.device, half=t.precision != "fp32")
    model = torch.compile(model) if compile_enabled(t.compile, rt.device.type) else model
    optimizer = build_optimizer(model, config.model, t)
    autocast = precision_context(t.precision, rt.device)
    data = RandomTokens(config.model.vocab_size, t.seq_len)

    def step():
        for _ in range(t.grad_accum_steps):
            x, y = (b.to(rt.device) for b in data.next_batch(t.micro_batch_size))
            with autocast():
                loss = model(x, y)
            (loss / t.grad_accum_steps).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(3):
        step()

    def run():
        sync(rt.device)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync(rt.device)
        return time.perf_counter() - start

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    model = [] if any(o.startswith("model.") for o in args.overrides) else MODEL_DEFAULTS
    config = load_config(overrides=model + DEFAULTS + args.overrides)
    rt = init_runtime(config.train.device)
    t = config.train
    tokens = args.steps * t.micro_batch_size * t.grad_accum_steps * t.seq_len
    loops = {"pretrain": ours(config, rt, args.steps), "minimal": minimal(config, rt, args.steps)}
    seconds = {name: [] for name in loops}
    for round_ in range(args.rounds):
        order = list(loops) if round_ % 2 == 0 else list(reversed(loops))  # neither always runs first
        for name in order:
            seconds[name].append(loops[name]())
    speed = {name: tokens / statistics.median(s) for name, s in seconds.items()}
    print(
        f"device {rt.device}, threads {torch.get_num_threads()}, {config.model.num_layers} layers x "
        f"{config.model.hidden_size}, batch {t.micro_batch_size} x {t.grad_accum_steps} x {t.seq_len}, "
        f"{t.precision}, compile {compile_enabled(t.compile, rt.device.type)}"
    )
    flops_per_token = make_plan(config)["flops"]["per_token"]  # the model FLOPs MFU counts (PaLM: 6N + attention)
    peak = config.hardware.peak_tflops
    for name, tps in speed.items():
        spread = [tokens / s for s in seconds[name]]
        util = f", MFU {mfu(tps, flops_per_token, 1, peak):.1%} of {peak:g} TFLOP/s" if peak else ""
        print(
            f"  {name:9s} {tps:12,.0f} tokens/s (median of {args.rounds}; min {min(spread):,.0f}, "
            f"max {max(spread):,.0f}){util}"
        )
    print(f"  ratio pretrain / minimal = {speed['pretrain'] / speed['minimal']:.3f}")


if __name__ == "__main__":
    main()
