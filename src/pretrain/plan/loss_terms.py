"""The output layer and the loss (pretrain.model.loss) for one micro-batch: what they keep for backward, and the
working sets they hold on top of it at the end of forward and while the loss's backward runs. The plain loss
keeps the fp32 log-softmax over the vocabulary (4 * b*s*V bytes, for a 128K vocabulary larger than several
layers); the chunked one only the two gradients it computed in forward, b*s*h + V*h elements.

Its own module beside the blocks' terms (pretrain.plan.activations): those count what is kept, these also the
loss's peaks, which pretrain.plan.phases places in the step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..gpus import mixed_precision
from .activation_terms import COMPUTE_BYTES, Term, residual_bytes
from .params import padded_vocab_size

if TYPE_CHECKING:
    from ..config.job_sections import ParallelConfig
    from ..config.schema import ResolvedModelConfig, ResolvedTrainConfig


def loss_terms(
    m: ResolvedModelConfig, t: ResolvedTrainConfig, parallel: ParallelConfig, b: int
) -> dict[str, list[Term]]:
    """The output layer and loss (pretrain.model.loss) for b sequences: {"kept": what stays from forward to
    backward, "forward": the working set on top of it at the end of forward, "backward": on top of it while
    the loss's backward runs}. a: compute bytes, r: residual (final-norm output) bytes, V-sized terms split
    over tensor ranks; Vp: the vocabulary padded to model.pad_vocab_to (the output matmul's rows), V the real
    one (the softmax's).
    plain (`train.loss: plain`), logits z = h W^T over all b*s tokens at once:
      kept       8 x b*s (target ids) + a x b*s*h (the output matmul's input) + 4 x b*s*V (fp32
                 log-softmax) + 4 (loss scalar)
      forward    a x b*s*Vp (the logits) + 4 x b*s*V (their fp32 copy, or in fp32 the copy that slicing off
                 padded rows makes; none in fp32 unpadded)
      backward   8 x b*s*V: the gradient of the log-softmax and of the logits, both fp32, beside the kept
                 log-softmax: 12 x b*s*V at once.
    chunked (`train.loss: chunked`), c = min(train.loss_chunk_tokens, b*s) tokens at a time, its gradients
    made in forward:
      kept       a x b*s*h (dL/dh) + g x Vp*h (dL/dW in the matmul dtype, g = a; fp32 under fp16: g = 4)
      forward    r x b*s*h (its input, the final norm's output, not kept) + a chunk: 8 x c*Vp (its fp32
                 logits and an fp32 scratch of their size, made once for all chunks, which holds in turn the
                 half-precision product, logsumexp's temporary and the chunk's gradient), or under fp16 the
                 scratch 4 x c*Vp beside the gradient's product with h, a x Vp*h, if larger
                 (elsewhere the product accumulates in place); + a x Vp*h when the weight is cast for the
                 matmul (autocast), + a x c*h when the chunk of h is
      backward   r x b*s*h + w x Vp*h: the scaled gradients handed to autograd (w: the weight's bytes).
    """
    s, h, V, Vp = t.seq_len, m.hidden_size, m.vocab_size, padded_vocab_size(m)
    a, r = COMPUTE_BYTES[t.precision], residual_bytes(t, parallel)
    bs = b * s
    if t.loss == "plain":
        kept = [
            Term("target ids", 8 * bs, "8 x b*s (int64)", False),
            Term("output matmul input", a * bs * h, f"{a} x b*s*h", False),
            Term("fp32 log-softmax of the loss", 4 * bs * V, "4 x b*s*V", True),
            Term("loss scalar", 4, "4", False),
        ]
        forward = [Term("loss logits", a * bs * Vp, f"{a} x b*s*{'Vp' if Vp != V else 'V'}", True)]
        if a != 4 or Vp != V:
            forward.append(Term("loss logits in fp32", 4 * bs * V, "4 x b*s*V", True))
        backward = [
            Term("loss backward: fp32 gradients of the log-softmax and the logits", 8 * bs * V, "8 x b*s*V", True)
        ]
        return {"kept": kept, "forward": forward, "backward": backward}
    c = min(t.loss_chunk_tokens, bs)
    v = "Vp" if Vp != V else "V"
    weight = 2 if t.precision == "bf16" or (mixed_precision(t.precision) and parallel.fsdp) else 4
    g = 4 if t.precision == "fp16-mixed" else a
    kept = [
        Term("loss: dL/dh", a * bs * h, f"{a} x b*s*h", False),
        Term("loss: dL/dW of the output layer", g * Vp * h, f"{g} x {v}*h", True),
    ]
    # The chunk's fp32 logits and the fp32 scratch of the same size (logsumexp's temporary: logits - max).
    if g != a:  # fp16: or the scratch, which holds the chunk's gradient, beside its product with h
        chunk = max(8 * c * Vp, 4 * c * Vp + a * Vp * h)
        chunk_formula = f"max(8 x c*{v}, 4 x c*{v} + {a} x {v}*h)"
    else:
        chunk, chunk_formula = 8 * c * Vp, f"8 x c*{v}"
    forward = [
        Term("loss input h", r * bs * h, f"{r} x b*s*h", False),
        Term(f"loss chunk of c={c:,} tokens: logits, logsumexp", chunk, chunk_formula, True),
    ]
    if weight != a:
        forward.append(Term("loss: output weight cast for the matmul", a * Vp * h, f"{a} x {v}*h", True))
    if r != a:
        forward.append(Term("loss: chunk of h cast for the matmul", a * c * h, f"{a} x c*h", False))
    backward = [
        Term("loss backward: dL/dh scaled", r * bs * h, f"{r} x b*s*h", False),
        Term("loss backward: dL/dW scaled", weight * Vp * h, f"{weight} x {v}*h", True),
    ]
    return {"kept": kept, "forward": forward, "backward": backward}
