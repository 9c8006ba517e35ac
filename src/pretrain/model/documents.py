"""The documents inside a training window (train.document_masking, model.position_reset).

`prepare` writes each document followed by one <eos>, and windows are cut across documents. The boundaries are
read from the window itself: the <eos> closes its document and the token after it starts the next one, so any
prepared directory or mixture works without a new file format (the offset index, where there is one, is
checked against them at train start: pretrain.data.documents).

  positions   each token's place in its own document, 0 at the document's first token: the RoPE angle, or
              the row of GPT-2's learned position table (model.position_reset).
  mask        token i attends to token j iff j <= i and both are of one document (train.document_masking),
              built once per batch and shared by every layer, for the kernel of the device:
                loop  CPU: each row's document lengths; SDPA runs causal on each document's slice. It does
                      sum L_i^2 / 2 of the work, not seq^2: at seq 1024 and documents of ~300 tokens its
                      attention forward + backward took 0.4 s where SDPA under a boolean mask took 1.1 s and
                      plain causal SDPA 0.8 s (4 x 4 heads x 64, one core)
                mask  a boolean (batch, 1, seq, seq) mask, True = attends: the eager kernel (on any device),
                      and the dense reference the others are tested against
                flex  CUDA: a FlexAttention block mask; blocks all masked out are skipped

The <eos> -> first-token-of-the-next-document target stays a normal target: the <eos> belongs to the document it
ends, and the loss is not masked (as in Llama 3, torchtitan and OLMo-core).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..config.schema import compile_enabled
from ..errors import UsageError


@dataclass(frozen=True)
class Documents:
    """How the model reads the documents of its windows: the end-of-document id, whether attention stays
    inside a document, whether positions restart, and the kernel of the masked attention (loop | mask | flex,
    as the module doc says)."""

    eos_id: int
    masking: bool
    position_reset: bool
    kernel: str = "mask"


def document_ids(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(batch, seq) -> each token's document number in its window: the <eos>s before it (not counting itself)."""
    ends = (tokens == eos_id).to(torch.int32)
    return ends.cumsum(-1) - ends


