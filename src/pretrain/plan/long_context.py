"""The long-context lines of the planner's advice (docs/advice.md: context, rope), read off the config alone:
  context  windows of >= 32K tokens without train.document_masking (Llama 3 masks attention to each document)
  rope     RoPE's slowest wavelength shorter than the window, or the window beyond what model.rope_scaling's
           YaRN stretches RoPE to
Its own module because two places print them: `pretrain plan`'s advice (pretrain.plan.advice) and `--fit`
under its table (pretrain.plan.fit), which plans no single layout to advise on.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig

# Windows from this length on are long context: Llama 3 trained at 8K, then extended to 128K in stages (sec. 3.4.2)
LONG_CONTEXT = 32_768


def context_advice(c: ResolvedConfig) -> list[str]:
    """The long-context lines: `pretrain plan` prints them among the advice and `--fit` under its table."""
    m, s = c.model, c.train.seq_len
    lines: list[str] = []
    if s >= LONG_CONTEXT and not c.train.document_masking:
        lines.append(
            f"context: windows of {s:,} tokens pack many documents, and every token attends across their "
            "boundaries to unrelated text; Llama 3 masks attention to each document and found it important "
            "for training on very long sequences (Dubey et al. 2024, sec. 3.2): mask documents "
            "(train.document_masking)"
        )
    if m.family != "llama":
        return lines
    scaling = m.rope_scaling or {}
    factor = scaling.get("factor", 1.0)
    # The slowest rotary dimension, theta^(-(d-2)/d), turns once per this many positions; the scaling slows it
    # by its factor (llama3 and yarn both divide the lowest frequencies by it).
    wavelength = 2 * math.pi * m.rope_theta ** ((m.head_dim - 2) / m.head_dim) * factor
    if wavelength < s:
        lines.append(
            f"rope: RoPE's slowest dimension turns once every {wavelength:,.0f} tokens (2 pi x rope_theta "
            f"{m.rope_theta:g}^((d-2)/d){f' x factor {factor:g}' if scaling else ''}), fewer than the "
            f"{s:,} of a window: distant positions alias; raise model.rope_theta (Llama 3: 500000, Xiong "
            "et al. 2023 raise it for long context) or set model.rope_scaling"
        )
    # YaRN's factor is the extension itself (transformers warns when it is not max_position_embeddings over the
    # original); Llama 3.1's is not (factor 8 of 8K, trained to 128K).
    stretched = factor * scaling.get("original_max_position_embeddings", 0)
    if scaling.get("rope_type") == "yarn" and s > stretched:
        lines.append(
            f"rope: train.seq_len {s:,} is beyond the {stretched:,.0f} positions YaRN stretches RoPE to "
            f"(factor {factor:g} x original_max_position_embeddings "
            f"{scaling['original_max_position_embeddings']:,}); raise its factor or shorten the windows"
        )
    return lines
