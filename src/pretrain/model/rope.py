"""Rotary frequencies, with `model.rope_scaling` applied (pretrain.rope_scaling names the types and keys).

The arithmetic is transformers' (modeling_rope_utils: the default, llama3 and yarn initialisers), step for
step in fp32, so an exported model computes the same angles under Hugging Face as here.
"""

from __future__ import annotations

import math

import torch


def inverse_frequencies(head_dim: int, theta: float, scaling: dict | None, device=None) -> tuple[torch.Tensor, float]:
    """(theta^(-2i/d) for i < d/2 with the scaling applied, fp32; the factor cos and sin are scaled by)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
    inv_freq = 1.0 / theta**exponents
    if scaling is None:
        return inv_freq, 1.0
    if scaling["rope_type"] == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    return _yarn(theta**exponents, head_dim, theta, scaling)


def _llama3(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1: long wavelengths (beyond original / low_freq_factor) slowed by `factor`, short ones (below
    original / high_freq_factor) kept, and the band between interpolated linearly in original / wavelength."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    original = s["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    smooth = (original / wavelength - low) / (high - low)  # 0 at the long end of the band, 1 at the short end
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    in_band = (wavelength >= original / high) & (wavelength <= original / low)
    return torch.where(in_band, blended, scaled)


def _yarn(powers: torch.Tensor, dim: int, theta: float, s: dict) -> tuple[torch.Tensor, float]:
    """YaRN: dimensions that turn more than beta_fast times over the original context keep their frequency
    (extrapolation), those that turn fewer than beta_slow times are divided by `factor` (interpolation), with
    a linear ramp between; cos and sin are scaled by the attention factor."""
    factor, original = s["factor"], s["original_max_position_embeddings"]
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def dimension_turning(rotations: float) -> float:
        """The dimension whose wavelength fits `rotations` times into the original context."""
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dimension_turning(beta_fast), dimension_turning(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1).to(powers.device)
    extrapolated = 1 - ramp  # the share of each dimension that keeps its original frequency
    inv_freq = 1.0 / (factor * powers) * (1 - extrapolated) + 1.0 / powers * extrapolated
    return inv_freq, _yarn_attention_factor(s)


def _yarn_attention_factor(s: dict) -> float:
    if s.get("attention_factor") is not None:
        return s["attention_factor"]

    def mscale(scale: float, weight: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * weight * math.log(scale) + 1.0

    factor = s["factor"]
    if s.get("mscale") and s.get("mscale_all_dim"):  # DeepSeek's ratio of two such scales
        return mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
    return mscale(factor)
