"""The laws and shapes budget mode (pretrain.plan.budget_mode) chooses by: Chinchilla's fitted loss L(N, D)
and its compute-optimal N (Hoffmann et al. 2022's approach 3, as refitted by Besiroglu et al. 2024), and the
LLaMA-proportioned model of about N parameters (width a multiple of 128, head dimension 128, H / 128 layers,
SwiGLU 8H/3 rounded to 256, grouped key/value heads). Pure Python."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .params import count_params

if TYPE_CHECKING:
    from .params import ParamCounts

HEAD_DIM = 128
WIDTH_PER_LAYER = 128  # LLaMA-7B: 4096 / 32 layers; 13B: 5120 / 40
MULTIPLE_OF = 256  # LLaMA's intermediate-size rounding
GQA_KV_HEADS = 8
# Hoffmann et al. 2022's approach 3, L(N, D) = E + A / N^alpha + B / D^beta, with the coefficients of its
# replication (Besiroglu, Erdil, Barnett, You 2024, "Chinchilla Scaling: A replication attempt", table 1):
# the published ones (E 1.69, A 406.4, B 410.7, alpha 0.34, beta 0.28) came from a fit stopped before it
# converged and rounded; their optimum lay at ~1/3 of approaches 1-2's N_opt, so budget mode's 20-tokens-per-
# parameter row predicted a higher loss than its half-size row. The refit's optimum (N ~ C^0.513) agrees with
# approaches 1-2: ~20 tokens per parameter.
APPROACH_3 = dict(E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658)
# The widths llama_shape chooses from: multiples of 128 (of 512 from 1,024 on: heads divisible by 4, for grouped
# key/value heads and tensor parallelism).
WIDTHS = [*range(HEAD_DIM, 1024, HEAD_DIM), *range(1024, 64 * 1024 + 1, 512)]


FIT = "Hoffmann et al. 2022's approach 3, refitted by Besiroglu et al. 2024"


def fit_coefficients() -> str:
    """The fit's coefficients as the plan's texts quote them."""
    return ", ".join(f"{k} {v}" for k, v in APPROACH_3.items())


def loss_formula(n: float, d: float) -> str:
    """L(N, D) written out with its figures, for --explain."""
    k = APPROACH_3
    return f"{k['E']} + {k['A']} / {n:.4g}^{k['alpha']} + {k['B']} / {d:.4g}^{k['beta']} ({FIT})"


def chinchilla_loss(n: float, d: float) -> float:
    k = APPROACH_3
    return k["E"] + k["A"] / n ** k["alpha"] + k["B"] / d ** k["beta"]


def approach_3_optimum(compute: float) -> float:
    """The parameters minimising L(N, C / 6N): N = G (C/6)^(beta / (alpha + beta)), G = (alpha A / (beta B))^(1 /
    (alpha + beta)) (Hoffmann et al. 2022, equation 4); with the refit's coefficients within a few percent of
    approaches 1-2's N_opt."""
    k = APPROACH_3
    g = (k["alpha"] * k["A"] / (k["beta"] * k["B"])) ** (1 / (k["alpha"] + k["beta"]))
    return g * (compute / 6) ** (k["beta"] / (k["alpha"] + k["beta"]))


def llama_shape(n_target: float, vocab_size: int, max_seq_len: int) -> dict[str, Any]:
    """Model keys of a LLaMA-style shape with about `n_target` parameters (conventions in the module docstring)."""

    def params(h: int, layers: int) -> int:
        return shape_params(shape_keys(h, layers, vocab_size, max_seq_len)).total

    # The width whose LLaMA-proportioned model (H / 128 layers) is nearest in log size.
    h = min(WIDTHS, key=lambda w: abs(math.log(params(w, max(1, w // WIDTH_PER_LAYER)) / n_target)))
    # Then the layer count that lands nearest N.
    one = shape_params(shape_keys(h, 1, vocab_size, max_seq_len))
    outside = one.total - one.per_layer
    layers = max(1, round((n_target - outside) / one.per_layer))
    return shape_keys(h, layers, vocab_size, max_seq_len)


def shape_keys(h: int, layers: int, vocab_size: int, max_seq_len: int) -> dict[str, Any]:
    """The model keys of width `h` and `layers` layers by the conventions of the module docstring."""
    heads = h // HEAD_DIM
    return dict(
        family="llama",
        vocab_size=vocab_size,
        hidden_size=h,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=math.gcd(heads, GQA_KV_HEADS) if heads >= GQA_KV_HEADS else heads,
        head_dim=HEAD_DIM,
        intermediate_size=MULTIPLE_OF * math.ceil(8 * h / 3 / MULTIPLE_OF),
        max_seq_len=max_seq_len,
        tie_embeddings=False,
    )


def shape_params(keys: dict[str, Any]) -> ParamCounts:
    from ..config.schema import ResolvedModelConfig

    # shape_keys sets the derived keys (num_kv_heads, head_dim); every other key at its default: a dense LLaMA block
    return count_params(ResolvedModelConfig(**keys))
