"""The attention kernels (pretrain.model.attention), one per kind of mask: on a causal problem every kernel
gives the same heads, and the kind of a mask picks its kernel."""

import pytest

torch = pytest.importorskip("torch")

from pretrain.model.attention import (  # noqa: E402
    eager_kernel,
    mask_kind,
    per_document_kernel,
    sdpa_kernel,
)


def test_each_mask_kind_names_its_mask():
    assert mask_kind(None) == "causal"
    assert mask_kind(((3, 5),)) == "lengths"
    assert mask_kind(torch.ones(1, 1, 4, 4, dtype=torch.bool)) == "dense"
    assert mask_kind(object()) == "block"  # FlexAttention's BlockMask (CUDA only)


@pytest.mark.parametrize("gqa", [False, True])
def test_every_kernel_gives_the_causal_heads(gqa):
    """One sequence of 8 tokens as one document, as a dense lower-triangular mask, and causal: the same
    (batch, heads, seq, head_dim) output from SDPA, the eager softmax and the per-document loop (fp32, CPU)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 8, 16, generator=g)
    k, v = (torch.randn(2, 2 if gqa else 4, 8, 16, generator=g) for _ in range(2))
    causal = sdpa_kernel(q, k, v, None, 0.0, gqa)
    tril = torch.ones(8, 8, dtype=torch.bool).tril().expand(2, 1, 8, 8)
    for other in (
        eager_kernel(q, k, v, None, 0.0, gqa),
        eager_kernel(q, k, v, tril, 0.0, gqa),
        sdpa_kernel(q, k, v, tril, 0.0, gqa),
        per_document_kernel(q, k, v, ((8,), (8,)), 0.0, gqa),
    ):
        assert other.shape == (2, 4, 8, 16)
        torch.testing.assert_close(other, causal, rtol=1e-5, atol=1e-6)
    # two documents of 5 and 3 tokens: the second's first token sees only itself, so its head is its value
    split = per_document_kernel(q, k, v, ((5, 3), (5, 3)), 0.0, gqa)
    value = v[:, :, 5].repeat_interleave(4 // v.shape[1], dim=1)
    torch.testing.assert_close(split[:, :, 5], value, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(split[:, :, :5], causal[:, :, :5], rtol=1e-5, atol=1e-6)
