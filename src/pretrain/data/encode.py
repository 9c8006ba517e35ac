"""The worker side of `prepare`: a chunk of documents in, their tokens (each document + <eos>) out, split.

Each worker process holds one `ChunkEncoder`. A chunk carries the global index of its first document, so
the train/validation split of a document depends on (seed, document index) only, never on which worker
encoded it or when: the output is the same for any number of workers.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from typing import NamedTuple

import numpy as np

from .fast_bpe import tiktoken_encoder
from .hashing import unit_interval
from .tokenizer import TokenizerFiles

# Fast path: every VERIFY_EVERY-th document is also encoded by `tokenizers` and compared. Measured on ten
# 1 M-character chunks of the benchmark corpus: tiktoken 0.78 s, the check 0.22 s (tokenizers is ~4x slower).
VERIFY_EVERY = 16


class Chunk(NamedTuple):
    first_doc: int  # global index of texts[0]
    texts: list[str]


class EncodedChunk(NamedTuple):
    train: np.ndarray  # token ids, each document followed by <eos>
    train_lengths: np.ndarray  # tokens per document (<eos> included), int64
    val: np.ndarray
    val_lengths: np.ndarray
    chars: int
    text_bytes: int
    verified: int  # documents checked against `tokenizers` (fast path)
    mismatch: int | None  # index of a document where the fast path disagreed, if any


def is_validation(seed: int, doc_indices: np.ndarray, val_fraction: float) -> np.ndarray:
    """A document goes to validation when hash(seed, its index) < val_fraction: deterministic, whole documents."""
    return unit_interval(seed, doc_indices) < val_fraction


class ChunkEncoder:
    def __init__(self, tokenizer: TokenizerFiles, dtype: str, seed: int, val_fraction: float, fast_path: bool):
        self.tokenizer = tokenizer.load()
        # fast_path: the caller checked fast_bpe.why_not_fast
        self.fast = tiktoken_encoder(tokenizer.json) if fast_path else None
        self.eos_id, self.dtype, self.seed, self.val_fraction = tokenizer.eos_id, np.dtype(dtype), seed, val_fraction

    def __call__(self, chunk: Chunk) -> EncodedChunk:
        texts = chunk.texts
        doc_indices = np.arange(chunk.first_doc, chunk.first_doc + len(texts), dtype=np.uint64)
        ids, verified, mismatch = self._encode(texts, chunk.first_doc)
        lengths = np.fromiter((len(x) + 1 for x in ids), dtype=np.int64, count=len(ids))
        flat: list[int] = []
        for x in ids:
            flat += x
            flat.append(self.eos_id)
        tokens = np.array(flat, dtype=self.dtype)
        to_val = is_validation(self.seed, doc_indices, self.val_fraction)
        token_to_val = np.repeat(to_val, lengths)
        return EncodedChunk(tokens[~token_to_val], lengths[~to_val], tokens[token_to_val], lengths[to_val],
                            chars=sum(map(len, texts)), text_bytes=sum(len(t.encode("utf-8")) for t in texts),
                            verified=verified, mismatch=mismatch)

    def _encode(self, texts: list[str], first_doc: int) -> tuple[list[list[int]], int, int | None]:
        if self.fast is None:
            return [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)], 0, None
        ids = [self.fast.encode_ordinary(text) for text in texts]
        sample = range(-first_doc % VERIFY_EVERY, len(texts), VERIFY_EVERY)
        for i in sample:
            if self.tokenizer.encode(texts[i], add_special_tokens=False).ids != ids[i]:
                return ids, len(sample), first_doc + i
        return ids, len(sample), None


# --- process pool plumbing: one encoder per worker process ---------------------------------------------

_encoder: ChunkEncoder | None = None


def init_worker(*args) -> None:
    # Ctrl-C reaches the whole process group: the main process handles it (and ends the pool), workers ignore it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent()
    # Parallelism comes from the worker processes; `tokenizers`' own thread pool would oversubscribe the cores.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    global _encoder
    _encoder = ChunkEncoder(*args)


def encode_in_worker(chunk: Chunk) -> EncodedChunk:
    return _encoder(chunk)


def _exit_with_parent() -> None:
    """Linux: the kernel kills this worker when the main process dies (prctl PR_SET_PDEATHSIG, man 2 prctl).
    A worker outliving a killed main process would finish its chunk, fail to send it back (broken pipe) and
    print two tracebacks: ~70 lines of noise per kill. Elsewhere workers end at their next send, as before."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return
    PR_SET_PDEATHSIG = 1
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # the main process died before the line above
        os._exit(0)
    if parent is not None:
        sys.stderr = _QuietOrphan(sys.stderr, parent.sentinel)


class _QuietOrphan:
    """A worker's stderr that says nothing once the main process is gone. A dying process closes its files
    before the kernel sends the death signal, so a worker can meet the closed pipe first and start printing
    multiprocessing's "Process ...:" and a traceback; by the time that text is written, the parent's
    sentinel (closed with its files) says so. A live parent costs a worker's rare stderr line 50 ms."""

    def __init__(self, stream, sentinel: int):
        self.stream, self.sentinel = stream, sentinel

    def write(self, text: str) -> int:
        from multiprocessing.connection import wait

        if wait([self.sentinel], timeout=0.05):  # readable: the parent has exited
            return len(text)
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)
