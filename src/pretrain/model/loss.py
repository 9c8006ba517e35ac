"""The output layer and the cross-entropy loss: plain, or a chunk of tokens at a time.

Plain: logits = h W^T for every token at once, cast to fp32, `F.cross_entropy`. Its backward holds the
full-vocabulary logits in the compute dtype and fp32 and their gradients: about 12 x b*s*V bytes, ~25 GB for
a 128K vocabulary at 8 x 2048 tokens.

Chunked: the same loss, computed `chunk_tokens` tokens at a time with fp32 only inside a chunk. The gradient of
cross-entropy with respect to the logits is known in closed form, softmax(z) - onehot(y), so the forward pass
computes it chunk by chunk and right away multiplies it into the two gradients the backward pass needs:
    dL/dh = (softmax(z) - onehot(y)) W        (tokens x h)
    dL/dW = (softmax(z) - onehot(y))^T h      (V x h), summed over the chunks
and keeps only those two; backward scales them by grad_output / N. The output matmul runs once: no logits
are recomputed, unlike Wijmans et al. 2024 ("Cut Your Losses in Large-Vocabulary Language Models",
arXiv:2411.09009); Liger Kernel's fused linear cross-entropy (Hsu et al. 2024, arXiv:2410.10989) works this
way in Triton, ours in plain torch. The kept gradients are those of the loss *sum* (softmax - onehot, not
divided by N): under fp16 the small per-token values would otherwise fall below fp16's range before the
GradScaler's scale reaches them.

Padded vocabulary rows (model.pad_vocab_to) keep the matmuls' aligned shapes but take no part in the softmax:
their logits are -inf, so their probability, and the gradient they pass on, is exactly zero.

Both take the final-norm output h and the output weight W (tied or not: a tied weight's gradient adds to the
embedding's through autograd), so the output layer and loss can be compiled as one module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the output matmul runs in: autocast's for this device when it is on, else the weight's."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return weight.dtype


def kept_weight_grad_dtype(dtype: torch.dtype) -> torch.dtype:
    """dL/dW is summed over the chunks in the matmul dtype, as the plain path's output matmul gives it (half
    the bytes of an fp32 weight's), but in fp32 under fp16: a sum over all tokens of (softmax - onehot) x h
    could exceed fp16's range (65,504)."""
    return torch.float32 if dtype == torch.float16 else dtype


def _chunks(hidden, weight, targets, chunk_tokens: int, vocab_size: int | None, dtype: torch.dtype, gradients: bool):
    """The loss sum over all tokens and, with `gradients`, dL/dh (in `dtype`) and dL/dW (kept dtype) of it."""
    n, width = hidden.shape
    w = weight.to(dtype)  # autocast's cast of the weight, once for all chunks
    loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
    grad_hidden = grad_weight = None
    if gradients:
        grad_hidden = torch.empty(n, width, dtype=dtype, device=hidden.device)
        grad_weight = torch.zeros(weight.shape, dtype=kept_weight_grad_dtype(dtype), device=hidden.device)
    # One fp32 scratch of a chunk's logits' size, made once for all chunks: in eager mode on a CPU a fresh
    # chunk-sized tensor per op costs about as much as the op (each is new memory, faulted in page by page). None
    # when compiled: the compiler plans the graph's buffers itself, and would copy in and out of this one.
    scratch = (
        None
        if torch.compiler.is_compiling()
        else torch.empty(min(chunk_tokens, n) * w.shape[0], dtype=torch.float32, device=hidden.device)
    )
    for start in range(0, n, chunk_tokens):
        end = min(start + chunk_tokens, n)
        loss_sum = loss_sum + _chunk(
            hidden[start:end].to(dtype),
            w,
            targets[start:end],
            vocab_size,
            None if grad_hidden is None else grad_hidden[start:end],
            grad_weight,
            scratch,
        )
    return loss_sum, grad_hidden, grad_weight


def _chunk(h, w, y, vocab_size: int | None, grad_hidden, grad_weight, scratch):
    """One chunk's loss sum; with gradients, writes its rows of dL/dh and adds its share of dL/dW. Its tensors
    die on return, its matmul dtype's product, logsumexp's temporary and its gradient are made in `scratch` (each
    dead before the next is written): one chunk's logits exist at a time."""
    shape, full = (h.shape[0], w.shape[0]), h.dtype == torch.float32
    # fp32 only for this chunk: log-softmax loses precision in bf16
    logits = h @ w.t() if full else torch.mm(h, w.t(), out=_view(scratch, shape, h.dtype)).float()
    if vocab_size is not None and vocab_size < logits.shape[1]:
        logits[:, vocab_size:] = float("-inf")  # padded rows: no share of the softmax
    lse = _logsumexp(logits, _view(scratch, shape, torch.float32))
    loss = (lse - logits.gather(1, y[:, None]).squeeze(1)).sum()
    if grad_hidden is not None:
        # The softmax in place, or in fp32 in the scratch, which then holds the chunk's gradient either way.
        probs = torch.sub(logits, lse[:, None], out=_view(scratch, shape, torch.float32) if full else logits).exp_()
        probs[torch.arange(y.shape[0], device=y.device), y] -= 1.0  # softmax - onehot: dL_sum/dz
        g = probs if full else _cast(probs, _view(scratch, shape, h.dtype), h.dtype)
        del logits, probs  # the fp32 chunk goes before the weight's product is made (pretrain.plan.loss_terms)
        torch.mm(g, w, out=grad_hidden)
        if grad_weight.dtype == g.dtype:  # accumulated inside the matmul: no V x h temporary
            torch.addmm(grad_weight, g.t(), h, out=grad_weight)
        else:  # fp16: each chunk's product summed in fp32
            grad_weight.add_(g.t() @ h)
    return loss


