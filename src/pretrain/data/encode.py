"""The worker side of `prepare`: a chunk of documents in, their tokens (each document + <eos>) out, split.

Each worker process holds one `ChunkEncoder`. The train/validation split of a document depends on (seed, its
text) only, never on its position, on which worker encoded it or when: the output is the same for any number
of workers, and a corpus cut into shards (`prepare --tasks N`) splits each document as one pass would.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
from typing import Any, NamedTuple

import numpy as np

from .fast_bpe import tiktoken_encoder
from .hashing import unit_interval
from .tokenizer import TokenizerFiles

# Fast path: every VERIFY_EVERY-th document is also encoded by `tokenizers` and compared. Measured on ten
# 1 M-character chunks of the benchmark corpus: tiktoken 0.78 s, the check 0.22 s (tokenizers is ~4x slower).
VERIFY_EVERY = 16


class Chunk(NamedTuple):
    first_doc: int  # index of texts[0] in its pass: picks the fast path's checked documents, names a mismatch
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


def content_keys(encoded_texts: list[bytes]) -> np.ndarray:
    """A 64-bit key per document from its UTF-8 bytes (BLAKE2b, RFC 7693, 8-byte digest). Keyed by content, a
    copy of a document lands in the same split as the original: no exact duplicate across train and val."""
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "little") for b in encoded_texts),
        dtype=np.uint64,
        count=len(encoded_texts),
    )


def is_validation(seed: int, doc_keys: np.ndarray, val_fraction: float) -> np.ndarray:
    """A document goes to validation when hash(seed, its content key) < val_fraction: deterministic, whole
    documents, independent of where the document sits in the corpus."""
    return unit_interval(seed, doc_keys) < val_fraction


class ChunkEncoder:
    def __init__(self, tokenizer: TokenizerFiles, dtype: str, seed: int, val_fraction: float, fast_path: bool):
        self.tokenizer = tokenizer.load()
        # fast_path: the caller checked fast_bpe.why_not_fast
        self.fast = tiktoken_encoder(tokenizer.json) if fast_path else None
        self.eos_id, self.dtype, self.seed, self.val_fraction = tokenizer.eos_id, np.dtype(dtype), seed, val_fraction

    def __call__(self, chunk: Chunk) -> EncodedChunk:
        texts = chunk.texts
        encoded_texts = [t.encode("utf-8") for t in texts]
        ids, verified, mismatch = self._encode(texts, chunk.first_doc)
        lengths = np.fromiter((len(x) + 1 for x in ids), dtype=np.int64, count=len(ids))
        flat: list[int] = []
        for x in ids:
            flat += x
            flat.append(self.eos_id)
        tokens = np.array(flat, dtype=self.dtype)
        to_val = is_validation(self.seed, content_keys(encoded_texts), self.val_fraction)
        token_to_val = np.repeat(to_val, lengths)
        return EncodedChunk(
            tokens[~token_to_val],
            lengths[~to_val],
            tokens[token_to_val],
            lengths[to_val],
            chars=sum(map(len, texts)),
            text_bytes=sum(map(len, encoded_texts)),
            verified=verified,
            mismatch=mismatch,
        )

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


def init_worker(*args: Any) -> None:
    # Ctrl-C reaches the whole process group: the main process handles it (and ends the pool), workers ignore it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent()
    # Parallelism comes from the worker processes; `tokenizers`' own thread pool would oversubscribe the cores.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    global _encoder
    _encoder = ChunkEncoder(*args)


def encode_in_worker(chunk: Chunk) -> EncodedChunk:
    assert _encoder is not None, "the pool's initializer sets it"
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
