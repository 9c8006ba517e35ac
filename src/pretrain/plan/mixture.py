"""A data.mixture in the plan: tokens available per source, the tokens the run draws from each, its epochs.

Tokens available are the train split's num_tokens in each source's meta.json (a sharded dataset: its
top-level meta.json, or the sum of its shards'). The run draws weight x its training tokens from each source
(the weights count tokens); a source with max_epochs gives at most max_epochs x its tokens, and the trainer
hands the rest of its share to the other sources in proportion to their weights (data/mixture.py), which the
plan repeats here, so the epochs shown are the ones the run will make.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import mixture_sources
from ..files import json_file
from .corpus import MAX_EPOCHS, check_vocabulary
from .explain import Explain
from .length import TOKEN_DTYPE_BYTES, token_bytes

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig


def mixture_supply(cfg: ResolvedConfig, tokens: int, ex: Explain) -> dict[str, Any] | None:
    """{"sources": [{name, dir, weight, max_epochs, tokens_available, storage_bytes, tokens_planned, epochs,
    capped}], "tokens_short"}, or None without data.mixture. A source not prepared yet has None figures."""
    if not cfg.data.mixture:
        return None
    sources = [{**s, **read_counts(Path(s["dir"]), cfg.model.vocab_size)} for s in mixture_sources(cfg.data)]
    for s in sources:  # the trainer's rule (data/loader.py), said by the plan
        check_vocabulary(s.get("vocab_size"), cfg.model.vocab_size, s["dir"])
    for s in sources:
        if s["tokens_available"] is None:
            ex.add("mixture", f"{s['name']}.tokens_available", None, f"{s['dir']} has no finished meta.json yet")
        else:
            ex.add(
                "mixture",
                f"{s['name']}.tokens_available",
                s["tokens_available"],
                f"num_tokens.train of {s['dir']}/meta.json{' (sum of its shards)' if s['sharded'] else ''}",
            )
    short = _draw(sources, tokens)
    for s in sources:
        if s["epochs"] is not None:
            ex.add(
                "mixture",
                f"{s['name']}.epochs",
                s["epochs"],
                f"tokens drawn {s['tokens_planned']:,} / "
                f"tokens available {s['tokens_available']:,} (weight {s['weight']:.3g} of {tokens:,}"
                + (f", at most max_epochs {s['max_epochs']:g}" if s["max_epochs"] else "")
                + ")",
            )
    kept = [{k: v for k, v in s.items() if k not in ("sharded", "vocab_size")} for s in sources]
    return {"sources": kept, "tokens_short": short}


def _draw(sources: list[dict[str, Any]], tokens: int) -> int:
    """Fill tokens_planned and epochs; capped sources give at most their cap and the others share the rest by
    weight (water-filling, as the trainer ends up doing). Returns the tokens no source can give (all capped)."""
    active = [s for s in sources if s["tokens_available"] is not None]
    remaining = float(tokens) * sum(s["weight"] for s in active)  # unprepared sources keep their share to themselves
    while active:
        total = sum(s["weight"] for s in active)
        full = [
            s
            for s in active
            if s["max_epochs"] and remaining * s["weight"] / total > s["max_epochs"] * s["tokens_available"]
        ]
        if not full:
            for s in active:
                s["tokens_planned"], s["capped"] = int(remaining * s["weight"] / total), False
            remaining = 0
            break
        for s in full:
            s["tokens_planned"], s["capped"] = int(s["max_epochs"] * s["tokens_available"]), True
            remaining -= s["tokens_planned"]
            active.remove(s)
    for s in sources:
        s.setdefault("tokens_planned", None)
        s.setdefault("capped", False)
        s["epochs"] = None if s["tokens_planned"] is None else s["tokens_planned"] / max(1, s["tokens_available"])
    return int(remaining)


def read_counts(path: Path, vocab_size: int) -> dict[str, Any]:
    """tokens_available and storage_bytes (train + val token files) of a prepared or sharded directory, and its
    vocabulary (`vocab_size` only sizes the token files meta.json does not describe)."""
    try:
        meta = json_file(path / "meta.json")
        if "num_tokens" in meta:
            metas, sharded = [meta], "shards" in meta
        else:
            metas, sharded = (
                [json_file(path / shard / "meta.json") for shard in meta["shards"]],
                True,
            )
        train = sum(int(m["num_tokens"]["train"]) for m in metas)
        stored = sum(int(m["num_tokens"]["train"]) + int(m["num_tokens"].get("val", 0)) for m in metas)
        width = TOKEN_DTYPE_BYTES.get(metas[0].get("dtype"), token_bytes(vocab_size))
    except (OSError, ValueError, KeyError, TypeError):
        return {"tokens_available": None, "storage_bytes": None, "sharded": False}
    return {
        "tokens_available": train,
        "storage_bytes": stored * width,
        "sharded": sharded,
        "vocab_size": metas[0].get("vocab_size"),
    }


def mixture_advice(mixture: dict[str, Any] | None) -> list[str]:
    """A line per source read more than its max_epochs would allow or past ~4 epochs, and one when every
    source is capped before the run's tokens are drawn."""
    if not mixture:
        return []
    lines: list[str] = []
    for s in mixture["sources"]:
        if s["epochs"] is None:
            continue
        if s["capped"]:
            lines.append(
                f"data.mixture: source {s['name']!r} reaches its max_epochs {s['max_epochs']:g} before "
                "the run's end: the trainer stops it there and the other sources take its share (their "
                "epochs above include it)"
            )
        elif s["epochs"] > MAX_EPOCHS:
            lines.append(
                f"data.mixture: source {s['name']!r} is read {s['epochs']:.3g} times ("
                f"{s['tokens_planned']:,} of its {s['tokens_available']:,} tokens): beyond ~{MAX_EPOCHS} "
                "epochs repeated tokens are worth much less than new ones (Muennighoff et al. 2023, "
                "'Scaling Data-Constrained Language Models'); lower its weight, set its max_epochs or add "
                "unique text"
            )
    if mixture["tokens_short"] > 0:
        lines.append(
            f"data.mixture: every source reaches its max_epochs {mixture['tokens_short']:,} tokens before "
            "the run's end, where the trainer stops with an error; raise a max_epochs, add a source "
            "without one, or train fewer tokens"
        )
    return lines
