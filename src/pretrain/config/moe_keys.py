"""The Mixture-of-Experts keys of `model:` checked on their own (config/checks.py's `validate` calls this; the
expert-parallel layout is checked there with the grid): each refusal names the key and what is allowed, so no
value is quietly replaced by another (a zero width by the dense one, shared experts dropped from a dense model).
"""

from __future__ import annotations

from ..errors import ConfigError
from .model_section import ModelConfig


def check_moe_keys(m: ModelConfig) -> None:
    """model.num_experts, its experts' width and count, the dense first blocks and the router's coefficients."""
    if m.num_experts < 0:
        raise ConfigError(f"model.num_experts: must be >= 0 (0 = a dense model), got {m.num_experts}")
    if m.num_shared_experts < 0:
        raise ConfigError(
            f"model.num_shared_experts: must be >= 0 (0 = none; DeepSeek-V3: 1), got {m.num_shared_experts}"
        )
    if m.num_shared_experts and not m.num_experts:
        raise ConfigError(
            f"model.num_shared_experts: {m.num_shared_experts}, and model.num_experts is 0 (a dense model): "
            "shared experts sit beside routed ones; set model.num_experts, or widen the dense MLP with "
            "model.intermediate_size"
        )
    if m.moe_intermediate_size is not None and m.moe_intermediate_size < 1:
        raise ConfigError(
            f"model.moe_intermediate_size: must be > 0, got {m.moe_intermediate_size}; leave it unset for "
            "experts as wide as model.intermediate_size"
        )
    if m.first_dense_layers < 0:
        raise ConfigError(f"model.first_dense_layers: must be >= 0, got {m.first_dense_layers}")
    if m.num_experts and m.first_dense_layers >= m.num_layers:
        raise ConfigError(
            f"model.first_dense_layers: {m.first_dense_layers} is not below model.num_layers {m.num_layers}, "
            f"so no block is left for the experts; use at most {m.num_layers - 1}, or model.num_experts=0 "
            "for a dense model"
        )
    _check_expert_groups(m)
    if m.mtp_layers < 0:
        raise ConfigError(f"model.mtp_layers: must be >= 0 (0 = none; DeepSeek-V3: 1), got {m.mtp_layers}")
    for name in ("router_aux_loss_coef", "router_z_loss_coef", "router_bias_update_rate"):
        value = getattr(m, name)
        if value < 0:  # a negative weight or rate rewards the imbalance it is meant to remove
            raise ConfigError(
                f"model.{name}: must be >= 0 (0 = off), got {value}; a negative value rewards the experts' imbalance"
            )


def _check_expert_groups(m: ModelConfig) -> None:
    """Group-limited routing: G equal groups of the experts, a token's k experts among its M best groups."""
    groups, per_token = m.expert_groups, m.expert_groups_per_token
    if groups < 1 or (m.num_experts and m.num_experts % groups):
        raise ConfigError(
            f"model.expert_groups: {groups} does not split model.num_experts {m.num_experts} into equal groups; "
            "use a divisor of it (1 = no group limit; DeepSeek-V3: 8)"
        )
    if not 1 <= per_token <= groups:
        raise ConfigError(
            f"model.expert_groups_per_token: {per_token} is not between 1 and model.expert_groups {groups} "
            "(DeepSeek-V3: 4 of 8)"
        )
    if m.num_experts and m.experts_per_token > per_token * (m.num_experts // groups):
        raise ConfigError(
            f"model.expert_groups_per_token: {per_token} groups of {m.num_experts // groups} experts hold fewer "
            f"than model.experts_per_token {m.experts_per_token}; allow more groups per token"
        )
