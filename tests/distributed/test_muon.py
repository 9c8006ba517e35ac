"""Muon (distributed/muon.py) against torch.optim.Muon and torch.optim.AdamW, in one process: the same update bit
for bit where torch's applies (whole 2-D matrices, each part of a fused one), per expert on stacked experts, and
refused on a torch without it."""

import pytest

torch = pytest.importorskip("torch")

from pretrain.distributed.muon import NS_COEFFICIENTS, NS_EPS, Muon, newton_schulz, require_muon  # noqa: E402
from pretrain.errors import ConfigError  # noqa: E402

needs_torch_muon = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon: torch >= 2.9")


@needs_torch_muon
@pytest.mark.parametrize("shape", [(16, 48), (48, 16), (32, 32)])
def test_newton_schulz_is_torchs_on_a_matrix(shape):
    from torch.optim._muon import _zeropower_via_newtonschulz

    g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    expected = _zeropower_via_newtonschulz(g, NS_COEFFICIENTS, 5, NS_EPS)
    assert torch.equal(newton_schulz(g.bfloat16(), 5), expected)


def test_stacked_experts_are_orthogonalised_one_by_one():
    # [E, A, B]: each expert's matrix on its own (batched), not the [E x A, B] matrix they would flatten to.
    x = torch.randn(4, 24, 40, generator=torch.Generator().manual_seed(1)).bfloat16()
    batched = newton_schulz(x, 5)
    for e in range(4):
        torch.testing.assert_close(batched[e], newton_schulz(x[e], 5))
    flattened = newton_schulz(x.reshape(96, 40), 5).reshape(4, 24, 40)
    assert (batched.float() - flattened.float()).abs().max() > 0.1
    # Each expert's rows nearly orthonormal (the quintic leaves singular values in about [0.7, 1.2]).
    s = torch.linalg.svdvals(batched.float())
    assert s.min() > 0.5 and s.max() < 1.3


def _steps(optimizer, params, grads):
    for g in grads:
        for p, gp in zip(params, g):
            p.grad = gp.clone()
        optimizer.step()


@needs_torch_muon
@pytest.mark.parametrize("adjust", ["match_rms_adamw", "original"])
def test_matrices_and_the_rest_step_as_torchs_muon_and_adamw(adjust):
    gen = torch.Generator().manual_seed(2)
    shapes = [(16, 48), (48, 16), (48,)]  # two matrices (wide, tall) for Muon, a vector for AdamW
    init = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(3)]
    ours = [torch.nn.Parameter(x.clone()) for x in init]
    theirs = [torch.nn.Parameter(x.clone()) for x in init]
    muon = Muon(
        [
            {"params": ours[:2], "muon": True, "row_parts": None},
            {"params": ours[2:], "muon": False, "weight_decay": 0.0},
        ],
        lr=0.02,
        weight_decay=0.1,
        lr_adjust=adjust,
        adamw_lr_ratio=0.5,
        fused=True,
    )
    _steps(muon, ours, grads)
    torch_muon = torch.optim.Muon(theirs[:2], lr=0.02, weight_decay=0.1, adjust_lr_fn=adjust)
    adamw = torch.optim.AdamW(theirs[2:], lr=0.01, betas=(0.9, 0.95), weight_decay=0.0, fused=True)
    for g in grads:
        for p, gp in zip(theirs, g):
            p.grad = gp.clone()
        torch_muon.step()
        adamw.step()
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
    assert set(muon.state[ours[0]]) == {"momentum_buffer"}  # one state per matrix
    assert set(muon.state[ours[2]]) == {"step", "exp_avg", "exp_avg_sq"}  # AdamW's


@needs_torch_muon
def test_a_fused_tensor_steps_as_its_parts_apart():
    # q, k, v stacked in one [q + 2 kv, H] tensor (model/transformer.py's qkv): each part orthogonalised, and its
    # lr scaled, as torch.optim.Muon does three separate matrices.
    gen = torch.Generator().manual_seed(3)
    parts = [32, 8, 8]
    init = torch.randn(sum(parts), 24, generator=gen)
    grads = [torch.randn(sum(parts), 24, generator=gen) for _ in range(3)]
    fused = torch.nn.Parameter(init.clone())
    muon = Muon([{"params": [fused], "row_parts": parts}], lr=0.01, weight_decay=0.1)
    _steps(muon, [fused], [[g] for g in grads])
    separate = [torch.nn.Parameter(x.clone()) for x in init.split(parts)]
    reference = torch.optim.Muon(separate, lr=0.01, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    _steps(reference, separate, [g.split(parts) for g in grads])
    assert torch.equal(fused.detach(), torch.cat([p.detach() for p in separate]))


def test_an_older_torch_is_refused_in_one_line():
    refusal = r"^train.optimizer: muon needs torch >= 2.9 .*2\.8\.1.*train.optimizer=adamw"
    with pytest.raises(ConfigError, match=refusal):
        require_muon("2.8.1+cu128")
    require_muon("2.9.0")
