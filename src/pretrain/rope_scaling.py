"""`model.rope_scaling`: rotary positions stretched for a context longer than the one a model was pretrained
at, as Hugging Face writes it (config.json's `rope_scaling`, transformers 5's `rope_parameters`):

  llama3  Llama 3.1 (Meta 2024): frequencies whose wavelength exceeds original_max_position_embeddings /
          low_freq_factor are divided by `factor`, those shorter than original / high_freq_factor kept, and
          the band between blended smoothly.
          keys: factor, low_freq_factor, high_freq_factor, original_max_position_embeddings
  yarn    YaRN (Peng et al. 2023, arXiv 2309.00071): the same idea with the band chosen by the rotations a
          dimension makes over the original context (beta_fast, beta_slow: 32 and 1 unless given), and cos and
          sin scaled by an attention factor (0.1 ln(factor) + 1 unless given, DeepSeek's mscale ratio with
          mscale and mscale_all_dim).
          keys: factor, original_max_position_embeddings; optional beta_fast, beta_slow, attention_factor,
          mscale, mscale_all_dim, truncate

Checked here without torch (the config and the planner read it); model/rope.py computes the frequencies.
"""

from __future__ import annotations

import math
from typing import Any, cast

from .errors import ConfigError

# rope_type -> (required keys, optional keys), the names transformers' modeling_rope_utils reads
KEYS = {
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), ()),
    "yarn": (
        ("factor", "original_max_position_embeddings"),
        ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate"),
    ),
}
EXAMPLE = (
    "{rope_type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192}"
)


def checked_rope_scaling(value: object, where: str = "model.rope_scaling") -> dict[str, Any] | None:
    """The mapping with `rope_type` named first and each value of its type, or None for no scaling (null, or
    Hugging Face's rope_type default). ConfigError, naming the key, for anything transformers would compute
    otherwise or refuse."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping like {EXAMPLE}, got {value!r}")
    given = dict(cast(dict[str, Any], value))
    kind = given.pop("rope_type", given.pop("type", None))  # `type`: the name transformers before 4.45 wrote
    given.pop("type", None)
    if kind == "default" and not given:
        return None
    if kind not in KEYS:
        raise ConfigError(
            f"{where}: rope_type {kind!r} is not built; choose one of {' | '.join(KEYS)} (or null "
            f"for unscaled RoPE), e.g. {EXAMPLE}"
        )
    required, optional = KEYS[kind]
    for key in given:
        if key not in required + optional:
            fix = (
                "set model.rope_theta instead"
                if key == "rope_theta"
                else f"a {kind} mapping has {', '.join(required + optional)}"
            )
            raise ConfigError(f"{where}: unknown key {key!r} for rope_type {kind}; {fix}")
    missing = [key for key in required if given.get(key) is None]
    if missing:
        raise ConfigError(f"{where}: rope_type {kind} needs {', '.join(missing)}; e.g. {EXAMPLE}")
    out: dict[str, Any] = {"rope_type": kind}
    for key in required + optional:
        if given.get(key) is not None:
            out[key] = _typed(f"{where}.{key}", key, given[key])
    if out["factor"] < 1:
        raise ConfigError(
            f"{where}.factor: {out['factor']} shrinks the context; give the extension, >= 1 (Llama 3.1: 8)"
        )
    if kind == "llama3" and not 0 < out["low_freq_factor"] < out["high_freq_factor"]:
        raise ConfigError(
            f"{where}: needs 0 < low_freq_factor < high_freq_factor, got {out['low_freq_factor']} "
            f"and {out['high_freq_factor']} (Llama 3.1: 1 and 4)"
        )
    if out.get("beta_fast", 32) < out.get("beta_slow", 1):
        raise ConfigError(
            f"{where}: beta_fast {out.get('beta_fast', 32)} is below beta_slow "
            f"{out.get('beta_slow', 1)}; beta_fast bounds the fast-rotating dimensions (default 32, "
            "beta_slow 1)"
        )
    return out


def _typed(name: str, key: str, value: object) -> bool | int | float:
    if key == "truncate":
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: expected true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name}: expected a finite number, got {value!r}")
    if key == "original_max_position_embeddings":
        if value != int(value) or value < 1:
            raise ConfigError(f"{name}: expected a positive whole number of positions, got {value!r}")
        return int(value)
    if value <= 0:
        raise ConfigError(f"{name}: must be > 0, got {value!r}")
    return float(value)
