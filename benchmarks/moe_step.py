"""Our Mixture-of-Experts training step against transformers' Qwen3MoeForCausalLM on the same tiny shape, and our
MoE layer against transformers' and torchtitan's MoE layers.

  python benchmarks/moe_step.py [--steps N] [--rounds R] [--hf-experts eager|grouped_mm|both]
  python benchmarks/moe_step.py --layer [--steps N] [--rounds R]

Both models: the same Qwen3-MoE shape (per-head QK-norm, E routed experts, top-k, normalised top-k weights,
no shared expert), fp32 on the CPU, the load-balancing loss in the loss (ours: Switch's aux loss; theirs:
output_router_logits with the same effective coefficient), then backward, gradient clipping at 1.0 and
torch's AdamW. transformers' experts run as `experts_implementation` says: "eager" is the loop over the
experts that hit tokens, "grouped_mm" (its default in transformers 5 where torch has the op) the grouped GEMM.
Rounds alternate A B A B (and which goes first) so that a busy machine slows both alike; medians compared.

--layer: one MoE feed-forward of the same shape (64 experts of width 48 at hidden 128, top-8, softmax scores,
normalised top-k weights, 4 x 128 tokens), forward and backward of the mean square of its output, in bf16 (the
dtype torchtitan's grouped experts run in whatever their parameters'): ours (model/moe.py, its balancing losses in
the loss), transformers' Qwen3MoeSparseMoeBlock (grouped_mm) and torchtitan's MoE (its grouped experts and local
token dispatcher, auxiliary-loss-free balancing). torchtitan is not a dependency of this project: the layer is
timed when it imports (`pip install --no-deps torchtitan spmd_types tyro einops torch_checkpointing triton`), and
the table says so when it does not.
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


def our_layer():
    block = ours()[0].blocks[1].mlp.to(torch.bfloat16)

    def loss_of(x):
        y = block(x)
        return y.float().square().mean() + block.router_loss

    return block, loss_of


def hf_layer():
    """transformers' Qwen3-MoE feed-forward of the same shape, its experts on the grouped GEMM."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    s = SHAPE
    cfg = Qwen3MoeConfig(
        hidden_size=s["hidden"],
        num_experts=s["experts"],
        num_experts_per_tok=s["top_k"],
        moe_intermediate_size=s["expert_width"],
        norm_topk_prob=True,
        experts_implementation="grouped_mm",
    )
    block = Qwen3MoeSparseMoeBlock(cfg).to(torch.bfloat16)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return block


def titan_layer():
    """torchtitan's MoE layer of the same shape, or None when torchtitan does not import."""
    try:
        from torchtitan.models.common.linear import Linear
        from torchtitan.models.common.moe import GroupedExperts, MoE, RoutedExperts, TokenChoiceTopKRouter
        from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher
    except ImportError:
        return None
    s = SHAPE
    cfg = MoE.Config(
        num_experts=s["experts"],
        routed_experts=RoutedExperts.Config(
            inner_experts=GroupedExperts.Config(
                dim=s["hidden"], hidden_dim=s["expert_width"], num_experts=s["experts"]
            ),
            token_dispatcher=LocalTokenDispatcher.Config(num_experts=s["experts"], top_k=s["top_k"]),
        ),
        router=TokenChoiceTopKRouter.Config(
            num_experts=s["experts"],
            gate=Linear.Config(in_features=s["hidden"], out_features=s["experts"]),
            top_k=s["top_k"],
            score_func="softmax",
            route_norm=True,
        ),
    )
    block = cfg.build().to(torch.bfloat16).train()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(std=0.02)
    return block, lambda x: block(x).float().square().mean()


def layers(steps: int, rounds: int) -> None:
    """The --layer table: one MoE feed-forward, forward and backward, each implementation's median."""
    s = SHAPE
    torch.manual_seed(0)
    runs = {"pretrain": our_layer()}
    hf_block = hf_layer()

    def hf_loss(x, block=hf_block):
        out = block(x)
        return (out[0] if isinstance(out, tuple) else out).float().square().mean()

    runs["transformers (grouped_mm)"] = (hf_block, hf_loss)
    titan = titan_layer()
    if titan is not None:
        runs["torchtitan"] = titan
    x = [torch.randn(s["batch"], s["seq"], s["hidden"], dtype=torch.bfloat16) for _ in range(steps)]
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds + 1):  # round 0 warms up
        for name in names if r % 2 == 0 else names[::-1]:
            block, loss_of = runs[name]
            start = time.perf_counter()
            for xi in x:
                loss_of(xi.requires_grad_(False)).backward()
                block.zero_grad(set_to_none=True)
            if r:
                times[name].append((time.perf_counter() - start) / steps)
    print(f"MoE layer, shape {s}, bf16, threads {torch.get_num_threads()}, torch {torch.__version__}")
    if titan is None:
        print("torchtitan: does not import here (not a dependency of this project): not timed")
    ours_median = statistics.median(times["pretrain"])
    for name in names:
        med = statistics.median(times[name])
        print(
            f"{name:28s} median {med * 1e3:8.2f} ms forward+backward ({min(times[name]) * 1e3:.2f} to "
            f"{max(times[name]) * 1e3:.2f} ms)"
            + ("" if name == "pretrain" else f"  pretrain is {med / ours_median:.2f}x faster")
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--hf-experts", choices=["eager", "grouped_mm", "both"], default="both")
    parser.add_argument("--layer", action="store_true", help="one MoE layer against transformers' and torchtitan's")
    args = parser.parse_args()
    if args.layer:
        layers(args.steps, args.rounds)
        return
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
