"""How many tokens the user's text holds, and how many times the planned run must read it.

Tokens available = raw text bytes / bytes per token of the tokenizer on that text (`data.raw_bytes` and
`data.bytes_per_token`, the latter from `pretrain tokenizer stats`), or, for a prepared dataset (`data.dir`),
the train split's token count from its meta.json, which also records the corpus's bytes per token.
Epochs = planned training tokens / tokens available. Beyond ~4 epochs repeated tokens are worth much less
than new ones (Muennighoff et al. 2023, "Scaling Data-Constrained Language Models", section 5).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..files import json_file
from .explain import Explain

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig

MAX_EPOCHS = 4  # Muennighoff et al. 2023: up to ~4 epochs, repeated tokens are worth almost as much as new


def check_vocabulary(data_vocab: object, model_vocab: int, path: str | Path) -> None:
    """A prepared dataset whose token ids the model has no embedding for: one line, the same from `pretrain
    plan` as from `pretrain train` (data/loader.py), before a plan of the wrong embedding is printed."""
    if isinstance(data_vocab, int) and data_vocab > model_vocab:
        raise ConfigError(
            f"model.vocab_size: {model_vocab} is smaller than the vocabulary of {path} ({data_vocab}); set "
            f"model.vocab_size={data_vocab} or more"
        )


def corpus_supply(cfg: ResolvedConfig, tokens: int, ex: Explain) -> dict[str, Any] | None:
    """{"raw_bytes", "bytes_per_token", "tokens_available", "epochs", "source"}, or None when no corpus is given."""
    d = cfg.data
    if d.raw_bytes:
        raw, per_token = d.raw_bytes, d.bytes_per_token
        assert per_token  # checks.py refuses data.raw_bytes without data.bytes_per_token
        available = int(raw / per_token)
        source = "data.raw_bytes / data.bytes_per_token"
        ex.add("data", "tokens_available", available, f"raw text {raw:.4g} bytes / {per_token:.4g} bytes per token")
    elif d.dir:
        meta_path = Path(d.dir) / "meta.json"
        try:
            meta = json_file(meta_path)
            available = int(meta["num_tokens"]["train"])
            raw, per_token = meta["text_bytes"], meta["bytes_per_token"]
        except (OSError, ValueError, KeyError, TypeError):
            # A data.dir still to be prepared is a normal training config: the plan goes on without it.
            ex.add("data", "tokens_available", None, f"{meta_path} is not a finished `pretrain prepare` output yet")
            return None
        check_vocabulary(meta.get("vocab_size"), cfg.model.vocab_size, d.dir)
        source = f"{meta_path}"
        ex.add(
            "data",
            "tokens_available",
            available,
            f"train split of {meta_path} (num_tokens.train; the corpus "
            f"was {raw:,} bytes at {per_token:.4g} bytes per token)",
        )
    else:
        return None
    epochs = tokens / max(1, available)
    ex.add("data", "epochs", epochs, f"training tokens {tokens:,} / tokens available {available:,}")
    return {
        "raw_bytes": raw,
        "bytes_per_token": per_token,
        "tokens_available": available,
        "epochs": epochs,
        "source": source,
    }


def epochs_advice(supply: dict[str, Any] | None) -> list[str]:
    if not supply or supply["epochs"] <= MAX_EPOCHS:
        return []
    return [
        f"data: the run reads its {supply['tokens_available']:.3g} available tokens {supply['epochs']:.3g} times: "
        f"beyond ~{MAX_EPOCHS} epochs repeated tokens are worth much less than new ones (Muennighoff et al. "
        "2023, 'Scaling Data-Constrained Language Models'); add unique text or train a smaller model"
    ]