def _logsumexp(z, out):
    """torch.logsumexp(z, -1), bit for bit (its own steps: max, exp(z - max) summed, log + max), with its
    z-sized temporary in `out`."""
    top = z.amax(dim=-1, keepdim=True)
    top.masked_fill_(top.abs() == float("inf"), 0)  # an all -inf row: exp(-inf - 0) = 0, no NaN
    return torch.sub(z, top, out=out).exp_().sum(dim=-1).log_().add_(top.squeeze(1))


def _view(buffer, shape: tuple[int, int], dtype: torch.dtype):
    """The first rows x cols elements of a flat buffer as a tensor of `dtype` (no larger than the buffer's); None
    without a buffer, for ops to make their own outputs."""
    return None if buffer is None else buffer.view(dtype)[: shape[0] * shape[1]].view(shape)


def _cast(x, out, dtype: torch.dtype):
    """x in `dtype`, written into `out` when there is one."""
    return x.to(dtype) if out is None else out.copy_(x)


class _LinearCrossEntropy(torch.autograd.Function):
    """mean_i CE(h_i W^T, y_i), its gradients computed in forward (see the module docstring)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_tokens: int, vocab_size: int | None, dtype: torch.dtype):
        with torch.autocast(hidden.device.type, enabled=False):  # casts are explicit, to `dtype`
            loss_sum, grad_hidden, grad_weight = _chunks(hidden, weight, targets, chunk_tokens, vocab_size, dtype, True)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.tokens, ctx.hidden_dtype, ctx.weight_dtype = hidden.shape[0], hidden.dtype, weight.dtype
        return loss_sum / hidden.shape[0]

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_output / ctx.tokens  # grad_output carries the GradScaler's scale and 1 / accumulation
        # Scaled in the inputs' dtypes (fp32 under autocast, as the plain path's cast back gives them).
        return (
            grad_hidden.to(ctx.hidden_dtype, copy=True).mul_(scale),
            grad_weight.to(ctx.weight_dtype, copy=True).mul_(scale),
            None,
            None,
            None,
            None,
        )


class ChunkedCrossEntropy(nn.Module):
    """Output layer + mean cross-entropy, `chunk_tokens` tokens at a time (train.loss: chunked). No
    parameters: the weight is passed in, so the model's parameter names do not change."""

    def __init__(self, chunk_tokens: int, vocab_size: int | None = None):
        """`vocab_size`: the real rows of a padded output weight (None: all are real)."""
        super().__init__()
        self.chunk_tokens, self.vocab_size = chunk_tokens, vocab_size

    def forward(self, hidden, weight, targets):
        h, y = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
        dtype = compute_dtype(h, weight)
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
            return _LinearCrossEntropy.apply(h, weight, y, self.chunk_tokens, self.vocab_size, dtype)
        with torch.autocast(h.device.type, enabled=False):  # evaluation: the loss only, no gradient work
            loss_sum, _, _ = _chunks(h, weight, y, self.chunk_tokens, self.vocab_size, dtype, False)
        return loss_sum / h.shape[0]

    def extra_repr(self) -> str:
        return f"chunk_tokens={self.chunk_tokens}"


class CrossEntropy(nn.Module):
    """Output layer + mean cross-entropy over full-vocabulary fp32 logits (train.loss: plain)."""

    def __init__(self, vocab_size: int | None = None):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, hidden, weight, targets):
        logits = F.linear(hidden, weight)
        if self.vocab_size is not None and logits.shape[-1] != self.vocab_size:  # padded rows: no share of the softmax
            logits = logits[..., : self.vocab_size]
        # The loss in fp32: log-softmax over a large vocabulary loses precision in bf16.
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_loss(loss: str, chunk_tokens: int, vocab_size: int) -> nn.Module:
    """The `train.loss` module: chunked | plain; `vocab_size` real rows of a possibly padded output weight."""
    if loss == "chunked":
        return ChunkedCrossEntropy(chunk_tokens, vocab_size)
    if loss == "plain":
        return CrossEntropy(vocab_size)
    raise ValueError(f"unknown loss {loss!r}: chunked | plain")
