"""Count the bytes a training step really holds, tensor by tensor, to check the planner on any device.

On a GPU `torch.cuda.max_memory_allocated` gives the peak; on a CPU there is no allocator counter, so we
count what the planner models:
  - parameters, gradients and optimizer states: the tensors themselves (shared storages counted once);
  - activations: every tensor autograd saves for backward (`saved_tensors_hooks`), counted once per storage
    (a view keeps its whole storage alive), plus the inputs that activation checkpointing holds and the
    outputs that selective recomputation's policy keeps, plus, with recomputation, one block's recomputed
    tensors (what its recomputation holds during backward);
  - working copies: half-precision casts of parameters that autocast saves for backward (found by value).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

from ..distributed.recompute import (
    checkpoint_mode,
    checkpointed_modules,
    forward_without_checkpoint,
    is_checkpointed,
    selective_policy,
)
from ..model.moe import moe_layers


def _storage_key(t: torch.Tensor) -> tuple:
    storage = t.untyped_storage()
    return (t.device.type, storage.data_ptr())


def _storage_bytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def model_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    """Bytes of parameters, gradients and optimizer states held by this process (local shards only)."""
    seen: set = set()

    def count(t) -> int:
        if not isinstance(t, torch.Tensor):
            return 0
        t = getattr(t, "_local_tensor", t)  # DTensor (FSDP2): this rank's shard
        t = getattr(t, "_tensor", t)  # fp8 tensorwise under FSDP2: torchao's wrapper of the fp32 weight
        key = _storage_key(t)
        if key in seen or t.device.type == "meta":
            return 0
        seen.add(key)
        return _storage_bytes(t)

    params = sum(count(p) for p in model.parameters())
    grads = sum(count(p.grad) for p in model.parameters() if p.grad is not None)
    states = 0
    if optimizer is not None:
        for state in optimizer.state.values():
            states += sum(count(v) for v in state.values())
    return {"parameters": params, "gradients": grads, "optimizer_states": states}


class _PolicyOutputs(TorchDispatchMode):
    """Hands `keep` the outputs that selective recomputation's policy saves (a checkpoint holds them in its own
    cache, out of reach of the saved-tensor hooks): the same policy, made afresh for each block call
    (`policy = selective_policy()` when one starts, None outside), decides on the same ops."""

    def __init__(self, keep):
        super().__init__()
        self.keep = keep
        self.policy: Callable | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (
            self.policy is not None
            and self.policy(SelectiveCheckpointContext(is_recompute=False), func, *args, **kwargs)
            == CheckpointPolicy.MUST_SAVE
        ):
            out = func(*args, **kwargs)
            for t in tree_leaves(out):
                self.keep(t)
            return out
        return func(*args, **kwargs)


class SavedTensorMeter:
    """Collects the storages a forward pass keeps for backward, under autograd's saved-tensor hooks."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.param_keys = {_storage_key(p) for p in model.parameters()}
        self.params = [p for p in model.parameters()]
        self.storages: dict[tuple, torch.Tensor] = {}
        # Storages counted elsewhere (recompute_block: the kept outputs), held so that no later tensor reuses
        # their memory under the same key.
        self.excluded: dict[tuple, torch.Tensor] = {}

    def _keep(self, t: torch.Tensor):
        if not isinstance(t, torch.Tensor):
            return
        key = _storage_key(t)
        if key not in self.param_keys and key not in self.storages and key not in self.excluded:
            self.storages[key] = t

    def _exclude(self, t: torch.Tensor):
        if isinstance(t, torch.Tensor):
            self.excluded.setdefault(_storage_key(t), t)

    def _pack(self, t):
        self._keep(t)
        return t

    def _observe(self, module, args):
        for a in tree_leaves(args):  # the rotary tables come as a (cos, sin) tuple
            if isinstance(a, torch.Tensor):
                self._keep(a)

    @contextlib.contextmanager
    def __call__(self, checkpoints: bool = True):
        # A checkpointed module's inputs are held by the checkpoint itself, not through the saved-tensor hooks:
        # a forward pre-hook on each such module sees them. Not in a compiled block (checkpoints=False): no
        # checkpoint runs there, the partitioner saves what recomputation needs through the hooks, and a hook
        # inside the graph would break it.
        modules = checkpointed_modules(self.model) if checkpoints else []
        hooks = [m.register_forward_pre_hook(self._observe) for m in modules]
        selective = [m for m in modules if checkpoint_mode(m) == "selective"]
        policy_outputs = _PolicyOutputs(self._keep)
        for m in selective:
            hooks.append(m.register_forward_pre_hook(lambda *_: setattr(policy_outputs, "policy", selective_policy())))
            hooks.append(m.register_forward_hook(lambda *_: setattr(policy_outputs, "policy", None)))
        try:
            with (
                torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t),
                policy_outputs if selective else contextlib.nullcontext(),
            ):
                yield self
        finally:
            for hook in hooks:
                hook.remove()

    def recompute_block(self, block: torch.nn.Module, *args):
        """Run a checkpointed block's own forward, as its recomputation in backward does, keeping what that
        holds: all the block's saved tensors (full), or those the selective policy does not keep, which the
        recomputation takes from the checkpoint's cache instead of making again."""
        mode = checkpoint_mode(block)
        policy_outputs = _PolicyOutputs(self._exclude)
        policy_outputs.policy = selective_policy() if mode == "selective" else None
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t), policy_outputs:
            forward_without_checkpoint(block, *args)

    def split(self) -> dict:
        """{'activations': bytes, 'working_copies': bytes}: casts of parameters are working copies."""
        by_numel: dict[int, list] = {}
        for p in self.params:
            by_numel.setdefault(p.numel(), []).append(p)
        activations = copies = 0
        for t in self.storages.values():
            nbytes = _storage_bytes(t)
            if self._is_param_copy(t, by_numel):
                copies += nbytes
            else:
                activations += nbytes
        return {"activations": activations, "working_copies": copies}

    @staticmethod
    def _is_param_copy(t: torch.Tensor, by_numel: dict) -> bool:
        if not t.is_floating_point() or t.dtype == torch.float32:
            return False
        numel = _storage_bytes(t) // t.element_size()
        # the storage read flat: offset 0, numel elements, stride 1
        flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, (numel,), (1,))
        return any(torch.equal(flat, p.detach().reshape(-1).to(t.dtype)) for p in by_numel.get(numel, ()))


