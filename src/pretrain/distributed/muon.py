"""Muon for the blocks' matrices and AdamW for the rest, as one optimizer (`train.optimizer: muon`).

Muon (Keller Jordan 2024, "Muon: An optimizer for hidden layers in neural networks"; Liu et al. 2025, "Muon
is Scalable for LLM Training", arXiv 2502.16982, "Moonlight"), per matrix W of gradient G, torch.optim.Muon's
update written out:
    M <- mu M + (1 - mu) G,     U <- (1 - mu) G + mu M              (momentum 0.95, Nesterov)
    O <- Newton-Schulz(U)                                           (5 quintic steps in bf16: ~ U's U V^T)
    W <- W (1 - lr wd) - lr s O,  s = 0.2 sqrt(max(A, B))  (match_rms_adamw: Moonlight's update-RMS matching)
                                      or sqrt(max(1, A / B))      (original: Keller Jordan's)
A fused tensor is orthogonalised part by part, each part with its own s: q, k and v of `attn.qkv`, gate and up
of a SwiGLU input; the routed experts' [E, A, B] tensors expert by expert, batched, never as one flattened
matrix (pretrain.plan.muon.row_parts says which rows go together). torch.optim.Muon takes 2-D parameters
only and orthogonalises each whole: the same arithmetic is here, batched and split (tests/distributed/
test_muon.py holds both to torch's bit for bit on a plain matrix). The rest of the model (embedding, output
layer, norms, biases, routers) takes torch's fused AdamW at train.adamw_lr (train.lr by default), on the same
schedule. A matrix that a layout shards is orthogonalised whole: muon_exchange.py.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.adamw import adamw

from ..errors import ConfigError
from ..plan.kernels import torch_version_tuple
from .muon_exchange import Matrix, orthogonalise_all

if TYPE_CHECKING:
    from collections.abc import Iterable

MUON_TORCH = (2, 9)  # torch.optim.Muon, whose update this is, arrived in 2.9
# The quintic's coefficients (a, b, c), chosen by Keller Jordan to maximise the slope at zero
# (torch.optim.Muon's defaults), and the norm's floor.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7


def require_muon(version: str) -> None:
    """Refuse train.optimizer=muon on a torch without torch.optim.Muon's update (one line, exit 2)."""
    have = torch_version_tuple(version)
    if have is not None and have < MUON_TORCH:
        raise ConfigError(
            f"train.optimizer: muon needs torch >= {MUON_TORCH[0]}.{MUON_TORCH[1]} (torch.optim.Muon), this is "
            f"{version}; upgrade torch or use train.optimizer=adamw"
        )


def newton_schulz(update: torch.Tensor, steps: int) -> torch.Tensor:
    """The update orthogonalised, matrix by matrix over any leading batch dimension ([A, B] or [E, A, B]): Keller
    Jordan's quintic Newton-Schulz iteration on X = U / ||U||_F in bf16, each step X <- a X + (b S + c S^2) X with
    S = X X^T, on the wide orientation (A <= B). It leaves ~ U V^T with singular values in about [0.7, 1.2]. The
    operations of torch.optim.Muon's, in its order, so one matrix gives the same bits."""
    a, b, c = NS_COEFFICIENTS
    x = update.to(torch.bfloat16, copy=True)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    norm = x.norm() if x.dim() == 2 else x.norm(dim=(-2, -1), keepdim=True)
    x.div_(norm.clamp(min=NS_EPS))
    addmm = torch.addmm if x.dim() == 2 else torch.baddbmm
    for _ in range(steps):
        gram = x @ x.mT
        x = addmm(x, addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def lr_scale(rows: int, cols: int, adjust: str) -> float:
    """s, the factor on lr of one matrix's orthogonalised update (torch.optim.Muon's adjust_lr_fn): Moonlight's
    0.2 sqrt(max(A, B)) gives the update AdamW's RMS of ~0.2, so AdamW's lr and weight decay carry over;
    Keller Jordan's sqrt(max(1, A / B)) keeps the update's spectral norm ~ lr whatever the shape."""
    if adjust == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1.0, rows / cols))


class Muon(torch.optim.Optimizer):
    """Muon on the groups with `muon` true (each with its `row_parts`: the rows orthogonalised apart, or None for
    whole matrices), torch's fused AdamW on the others at lr x `adamw_lr_ratio`. States: `momentum_buffer` per
    matrix; `exp_avg`, `exp_avg_sq` and `step` per AdamW tensor, as torch.optim.AdamW keeps them (so checkpoints
    reshard as AdamW's do). `muon` and `row_parts` are also defaults, for ZeroRedundancyOptimizer, which
    passes a group's keys to the constructor of its local optimizer."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        lr_adjust: str = "match_rms_adamw",
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        adamw_lr_ratio: float = 1.0,
        fused: bool | None = None,
        muon: bool = True,
        row_parts: list[int] | None = None,
    ):
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            lr_adjust=lr_adjust,
            betas=betas,
            eps=eps,
            muon=muon,
            row_parts=row_parts,
        )
        super().__init__(params, defaults)
        # Not a group key: a checkpoint's param_groups would bring back the ratio it was saved with.
        self.adamw_lr_ratio, self.fused = adamw_lr_ratio, fused

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # torch.optim.Optimizer.step: an optional closure, its loss
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        matrices = []
        for group in self.param_groups:
            if not group["muon"]:
                self._adamw(group)
                continue
            for p in group["params"]:
                if p.grad is not None:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    matrices.append(Matrix(p, state["momentum_buffer"], group, lr_scale))
        orthogonalise_all(matrices, newton_schulz)
        return loss

    def _adamw(self, group: dict) -> None:
        """torch.optim.AdamW's step on one group (its states made as AdamW makes them), at lr x adamw_lr_ratio."""
        params = [p for p in group["params"] if p.grad is not None]
        fused = bool(self.fused)
        for p in params:
            state = self.state[p]
            if not state:
                # the fused kernel's step counter on the device; torch's unfused one on the host
                device = p.device if fused else "cpu"
                state["step"] = torch.zeros((), dtype=torch.float32, device=device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        states = [self.state[p] for p in params]
        beta1, beta2 = group["betas"]
        adamw(
            params,
            [p.grad for p in params],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            [s["step"] for s in states],
            fused=fused,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"] * self.adamw_lr_ratio,
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )
