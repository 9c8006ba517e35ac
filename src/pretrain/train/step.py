"""One optimizer step: the recipe's arithmetic, and nothing else.

`accum` micro-batches per rank, each forward under the precision's autocast, backward of loss / accum;
clip the global gradient norm (the norm before clipping is what is logged); skip the update when it is not
finite (a loss scaler skips by itself and lowers its scale); AdamW at the given learning rate.

On a GPU the host waits for the device once per step, and not before the update is queued: the loss sum,
this rank's stop request and the grad norm travel in one small tensor, through one all-reduce, to pinned host
memory in one copy that the host waits for while the GPU runs the optimizer. The stop request is asked for
(`stop_asked()`) just before that all-reduce, so a signal received during the step's forward and backward
stops every rank after this step. The skip is decided on the
device: the fused AdamW takes the step's overflow flag (a 0-d tensor, as a loss scaler hands it over) and
leaves the weights, its moments and its step count alone when it is set; an optimizer without that input
waits for the copy and is stepped or not on the host. A loss scaler decides by its own overflow check, which
under FSDP2, tensor and expert parallelism sees only this rank's gradients: the global gradient norm, the same
on every rank, becomes every rank's flag (`_agree_on_overflow`), so every rank skips the same steps and lowers
its scale alike (tests/distributed/test_torchrun.py, test_overflow_agreement.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ..model.moe import end_step
from .measure import measure_forward, model_state_bytes
from .state import StepResult, TrainState

if TYPE_CHECKING:
    from ..distributed.engines import Parallelized
    from ..distributed.pipeline import Pipelined
    from ..distributed.runtime import Runtime
    from .prefetch import Prefetcher


def train_step(
    engine: Parallelized,
    batches: Prefetcher,
    state: TrainState,
    *,
    accum: int,
    lr: float,
    grad_clip: float,
    micro_batch_size: int,
    seq_len: int,
    scaler: torch.amp.GradScaler | None = None,
    stop_asked: Callable[[], bool] = lambda: False,
    measure: bool = False,
) -> StepResult:
    """Run one step on `engine` (a Parallelized) with `accum` micro-batches from `batches` (a Prefetcher), and
    advance `state`'s counters (step, tokens, micro_batches)."""
    optimizer, rt = engine.optimizer, engine.rt
    _set_lr(optimizer, lr)
    autocast = engine.autocast_context
    measured: dict | None = None
    loss_sum = torch.zeros((), device=rt.device)
    with engine.step_context():  # train.cache_weight_casts: the weights' casts made once, reused by every micro-batch
        for i in range(accum):
            x, y = batches.next_batch()
            with engine.no_sync(last=i == accum - 1):
                if measure and i == 0 and engine.measurable:
                    assert isinstance(engine.forward, torch.nn.Module)  # engine.measurable: the model, or its DDP
                    loss, saved = measure_forward(engine.forward, x, y, autocast)
                    measured = {"saved": saved}
                else:
                    with autocast():
                        loss = engine.forward(x, y)
                state.micro_batches += 1
                lm_loss = getattr(engine.module, "lm_loss", None)  # MoE: reported without the balancing losses
                loss_sum += (loss if lm_loss is None else lm_loss).detach().float()
                scaled = loss / accum
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
    if scaler is not None:
        scaler.unscale_(optimizer)
    norm = engine.clip(grad_clip)
    if scaler is not None:
        _agree_on_overflow(scaler, optimizer, norm)
    numbers = HostCopy(_reduce(loss_sum, accum, stop_asked(), norm, rt))
    if scaler is not None:
        scaler.step(optimizer)  # skips the update itself on inf/NaN and lowers the scale
        scaler.update()
    else:
        _step_unless_overflow(optimizer, norm, numbers)
    engine.after_optimizer_step()
    loss_mean, stop, grad_norm = numbers.values
    loss_mean, stop, finite = loss_mean / rt.world_size, stop > 0, math.isfinite(grad_norm)
    moe = end_step(engine.module, accum, update=finite) if engine.module.config.num_experts else None
    if measure:
        measured = measured or {"saved": None}
        measured["states"] = model_state_bytes(engine.module, getattr(optimizer, "optim", optimizer))
    engine.module.zero_grad(set_to_none=True)  # every gradient: a ZeRO-1 optimizer by hand holds its own only
    batch_tokens = _advance(state, accum * micro_batch_size * seq_len * rt.data_size)
    return StepResult(
        loss=loss_mean,
        grad_norm=grad_norm,
        lr=lr,
        batch_tokens=batch_tokens,
        finite=finite,
        stop=stop,
        measured=measured,
        moe=moe,
    )