def measure_forward(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    autocast: Callable[[], AbstractContextManager],
) -> tuple[torch.Tensor, dict]:
    """Run one training forward under the meter; returns the loss (backward it as usual) and the bytes."""
    meter = SavedTensorMeter(model)
    inner = getattr(model, "module", model)  # DDP wraps our model
    blocks = getattr(inner, "blocks", [])
    recomputed = bool(blocks) and is_checkpointed(blocks[0])
    # The first block of each kind (an MoE model's dense first blocks, its MoE blocks) and its arguments: its
    # input, and the rotary tables and mask it shares.
    kinds = {type(b.mlp): b for b in reversed(blocks)} if recomputed else {}
    calls: dict = {}
    hooks = [b.register_forward_pre_hook(lambda b, args: calls.setdefault(b, args)) for b in kinds.values()]
    with meter():
        with autocast():
            loss = model(tokens, targets)
        for hook in hooks:
            hook.remove()
    saved = meter.split()
    if recomputed:
        # Recomputation keeps only block inputs (and, selective, the policy's outputs) through the forward; in
        # backward each block is run again and holds its own recomputed tensors until its gradients are done.
        # Count one block: the kind that holds the most.
        runs = [_recomputed(meter, block, calls[block], autocast) for block in kinds.values()]
        worst = max(runs, key=lambda run: run["activations"])
        saved = {key: saved[key] + worst[key] for key in saved}
    return loss, saved


def _recomputed(meter: SavedTensorMeter, block: torch.nn.Module, args: tuple, autocast) -> dict:
    """What running `block` again as its recomputation holds beyond what `meter` counted in forward."""
    again = SavedTensorMeter(meter.model)
    again.excluded = {**meter.excluded, **meter.storages}  # the block input, the policy's kept outputs
    x, *shared = args
    # Not one of the step's micro-batches: a MoE layer of this block keeps its step's counts and loss.
    kept = [(m, m.step_sums, m.router_loss) for m in moe_layers(block)]
    with autocast():
        again.recompute_block(block, x.detach().requires_grad_(True), *shared)
    for m, sums, balancing in kept:
        m.step_sums, m.router_loss = sums, balancing
    return again.split()
