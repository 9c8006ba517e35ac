"""Our Mixture-of-Experts training step against transformers' Qwen3MoeForCausalLM on the same tiny shape.

  python benchmarks/moe_step.py [--steps N] [--rounds R] [--hf-experts eager|grouped_mm|both]

Both models: the same Qwen3-MoE shape (per-head QK-norm, E routed experts, top-k, normalised top-k weights,
no shared expert), fp32 on the CPU, the load-balancing loss in the loss (ours: Switch's aux loss; theirs:
output_router_logits with the same effective coefficient), then backward, gradient clipping at 1.0 and
torch's AdamW. transformers' experts run as `experts_implementation` says: "eager" is the loop over the
experts that hit tokens, "grouped_mm" (its default in transformers 5 where torch has the op) the grouped GEMM.
Rounds alternate A B A B (and which goes first) so that a busy machine slows both alike; medians compared.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pretrain.config import load_config
from pretrain.model import build_model

# Qwen3-30B-A3B's proportions scaled down: 128 experts of width 768 at hidden 2048, top-8 -> 64 of 48 at 128
SHAPE = dict(
    vocab=2048,
    hidden=128,
    layers=4,
    heads=8,
    kv_heads=4,
    head_dim=16,
    experts=64,
    top_k=8,
    expert_width=48,
    seq=128,
    batch=4,
)
AUX = 0.01  # our coefficient; transformers' convention is k times ours, so theirs is AUX / k


def ours():
    s = SHAPE
    cfg = load_config(
        overrides=[
            "model.family=llama",
            f"model.vocab_size={s['vocab']}",
            f"model.hidden_size={s['hidden']}",
            f"model.intermediate_size={4 * s['hidden']}",
            f"model.num_layers={s['layers']}",
            f"model.num_heads={s['heads']}",
            f"model.num_kv_heads={s['kv_heads']}",
            f"model.head_dim={s['head_dim']}",
            "model.qk_norm=true",
            f"model.num_experts={s['experts']}",
            f"model.experts_per_token={s['top_k']}",
            f"model.moe_intermediate_size={s['expert_width']}",
            "model.norm_topk_prob=true",
            f"model.router_aux_loss_coef={AUX}",
            "model.max_seq_len=512",
        ]
    ).model
    model = build_model(cfg).train()
    return model, lambda x, y: model(x, y)


def theirs(experts_implementation: str):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    s = SHAPE
    cfg = Qwen3MoeConfig(
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=4 * s["hidden"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        head_dim=s["head_dim"],
        num_experts=s["experts"],
        num_experts_per_tok=s["top_k"],
        moe_intermediate_size=s["expert_width"],
        norm_topk_prob=True,
        output_router_logits=True,
        router_aux_loss_coef=AUX / s["top_k"],
        max_position_embeddings=512,
        experts_implementation=experts_implementation,
    )
    model = Qwen3MoeForCausalLM(cfg).train()
    assert model.config._experts_implementation == experts_implementation
    return model, lambda x, y: model(input_ids=x, labels=y).loss


def timed_steps(model, loss_of, optimizer, batches) -> float:
    """Seconds per step over `batches`: forward with the loss, backward, clip, AdamW, zero_grad."""
    start = time.perf_counter()
    for x, y in batches:
        loss_of(x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) / len(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--hf-experts", choices=["eager", "grouped_mm", "both"], default="both")
    args = parser.parse_args()
    s = SHAPE
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, s["vocab"], (args.steps, s["batch"], s["seq"] + 1), generator=g)
    batches = [(r[:, :-1].contiguous(), r[:, 1:].contiguous()) for r in rows]
    hf_batches = [(x, torch.cat([x[:, :1], y], 1)[:, :-1]) for x, y in batches]  # transformers shifts labels
    impls = ["eager", "grouped_mm"] if args.hf_experts == "both" else [args.hf_experts]
    runs = {"pretrain": ours(), **{f"transformers ({i})": theirs(i) for i in impls}}
    counts = {name: sum(p.numel() for p in m.parameters()) for name, (m, _) in runs.items()}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-3) for name, (m, _) in runs.items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for name in names:  # warm-up: the first steps allocate the optimizer states
        timed_steps(*runs[name], optimizers[name], (hf_batches if name != "pretrain" else batches)[:1])
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            data = batches if name == "pretrain" else hf_batches
            times[name].append(timed_steps(*runs[name], optimizers[name], data))
    tokens = s["batch"] * s["seq"]
    print(f"shape {s}, threads {torch.get_num_threads()}, torch {torch.__version__}")
    print("parameters: " + ", ".join(f"{n} {c:,}" for n, c in counts.items()))
    ours_median = statistics.median(times["pretrain"])
    for name in names:
        med = statistics.median(times[name])
        print(
            f"{name:28s} median {med * 1e3:8.1f} ms/step ({tokens / med:8,.0f} tokens/s; "
            f"{min(times[name]) * 1e3:.1f} to {max(times[name]) * 1e3:.1f} ms)"
            + ("" if name == "pretrain" else f"  pretrain is {med / ours_median:.2f}x faster")
        )


if __name__ == "__main__":
    main()
