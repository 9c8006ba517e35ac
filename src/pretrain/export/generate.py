"""Sampling from our model: greedy, temperature, top-k and nucleus (top-p), one token at a time.

Each step runs the whole context (cropped to the model's max_seq_len) through the model again: no key/value
cache. The models trained here are small, and the model code stays free of inference-only state; for fast
generation, export to Hugging Face (`pretrain export`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import UsageError


@torch.no_grad()
def generate(
    model,
    tokens: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """tokens (batch, seq) -> (batch, seq + n), n <= max_new_tokens new tokens.

    temperature 0 takes the most likely token (greedy); otherwise sampling from softmax(logits / temperature),
    restricted to the top_k most likely tokens and to the smallest set whose probability reaches top_p.
    A row that emits eos_id is finished and padded with eos_id while other rows go on; generation stops
    when every row is finished.
    """
    if tokens.dim() != 2 or tokens.shape[1] == 0:
        raise UsageError(f"generate: tokens must be (batch, seq) with seq >= 1, got shape {tuple(tokens.shape)}")
    if max_new_tokens < 0:
        raise UsageError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
    vocab = model.config.vocab_size
    if tokens.min() < 0 or tokens.max() >= vocab:  # the embedding would fail with an index error
        raise UsageError(
            f"generate: token ids must be in [0, {vocab:,}) (the model's vocabulary), got "
            f"{int(tokens.min())}..{int(tokens.max()):,}"
        )
    if not temperature >= 0:  # nan too
        raise UsageError(f"generate: temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise UsageError(f"generate: top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise UsageError(f"generate: top_p must be in (0, 1], got {top_p}")
    was_training = model.training
    model.eval()  # no dropout while sampling
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    try:
        for _ in range(max_new_tokens):
            # Only real ids: never one of the rows model.pad_vocab_to adds (the model leaves them out already).
            logits = model(tokens[:, -model.config.max_seq_len :])[:, -1, : model.config.vocab_size].float()
            next_token = _sample(logits, temperature, top_k, top_p, generator)
            if eos_id is not None:
                next_token = next_token.masked_fill(finished, eos_id)
                finished |= next_token == eos_id
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)
            if finished.all():
                break
    finally:
        model.train(was_training)
    return tokens


def _sample(logits, temperature, top_k, top_p, generator) -> torch.Tensor:
    """One token per row of logits (batch, vocab)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token once the more likely ones already reach top_p; the most likely one always stays.
        drop = probs.cumsum(dim=-1) - probs >= top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


def generate_text(model, tokenizer_path: str | Path, prompt: str, **kw) -> str:
    """The prompt and its continuation, decoded. `tokenizer_path`: a tokenizer.json or its directory.

    `kw` goes to `generate` (max_new_tokens is required); eos_id defaults to the tokenizer's end-of-document
    token, and an empty prompt starts from <bos>. The prompt is encoded as `prepare` encodes a document
    (TokenizerFiles.load): the text "<eos>" in it is those five characters, as the model saw such text in
    training, not the end-of-document token.
    """
    from ..data.tokenizer import check_fits_model, find_tokenizer

    files = find_tokenizer(tokenizer_path)
    tokenizer = files.load()
    check_fits_model(files.source, files.vocab_size, model.config.vocab_size, "give the run's, e.g. DATA_DIR/tokenizer")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:  # a command-line argument's undecodable bytes arrive as lone surrogates
        raise UsageError(f"the prompt is not valid UTF-8 text (character {e.start}); give UTF-8 text") from None
    ids = tokenizer.encode(prompt).ids
    bos = tokenizer.token_to_id("<bos>")
    if not ids and bos is not None:
        ids = [bos]
    if not ids:
        raise UsageError("generate: the prompt is empty and the tokenizer has no <bos> to start from")
    kw.setdefault("eos_id", files.eos_id)
    device = next(model.parameters()).device
    out = generate(model, torch.tensor([ids], device=device), **kw)
    return tokenizer.decode(out[0].tolist(), skip_special_tokens=True)
