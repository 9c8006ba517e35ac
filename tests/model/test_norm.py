"""RMSNorm through `F.rms_norm` against the formula written out, on the CPU: the same values, the same
gradients, bit for bit, and the same tensors kept for backward (the planner's activation count relies on it)."""

import pytest

torch = pytest.importorskip("torch")

from pretrain.model.norm import RMSNorm  # noqa: E402

needs_rms_norm = pytest.mark.skipif(not hasattr(torch.nn.functional, "rms_norm"), reason="torch < 2.4")


def written_out(x, weight, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight).type_as(x)


def run(fn, x, weight):
    """Output, gradients for a fixed output gradient, and (shape, dtype) of every tensor kept for backward."""
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append((tuple(t.shape), t.dtype)) or t, lambda t: t):
        y = fn(x, weight)
    grads = torch.autograd.grad(
        y, (x, weight), torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=y.dtype)
    )
    return y, grads, sorted(kept, key=str)


@needs_rms_norm
@pytest.mark.parametrize("dtype, autocast", [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False)])
def test_rms_norm_is_the_formula_bit_for_bit(dtype, autocast):
    """fp32, fp32 residual under bf16 autocast (the mixed-precision run), pure bf16."""
    torch.manual_seed(0)
    norm = RMSNorm(64, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.mul_(torch.rand(64, dtype=dtype) + 0.5)
    x = torch.randn(3, 8, 64, dtype=dtype, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        fused = run(lambda x, w: norm(x), x, norm.weight)
        formula = run(lambda x, w: written_out(x, w, norm.eps), x, norm.weight)
    assert fused[0].dtype == dtype and torch.equal(fused[0], formula[0])
    assert all(torch.equal(a, b) for a, b in zip(fused[1], formula[1]))
    assert fused[2] == formula[2]


@needs_rms_norm
def test_a_bf16_input_under_an_fp32_weight_is_the_fallback_bit_for_bit_without_a_warning():
    """QK-norm under bf16 autocast (moe-debug's): torch's rms_norm warns on every call that it cannot fuse a
    bf16 input with an fp32 weight; the norm runs the formula its fallback runs, silently and bitwise the same."""
    import warnings

    torch.manual_seed(0)
    norm = RMSNorm(64, 1e-5)
    x = torch.randn(3, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        ours = run(lambda x, w: norm(x), x, norm.weight)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torchs = run(lambda x, w: torch.nn.functional.rms_norm(x, (64,), w, norm.eps), x, norm.weight)
    assert ours[0].dtype == torch.bfloat16 and torch.equal(ours[0], torchs[0])
    assert all(torch.equal(a, b) for a, b in zip(ours[1], torchs[1])) and ours[2] == torchs[2]