def positions_in_documents(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(batch, seq) -> each token's position in its document: 0 at the window's first token and after each <eos>."""
    index = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    starts = F.pad(tokens[:, :-1] == eos_id, (1, 0), value=True)
    first = torch.where(starts, index, 0).cummax(-1).values  # the latest document start at or before each token
    return index - first


def block_diagonal_mask(doc: torch.Tensor) -> torch.Tensor:
    """Document ids (batch, seq) -> the causal block-diagonal mask (batch, 1, seq, seq), True = attends."""
    s = doc.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=doc.device).tril()
    return (doc[:, :, None] == doc[:, None, :]).logical_and_(causal)[:, None]


FLEX_BLOCK = 128  # FlexAttention's default block of queries and of keys


def flex_block_mask(doc: torch.Tensor):
    """Document ids (batch, seq) -> a FlexAttention BlockMask of the same rule: the blocks that are all masked
    out (other documents, the future) are skipped, so the work follows sum L_i^2 rather than seq^2.

    Built from the ids block by block, never token by token: create_block_mask evaluates the rule on a dense
    (batch, seq, seq) grid unless compiled (8 GB at 8 x 32K, every micro-batch). Document ids never decrease
    along a row, so a block of tokens holds the documents from its first token's to its last's, and
      query block i sees key block j < i  iff  j's last document is i's first (one document spans the gap),
                              fully         iff  both blocks are that one document alone;
      the diagonal block j = i is seen in part (causal). The rule itself runs only inside the partial blocks.
    The same blocks as create_block_mask's (tests/model/test_documents.py)."""
    from torch.nn.attention.flex_attention import BlockMask

    def same_document_causal(b, h, q, kv):
        return (doc[b, q] == doc[b, kv]) & (q >= kv)

    b, s = doc.shape
    n = -(-s // FLEX_BLOCK)
    last = torch.arange(1, n + 1, device=doc.device).mul_(FLEX_BLOCK).clamp_(max=s) - 1
    first_doc, last_doc = doc[:, ::FLEX_BLOCK], doc[:, last]  # (batch, blocks) each
    before, diagonal = _block_triangle(n, doc.device)  # (blocks, blocks): j < i, j == i
    spans = before & (last_doc[:, None, :] == first_doc[:, :, None])  # [b, i, j]: key block j's last doc is i's first
    # a whole block inside one document (the last block of a sequence that is not whole blocks: never full, as
    # create_block_mask has it: the kernel masks its padding through the rule)
    alone = (first_doc == last_doc) & (last % FLEX_BLOCK == FLEX_BLOCK - 1)
    full = spans & alone[:, :, None] & alone[:, None, :]
    partial = (spans & ~full) | diagonal
    counts, indices = _kv_blocks(partial)
    full_counts, full_indices = _kv_blocks(full)
    return BlockMask.from_kv_blocks(
        counts,
        indices,
        full_counts,
        full_indices,
        BLOCK_SIZE=FLEX_BLOCK,
        mask_mod=same_document_causal,
        seq_lengths=(s, s),
    )


@functools.lru_cache(maxsize=8)
def _block_triangle(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(j < i, j == i) over n x n blocks: the same for every batch of one sequence length, made once."""
    i = torch.arange(n, device=device)
    return i[None, :] < i[:, None], i[None, :] == i[:, None]


def _kv_blocks(seen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, q blocks, kv blocks) booleans -> BlockMask's (batch, 1, q blocks) counts and (batch, 1, q blocks,
    kv blocks) key-block indices, the seen ones first in increasing order."""
    counts = seen.sum(-1, dtype=torch.int32)
    indices = torch.argsort((~seen).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts[:, None], indices[:, None]


def layout(tokens: torch.Tensor, documents: Documents | None):
    """(positions or None, mask or None) of a batch of windows, for the model's forward."""
    if documents is None:
        return None, None
    positions = positions_in_documents(tokens, documents.eos_id) if documents.position_reset else None
    if not documents.masking:
        return positions, None
    doc = document_ids(tokens, documents.eos_id)
    if documents.kernel == "loop":  # a tuple of tuples, so that attention tells it from a mask tensor
        return positions, tuple(tuple(torch.bincount(row).tolist()) for row in doc)
    return positions, flex_block_mask(doc) if documents.kernel == "flex" else block_diagonal_mask(doc)


def document_kernel(device: torch.device, dropout: float) -> str:
    """The masked attention's kernel on `device`: SDPA per document on the CPU (FlexAttention has no CPU backward
    in torch 2.13), FlexAttention on CUDA. UsageError where neither can mask: the run never falls back to
    attention across documents."""
    if device.type == "cpu":
        return "loop"
    if device.type != "cuda" or not flex_available():
        raise UsageError(
            f"train.document_masking: no masked attention kernel for device {device.type} here "
            "(CUDA needs torch's FlexAttention with triton); set train.document_masking=false or "
            "train on the CPU"
        )
    if dropout:
        raise UsageError(
            "train.document_masking: FlexAttention has no attention dropout; set model.dropout=0 "
            "or train.document_masking=false"
        )
    return "flex"


def flex_available() -> bool:
    try:
        import triton  # noqa: F401  FlexAttention's CUDA kernels are generated by triton
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


_compiled_flex = None


def flex_attention(q, k, v, block_mask, enable_gqa: bool):
    """FlexAttention, compiled once per process: uncompiled it runs an unfused reference that materialises the
    scores. Inside a compiled model the call is traced into the model's graph instead."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention as flex

    if torch.compiler.is_compiling():
        return flex(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex, dynamic=False)
    return _compiled_flex(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)


def documents_of_run(model_cfg, train_cfg, device: torch.device, eos_id: int | None) -> Documents | None:
    """The Documents a run's model reads (None: packing as is, the default), from train.document_masking and
    model.position_reset (null: as the masking), the data's <eos> id and the device's masked kernel. A compiled
    CPU run takes the boolean mask: the loop's document lengths differ per batch, and torch.compile would
    compile the model again for each."""
    masking = train_cfg.document_masking
    reset = masking if model_cfg.position_reset is None else model_cfg.position_reset
    if not (masking or reset):
        return None
    if eos_id is None:
        raise UsageError(
            "train.document_masking / model.position_reset: documents are found by the data's <eos> "
            "id, and this run reads no prepared data; set data.dir or turn them off"
        )
    kernel = document_kernel(device, model_cfg.dropout) if masking and train_cfg.attention == "sdpa" else "mask"
    if kernel == "loop" and compile_enabled(train_cfg.compile, device.type):
        kernel = "mask"
    return Documents(eos_id, masking, reset, kernel)