def pipeline_train_step(
    engine: Pipelined,
    batches: Prefetcher,
    state: TrainState,
    *,
    accum: int,
    lr: float,
    grad_clip: float,
    micro_batch_size: int,
    seq_len: int,
    stop_asked: Callable[[], bool] = lambda: False,
    measure: bool = False,
) -> StepResult:
    """One step on `engine` (a distributed.pipeline.Pipelined): the step's `accum` micro-batches through the
    pipeline's schedule, which runs forward and backward on this rank's stage; the gradient norm of all stages
    together (each stage adds its squared norm); clip; AdamW on this stage's parameters. Every rank of a
    pipeline reads the same micro-batches (its data-parallel rank's): stage 0 needs the tokens, the last
    stage the targets."""
    optimizer, rt = engine.optimizer, engine.rt
    _set_lr(optimizer, lr)
    xs, ys = zip(*(batches.next_batch() for _ in range(accum)))
    state.micro_batches += accum
    loss = engine.run_step(torch.cat(xs), torch.cat(ys), accum)
    # One all-reduce over all ranks for the loss (only last stages add theirs), the stop request and the
    # squared gradient norms: every data-parallel replica of a stage holds the same (all-reduced) gradients,
    # and its tensor ranks the same loss and stage norm, so the sum over all ranks counts each stage
    # `replicas` (data x tensor) times.
    packed = torch.stack([loss.double(), _flag(stop_asked(), rt.device), engine.grad_norm_squared().double()])
    torch.distributed.all_reduce(packed)
    loss_sum, stop, norm_sq = packed.tolist()
    replicas = engine.replicas
    grad_norm = math.sqrt(norm_sq / replicas) if math.isfinite(norm_sq) else float("nan")
    finite = math.isfinite(grad_norm)
    if finite:
        engine.clip_to(grad_norm, grad_clip)
        optimizer.step()
    measured = None
    if measure:
        measured = {"saved": None, "states": model_state_bytes(engine.module, optimizer)}
    engine.module.zero_grad(set_to_none=True)  # every gradient of the stage: ZeRO-1's optimizer holds its own only
    batch_tokens = _advance(state, accum * micro_batch_size * seq_len * rt.data_size)
    return StepResult(
        loss=loss_sum / replicas,
        grad_norm=grad_norm,
        lr=lr,
        batch_tokens=batch_tokens,
        finite=finite,
        stop=stop > 0,
        measured=measured,
    )


def _reduce(loss_sum: torch.Tensor, accum: int, stop_asked: bool, norm: torch.Tensor, rt: Runtime) -> torch.Tensor:
    """[sum over ranks of each rank's mean loss, ranks asking to stop, grad norm] on the device, with one
    collective. fp64 for the loss sum over ranks, as each rank's mean is added in the same order as a float64
    would be. The tensor ranks of a data-parallel group hold the same loss: the mean over all ranks is the mean
    over the data-parallel groups."""
    import torch.distributed as dist

    packed = torch.stack([loss_sum.double() / accum, _flag(stop_asked, rt.device)])
    if rt.distributed:
        dist.all_reduce(packed)
    return torch.cat([packed, norm.detach().double().reshape(1)])


class HostCopy:
    """A small device tensor's values on their way to the host. On CUDA: a non-blocking copy into pinned
    memory and an event after it (torchtitan's way), so that reading them waits for the work queued before
    the copy, not for what was queued after it."""

    def __init__(self, t: torch.Tensor):
        self.event = None
        if t.device.type == "cuda":
            self.host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = t

    @functools.cached_property
    def values(self) -> list[float]:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


def _step_unless_overflow(optimizer: torch.optim.Optimizer, norm: torch.Tensor, numbers: HostCopy) -> None:
    """The optimizer's update unless the global grad norm (the same on every rank) is inf or NaN: decided on
    the device by an optimizer that takes an overflow flag (fused AdamW: GradScaler's `found_inf`), else on
    the host."""
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        # The ignores: attributes the fused optimizers read (GradScaler sets them too), not in torch's Optimizer type.
        flags = None, norm.isfinite().logical_not().float()
        optimizer.grad_scale, optimizer.found_inf = flags  # pyright: ignore[reportAttributeAccessIssue]
        try:
            optimizer.step()
        finally:
            del optimizer.grad_scale, optimizer.found_inf  # pyright: ignore[reportAttributeAccessIssue]
    elif math.isfinite(numbers.values[2]):
        optimizer.step()


def _agree_on_overflow(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer, norm: torch.Tensor) -> None:
    """Every rank's loss scaler skips alike. Its own check sees this rank's gradients only (a shard under FSDP,
    tensor or expert parallelism), and torch's reduction of its flag over a DTensor mesh follows the placement
    of the first gradient alone: a replicated first gradient is not reduced (torch 2.6 to 2.13, checked on both).
    The global gradient norm, the same on every rank, is not finite exactly when some rank's gradients are
    not: it becomes each rank's flag, on the device (GradScaler keeps its flags in its per-optimizer state; no
    public call sets them)."""
    overflow = norm.isfinite().logical_not().float()
    for found in scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values():
        found.copy_(torch.maximum(found, overflow.to(found.device)))


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _flag(on: bool, device: torch.device) -> torch.Tensor:
    """A rank's yes/no (a stop request) as a number an all-reduce sums: any rank's yes makes it positive.
    Filled on the device: a Python number copied into a CUDA tensor would wait for everything queued."""
    return torch.full((), 1.0 if on else 0.0, dtype=torch.float64, device=device)


def _advance(state: TrainState, batch_tokens: int) -> int:
    """Count the step and its tokens (every data-parallel rank's micro-batches: the tensor ranks and pipeline
    stages of a replica share its batch) in `state`."""
    state.step += 1
    state.tokens += batch_tokens
    return batch_tokens
