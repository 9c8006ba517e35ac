"""The routed MoE feed-forward (pretrain.model.moe) on the tiny moe-debug model: the grouped GEMM and the
per-expert loop agree, routing follows the keys, the balancing terms are what their formulas say."""

import pytest

torch = pytest.importorskip("torch")

from pretrain.config import load_config  # noqa: E402
from pretrain.model import build_model  # noqa: E402
from pretrain.model.moe import MoE, end_step, moe_layers  # noqa: E402


def model(*overrides, grouped=None):
    m = build_model(load_config(None, ["model.preset=moe-debug", *overrides]).model, seed=3)
    for layer in moe_layers(m):
        layer.experts.grouped = grouped
    return m


def tokens(seed=0, batch=3, seq=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (batch, seq), generator=g), torch.randint(0, 512, (batch, seq), generator=g)


def loss_and_grads(m):
    x, y = tokens()
    loss = m(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}


def test_blocks_before_first_dense_layers_keep_the_dense_mlp():
    m = model("model.num_shared_experts=1")
    assert not isinstance(m.blocks[0].mlp, MoE) and isinstance(m.blocks[1].mlp, MoE)
    moe = m.blocks[1].mlp
    assert moe.experts.up.shape == (8, 64, 64) and moe.experts.down.shape == (8, 64, 32)  # [E, ...]
    assert moe.shared.up.weight.shape == (64, 64)  # one shared expert of width 32: gate and up


@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
def test_grouped_gemm_and_loop_agree_bitwise_in_fp32(router):
    """torch._grouped_mm and one matmul per expert: the same loss and gradients, bitwise on the CPU."""
    grouped, loop = model(f"model.router={router}", grouped=None), model(f"model.router={router}", grouped=False)
    assert moe_layers(grouped)[0].experts.uses_grouped_mm(torch.zeros(1, dtype=torch.float32))
    (la, ga), (lb, gb) = loss_and_grads(grouped), loss_and_grads(loop)
    assert torch.equal(la, lb)
    for name in ga:
        assert torch.equal(ga[name], gb[name]), name
    assert ga["blocks.1.mlp.experts.up"].abs().sum() > 0


def test_grouped_gemm_and_loop_agree_in_bf16():
    grouped, loop = model(grouped=None), model(grouped=False)
    x, _ = tokens()
    with torch.autocast("cpu", torch.bfloat16):
        a, b = grouped(x), loop(x)
    torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)


def test_routing_matches_its_definition():
    """Each token's output is the score-weighted sum of its top-k experts' SwiGLUs plus the shared expert,
    computed here token by token from the weights."""
    m = model("model.norm_topk_prob=false", "model.num_shared_experts=1")
    moe = m.blocks[1].mlp
    moe.expert_bias.copy_(torch.linspace(-0.05, 0.05, 8))  # the bias changes the choice, not the weights
    x = torch.randn(5, 64)
    with torch.no_grad():
        out = moe(x)
        scores = moe.router(x).softmax(-1)
        for t in range(5):
            want = moe.shared(x[t])
            for e in (scores[t] + moe.expert_bias).topk(2).indices:
                gate, up = (moe.experts.up[e] @ x[t]).chunk(2)
                want = want + scores[t, e] * (moe.experts.down[e] @ (torch.nn.functional.silu(gate) * up))
            torch.testing.assert_close(out[t], want, rtol=1e-5, atol=1e-6)


def test_route_gives_each_experts_pairs_as_one_slice_in_token_order():
    """MoE.route's contract (PairsByExpert): the pairs sorted by expert, stably, counts[e] of them expert e's,
    each with its token's score as weight; the layer's output is what its pairs make."""
    moe = model("model.norm_topk_prob=false").blocks[1].mlp
    x = torch.randn(7, 64)
    with torch.no_grad():
        pairs = moe.route(x)
        chosen = (moe.router(x).softmax(-1) + moe.expert_bias).topk(2).indices
    expected = sorted((int(e), t) for t in range(7) for e in chosen[t])  # by expert, then token
    starts = [0, *pairs.counts.cumsum(0).tolist()]
    got = [(e, int(t)) for e in range(8) for t in pairs.token[starts[e] : starts[e + 1]]]
    assert got == expected and pairs.counts.sum() == 14
    for (e, t), w in zip(got, pairs.weight[:, 0]):
        assert w == pairs.scores[t, e]  # norm_topk_prob off: the score itself


def test_another_rule_of_choice_plugs_in_at_choose():
    """The seam a group-limited router takes: `choose` picks each token's experts, route and the experts do
    the rest. Here every token goes to experts 0 and 1: the others get no pair and no gradient."""

    class FirstTwo(MoE):
        def choose(self, scores):
            return torch.arange(2).expand(scores.shape[0], 2)

    moe = model().blocks[1].mlp
    moe.__class__ = FirstTwo
    x = torch.randn(5, 64)
    assert moe.route(x).counts.tolist() == [5, 5, 0, 0, 0, 0, 0, 0]
    moe(x).sum().backward()
    grads = moe.experts.up.grad.flatten(1).abs().sum(1)
    assert (grads[:2] > 0).all() and (grads[2:] == 0).all()


def test_expert_parallelism_refuses_rows_that_are_not_routes_pairs():
    """ShardedExperts (distributed/expert_parallel.py) takes the layer's PairsByExpert and as many rows as its
    counts; anything else stops at its assertion, before any all-to-all. One real gloo rank."""
    import torch.distributed as dist

    from pretrain.distributed.expert_parallel import ShardedExperts

    moe = model().blocks[1].mlp
    x = torch.randn(6, 64)
    pairs = moe.route(x)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        sharded = ShardedExperts(moe.experts, dist.group.WORLD, rank=0, size=1)
        rows = x[pairs.token]
        torch.testing.assert_close(sharded(rows, pairs), moe.experts(rows, pairs))  # one rank: the same experts
        with pytest.raises(AssertionError, match="pairs by expert"):
            sharded(rows, (pairs.token, pairs.counts))
        with pytest.raises(AssertionError, match="11 rows for 12 routed pairs"):
            sharded(rows[:-1], pairs)
    finally:
        dist.destroy_process_group()


def test_balancing_losses_and_bias_update():
    m = model("model.router_aux_loss_coef=0.1", "model.router_z_loss_coef=0.01", "model.router_bias_update_rate=0.5")
    m.train()
    x, y = tokens()
    total = m(x, y)
    moe = m.blocks[1].mlp
    assert total.item() > m.lm_loss.item()
    counts = moe.step_sums[:8].clone()
    assert counts.sum() == x.numel() * 2  # top-2, dropless: every token twice
    metrics = end_step(m, micro_batches=1)
    assert "moe/dropped_fraction" not in metrics  # dropless: a constant 0 is no metric (issue 43)
    assert metrics["moe/load_max_over_mean"] == pytest.approx((counts.max() / counts.mean()).item())
    torch.testing.assert_close(
        total - m.lm_loss, torch.tensor(0.1 * metrics["moe/aux_loss"] + 0.01 * metrics["moe/z_loss"]), rtol=1e-5, atol=0
    )
    # Overloaded experts' biases go down, underloaded ones' up, by exactly the rate.
    want = 0.5 * torch.sign(counts.mean() - counts)
    assert torch.equal(moe.expert_bias, want)
    assert moe.step_sums is None


@pytest.mark.parametrize("early_stop", [True, False])
def test_full_recomputation_counts_each_micro_batch_once(early_stop):
    """A checkpointed block runs its MoE layer again in backward (to its last saved tensor, or, without early
    stop, whole): the same loss and gradients, and the step's expert counts and balancing losses counted once,
    as without recomputation."""
    from torch.utils.checkpoint import set_checkpoint_early_stop

    from pretrain.distributed.recompute import apply_activation_checkpointing

    rate = "model.router_bias_update_rate=0.5"
    plain, recomputed = model(rate), apply_activation_checkpointing(model(rate), "full")
    loss_a, grads_a = loss_and_grads(plain)
    with set_checkpoint_early_stop(early_stop):
        loss_b, grads_b = loss_and_grads(recomputed)
    assert torch.equal(loss_a, loss_b)
    assert all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)
    assert torch.equal(plain.blocks[1].mlp.step_sums, recomputed.blocks[1].mlp.step_sums)
    assert recomputed.blocks[1].mlp.router_loss is None  # the recomputation keeps no loss graph
    assert end_step(plain, 1) == end_step(recomputed, 1)
    assert torch.equal(plain.blocks[1].mlp.expert_bias, recomputed.blocks[1].mlp.expert_bias)


def test_expert_counts_are_bincounts():
    from pretrain.model.moe import expert_counts

    experts = torch.randint(0, 8, (1000,), generator=torch.Generator().manual_seed(0))
    counts = expert_counts(experts, 8)
    assert counts.dtype == torch.int64 and torch.equal(counts, torch.bincount(experts, minlength=8))
    assert torch.equal(expert_counts(torch.tensor([7, 7]), 8), torch.tensor([0] * 7 + [2]))  # empty experts: 0


def test_the_moe_layer_reads_nothing_back_from_the_device():
    """Under FakeTensorMode every tensor is a shape without values: an op that must read values on the host
    (.item(), .tolist(), torch.bincount, nonzero, repeat_interleave without output_size: each a host sync on
    CUDA) raises there. The routed layer's forward and backward, on the grouped GEMM as on a GPU, run through."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode

    cfg = load_config(None, ["model.preset=moe-debug"]).model
    with FakeTensorMode():
        layer = MoE(cfg).train()
        x = torch.randn(2, 16, cfg.hidden_size, requires_grad=True)
        with torch.autocast("cpu", torch.bfloat16):  # bf16-mixed: the grouped GEMM's kernel, as on a GPU
            assert layer.experts.uses_grouped_mm(x.bfloat16())
            y = layer(x)
        (y.float().sum() + layer.router_loss).backward()
        assert y.shape == x.shape and layer.experts.up.grad is not None
        # what the check catches: the counts as they were, and any value read back
        with pytest.raises(DynamicOutputShapeException):
            torch.bincount(x.flatten().long(), minlength=8)
        with pytest.raises(DataDependentOutputException):
            x.sum().item()


def test_the_grouped_gemm_serves_experts_on_hopper_only():
    """Blackwell's grouped GEMM gives experts without tokens non-zero gradients (pytorch#172439): the loop there."""
    from pretrain.model.moe import grouped_mm_on_cuda

    assert grouped_mm_on_cuda((9, 0), torch.bfloat16)
    assert not grouped_mm_on_cuda((10, 0), torch.bfloat16) and not grouped_mm_on_cuda((12, 0), torch.bfloat16)
    assert not grouped_mm_on_cuda((8, 0), torch.bfloat16) and not grouped_mm_on_cuda((9, 0), torch.float32)
