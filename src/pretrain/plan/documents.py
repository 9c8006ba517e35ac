"""The attention a masked window does (train.document_masking): sum of L_i^2 over its documents, not seq^2.

Windows of seq tokens are cut from the stream of documents wherever they fall, so a document of L tokens
lands in one window or is cut in two (or, longer than seq, in several). With the window grid at a uniformly
random offset (integer offsets 0 .. seq-1), the expected sum of squared pieces of one document is

    f(L) = L^2 - L (L^2 - 1) / (3 seq)      for L <= seq (cut at each of its L - 1 inner gaps with chance 1/seq)
    f(L) = L seq - (seq^2 - 1) / 3          for L >= seq (the two agree at L = seq)

and per token a query sees, in PaLM's full-square count, C = sum f(L) / sum L keys on average instead of seq
(C = seq when nothing is known: the upper bound). tests/plan/test_document_flops.py checks C against the sum
of squared document pieces of real windows cut from a stream of documents.

The lengths: meta.json's doc_length_histogram of data.dir's train split (power-of-two bins, each taken at the
mean of its integers (3 lo - 1) / 2), else data.mean_doc_tokens (every document of that length), else none.
A data.mixture reads each window from one source (data/mixture.py), a share w_s of the tokens, so its C is
sum w_s C_s: the sources' histograms are combined with each source's documents scaled by w_s / its tokens
(the sampling weights; a source capped by max_epochs gives up its share later in the run, which this ignores).
Every source needs its histogram, else the mixture falls to data.mean_doc_tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..config import mixture_sources
from ..files import json_file
from .explain import Explain

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig, ResolvedModelConfig, ResolvedTrainConfig


def position_reset(m: ResolvedModelConfig, t: ResolvedTrainConfig) -> bool:
    """model.position_reset as the model reads it: null follows train.document_masking."""
    return t.document_masking if m.position_reset is None else m.position_reset


def squared_pieces(length: float, seq: int) -> float:
    """f(L): the expected sum of squared pieces a document of `length` tokens leaves in windows of `seq`."""
    if length <= seq:
        return length * length - length * (length * length - 1) / (3 * seq)
    return length * seq - (seq * seq - 1) / 3


def mean_context(lengths: dict[float, float], seq: int) -> float:
    """{document length: number of documents} -> C, the keys a query sees on average (PaLM: full square)."""
    tokens = sum(length * n for length, n in lengths.items())
    return sum(squared_pieces(length, seq) * n for length, n in lengths.items()) / tokens


def histogram_lengths(directory: str) -> dict[float, float] | None:
    """{length: documents} of the train split in `directory`'s meta.json, or None: not prepared yet, or
    prepared before the histogram existed (a sharded dataset's top-level meta.json holds its shards' sum)."""
    try:
        histogram = json_file(Path(directory) / "meta.json")["doc_length_histogram"]
        lengths = {
            (1.0 if int(lo) == 1 else (3 * int(lo) - 1) / 2): float(n) for lo, n in histogram["train"].items() if n
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return lengths or None


def mixture_lengths(cfg: ResolvedConfig) -> dict[float, float] | None:
    """The sources' histograms in one, each source's documents scaled by its weight / its tokens, so that
    mean_context of the sum is sum w_s C_s; None if a source has none."""
    lengths: dict[float, float] = {}
    for source in mixture_sources(cfg.data):
        own = histogram_lengths(source["dir"])
        if own is None:
            return None
        tokens = sum(length * n for length, n in own.items())
        for length, n in own.items():
            lengths[length] = lengths.get(length, 0.0) + source["weight"] * n / tokens
    return lengths


def document_lengths(cfg: ResolvedConfig) -> tuple[dict[float, float] | None, str]:
    """({length: documents} or None, where they came from: "meta.json" | "data.mean_doc_tokens" | "none")."""
    d = cfg.data
    lengths = histogram_lengths(d.dir) if d.dir else mixture_lengths(cfg) if d.mixture else None
    if lengths:
        return lengths, "meta.json"
    if d.mean_doc_tokens:
        return {float(d.mean_doc_tokens): 1.0}, "data.mean_doc_tokens"
    return None, "none"


def attention_context(cfg: ResolvedConfig, ex: Explain) -> tuple[float, str | None]:
    """(keys per query in the attention term, where the document lengths came from; None without masking)."""
    seq = cfg.train.seq_len
    if not cfg.train.document_masking:
        return seq, None
    lengths, source = document_lengths(cfg)
    if lengths is None:
        ex.add(
            "flops",
            "attention_context",
            seq,
            "document masking, lengths unknown (no doc_length_histogram "
            "in data.dir's meta.json, no data.mean_doc_tokens): seq, the full square's upper bound",
        )
        return seq, source
    if source == "data.mean_doc_tokens":
        where = f"data.mean_doc_tokens {cfg.data.mean_doc_tokens:g}"
    elif cfg.data.dir:
        where = f"{cfg.data.dir}/meta.json doc_length_histogram"
    else:
        where = "the data.mixture sources' meta.json doc_length_histograms, weighted by their weights"
    context = mean_context(lengths, seq)
    ex.add(
        "flops",
        "attention_context",
        context,
        f"sum L_i^2 / seq per window of {seq}, documents of {where} (expected over the window's offset)",
    )
    return context, source
