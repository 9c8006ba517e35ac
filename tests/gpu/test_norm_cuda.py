"""RMSNorm on CUDA keeps for backward what the CUDA plan counts (pretrain.plan.kernels.fused_rms_norm): the fused
kernel's input (fp32 under autocast, which casts it up; pure bf16's own 16-bit input) and 1/rms, no fp32
normalised x (skips without a GPU)."""

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("dtype, autocast, kept", [(torch.float32, True, 4), (torch.bfloat16, False, 2)])
def test_the_fused_norm_keeps_what_the_cuda_plan_counts(dtype, autocast, kept):
    from pretrain.model.norm import RMSNorm
    from pretrain.plan.kernels import fused_rms_norm

    assert fused_rms_norm("cuda", torch.__version__)
    b, s, h = 2, 64, 256
    norm = RMSNorm(h, 1e-5).cuda().to(dtype)
    x = torch.randn(b, s, h, device="cuda", dtype=dtype, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
            y = norm(x)
    activations = {t.data_ptr(): t.numel() * t.element_size() for t in saved if t.data_ptr() != norm.weight.data_ptr()}
    # the plan's terms of one norm: its input in `kept` bytes, and 4 bytes of 1/rms per row
    assert sum(activations.values()) == kept * b * s * h + 4 * b * s
    y.float().sum().backward()
