"""Optimizers as large-model pretraining uses them.

AdamW (Loshchilov & Hutter) with beta1 0.9, beta2 0.95, eps 1e-8 and decoupled weight decay 0.1 on matrices
only: norms, biases and a tied embedding (which is also the output layer) are not decayed, as in GPT-3,
LLaMA and nanoGPT. The fused kernel is used where PyTorch has one (CUDA, and CPU since 2.4): no per-tensor
temporaries, so the optimizer step needs no memory beyond its states. Adafactor (factored second moments,
no momentum) and SGD with momentum are there for the memory they save; the planner knows both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..plan.muon import is_muon_matrix, row_parts
from ..plan.optimizer_groups import optimizer_groups
from ..plan.params import param_shapes

if TYPE_CHECKING:
    from ..config.job_sections import TrainConfig
    from ..config.schema import ResolvedModelConfig


def param_groups(
    model: torch.nn.Module, model_cfg: ResolvedModelConfig, weight_decay: float, optimizer: str = "adamw"
) -> list[dict]:
    """[decayed matrices, undecayed rest] (muon: its matrices by kind of row blocks first, each group saying
    `muon` and `row_parts`), in the planner's order (it predicts ZeRO-1's partition). A pipeline stage holds some
    of the model's parameters, under their whole-model names: the groups of those."""
    named = dict(model.named_parameters())
    shapes = [(name, shape) for name, shape in param_shapes(model_cfg) if name in named]
    groups = optimizer_groups(optimizer, model_cfg, shapes)
    out = []
    for indices in groups:
        name, shape = shapes[indices[0]]
        matrices = is_muon_matrix(name, shape)
        decayed = len(shape) >= 2 and not (model_cfg.tie_embeddings and name == "embed.weight")
        kind: dict[str, Any] = {"weight_decay": weight_decay if decayed else 0.0}
        if optimizer == "muon":
            kind.update(muon=matrices, row_parts=row_parts(name, shape, model_cfg) if matrices else None)
        params = [named[shapes[i][0]] for i in indices]
        # One group per kind of tensor: a fused or foreach step takes plain tensors or DTensors of one mesh, and
        # an MoE layer beside tensor parallelism holds plain ones (expert_parallel.py) among the DTensors.
        kinds: dict = {}
        for p in params:
            kinds.setdefault(getattr(p, "device_mesh", None), []).append(p)
        out += [{"params": ps, **kind} for ps in kinds.values()]
    return out


def optimizer_class(train_cfg: TrainConfig, device: torch.device) -> tuple[type, dict]:
    """(torch optimizer class, its keyword arguments) for `train.optimizer`: one rule for every data-parallel
    engine (ZeroRedundancyOptimizer builds its local optimizer from it too)."""
    if train_cfg.optimizer == "adamw":
        return torch.optim.AdamW, dict(
            lr=train_cfg.lr, betas=tuple(train_cfg.betas), eps=train_cfg.eps, fused=device.type in ("cuda", "cpu")
        )
    if train_cfg.optimizer == "adafactor":
        return torch.optim.Adafactor, dict(lr=train_cfg.lr)
    if train_cfg.optimizer == "muon":
        from .muon import Muon, require_muon

        require_muon(torch.__version__)
        return Muon, dict(
            lr=train_cfg.lr,
            momentum=train_cfg.muon_momentum,
            ns_steps=train_cfg.muon_ns_steps,
            lr_adjust=train_cfg.muon_lr_adjust,
            betas=tuple(train_cfg.betas),
            eps=train_cfg.eps,
            adamw_lr_ratio=(train_cfg.adamw_lr or train_cfg.lr) / train_cfg.lr,
            fused=device.type in ("cuda", "cpu"),
        )
    return torch.optim.SGD, dict(lr=train_cfg.lr, momentum=train_cfg.momentum)


def build_optimizer(
    model: torch.nn.Module, model_cfg: ResolvedModelConfig, train_cfg: TrainConfig
) -> torch.optim.Optimizer:
    cls, kwargs = optimizer_class(train_cfg, next(model.parameters()).device)
    return cls(param_groups(model, model_cfg, train_cfg.weight_decay, train_cfg.optimizer), **kwargs)
