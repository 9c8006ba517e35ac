"""Whether a resume may continue from a checkpoint with this config: the same model shapes, the same kind of
data, and a change of train.seq_len only where the run stays well defined (a stage of context extension). Each
compares the checkpoint's own verified config.yaml with the resumed config before any tensor is loaded."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import yaml

from ..config import mixture_sources
from ..config.job_sections import DataConfig
from ..config.schema import ResolvedConfig
from ..errors import UsageError

# The model keys that decide which tensors exist and their shapes (the rest: dropout, init, RoPE base, ...
# may change on a resume). max_seq_len sizes GPT-2's position table only: a LLaMA may extend its context.
SHAPE_KEYS = (
    "family",
    "vocab_size",
    "pad_vocab_to",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "max_seq_len",
    "tie_embeddings",
    "qkv_bias",
    "qk_norm",
    "bias",
)


def _saved_config(path: Path) -> dict[str, Any]:
    return yaml.safe_load((Path(path) / "config.yaml").read_text()) or {}


def check_resume_compatible(path: Path, config: ResolvedConfig) -> None:
    """A resume must build the model the checkpoint holds and read the kind of data it read: compare the
    checkpoint's own (verified) config.yaml with the resumed config before any tensor is loaded, and name the
    first key that differs."""
    saved_config = _saved_config(path)
    check_same_data_kind(path, saved_config.get("data") or {}, config.data)
    saved = saved_config.get("model") or {}
    now = config.to_dict()["model"]
    for key in SHAPE_KEYS:
        if key == "max_seq_len" and saved.get("family") != "gpt2":
            continue
        if key in saved and saved[key] != now.get(key):
            raise UsageError(
                f"model.{key}: {now.get(key)!r} here, but checkpoint {path} was trained with "
                f"{saved[key]!r}; a resume keeps the model's shape: drop the override, or start a "
                "new run.dir"
            )
    before, after = _experts_shape(saved), _experts_shape(now)
    for key in after:
        if before.get(key, after[key]) != after[key]:
            kept = (
                f"its router and routing biases learnt to score with {before[key]}"
                if key == "router"
                else "a resume keeps the experts' shape"
            )
            raise UsageError(
                f"model.{key}: {after[key]!r} here, but checkpoint {path} was trained with {before[key]!r}; "
                f"{kept}: drop the override, or start a new run.dir"
            )


def _experts_shape(model: dict[str, Any]) -> dict[str, Any]:
    """The Mixture-of-Experts keys that decide which tensors exist and their shapes, as the model builds them
    (an unset moe_intermediate_size is the dense width; a dense model has no other), and the router's score:
    the router's weights and routing biases were learnt for one function (softmax or sigmoid) and mean nothing
    under the other. A config.yaml older than these keys is a dense model's."""
    if not model.get("num_experts"):
        return {"num_experts": 0}
    return {
        "num_experts": model["num_experts"],
        "moe_intermediate_size": model.get("moe_intermediate_size") or model.get("intermediate_size"),
        "num_shared_experts": model.get("num_shared_experts", 0),
        "first_dense_layers": model.get("first_dense_layers", 0),
        "router": model.get("router", "softmax"),
    }


# What a resume may change about how the model computes, said in one line and a `settings_changed` event: choices
# a later stage of training makes on purpose (more experts per token; document masking turned on for a
# long-context stage, as Llama 3 did), never silently (docs/train.md: Resuming).
ANNOUNCED = ("model.experts_per_token", "model.norm_topk_prob", "train.document_masking", "model.position_reset")


def settings_change(path: Path, config: ResolvedConfig) -> dict[str, Any] | None:
    """The `settings_changed` event of a resume whose ANNOUNCED settings differ from the checkpoint's, or None.
    position_reset is compared as it applies (unset: as document masking); the experts' keys only for an MoE."""
    saved, now = _saved_config(path), config.to_dict()
    changes = [
        {"key": key, "before": _effective(saved, key), "after": _effective(now, key)}
        for key in ANNOUNCED
        if (now["model"].get("num_experts") or key.startswith(("train.", "model.position")))
        and _effective(saved, key) is not None
        and _effective(saved, key) != _effective(now, key)
    ]
    return {"event": "settings_changed", "checkpoint": str(path), "changes": changes} if changes else None


def settings_line(event: dict[str, Any]) -> str:
    """The terminal's line for a `settings_changed` event."""
    changed = ", ".join(f"{c['key']} {_shown(c['before'])} -> {_shown(c['after'])}" for c in event["changes"])
    return (
        f"resumed with other settings than checkpoint {event['checkpoint']}: {changed}; training goes on with "
        "them (events.jsonl: settings_changed)"
    )


def stage_line(e: dict[str, Any], total_steps: int) -> str:
    """The terminal's line for a `stage_changed` event (a resume at another train.seq_len)."""
    length = (
        f"; {e['stage_tokens']:,} tokens (train.stage_tokens): to step {e['ends_at_step']:,}"
        if e.get("stage_tokens")
        else f"; to the run's end, step {total_steps:,}"
    )
    return (
        f"new stage from step {e['step']:,}: train.seq_len {e['seq_len_before']:,} -> "
        f"{e['seq_len_after']:,}, {e['tokens_per_step_after']:,} tokens per step (was "
        f"{e['tokens_per_step_before']:,}){length}; memory planned for the new length"
    )


def schedule_line(e: dict[str, Any]) -> str:
    """The terminal's line for a `schedule_changed` event (a resume into a run of another length)."""
    decayed = (
        f"; the checkpoint is inside the old decay (from step {e['old_decay_start']:,}): the LR goes "
        "back up to the stable phase"
        if e.get("inside_old_decay")
        else ""
    )
    return (
        f"schedule: {e['schedule']} over {e['new_total']:,} steps (was {e['old_total']:,}); the "
        f"learning rate at step {e['step']:,} is {e['lr_at_resume_after']:.3g} (was "
        f"{e['lr_at_resume_before']:.3g}){decayed}"
    )


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _effective(config: dict[str, Any], key: str) -> Any:
    """A setting of a config.yaml as the trainer applies it; None where an older config.yaml lacks it."""
    section, name = key.split(".")
    model, train = config.get("model") or {}, config.get("train") or {}
    if key == "model.position_reset" and model.get("position_reset") is None:
        return train.get("document_masking")
    return (config.get(section) or {}).get(name)


def stage_change(path: Path, config: ResolvedConfig) -> dict[str, Any] | None:
    """The `stage_changed` event of a resume at another train.seq_len (a stage of context extension,
    docs/train.md), or None. Before any tensor is loaded, refused in one line where the run would not be well
    defined: a run whose length is counted in tokens (train.tokens, or the default) keeps its tokens per step,
    as train.global_batch_tokens does at any seq_len, so its remaining steps are the same; a run of
    train.max_steps may change them (the same sequences per step, longer). data.mixture's per-source counts are
    in windows of one length: not built for a change."""
    saved = _saved_config(path)
    before, t = (saved.get("train") or {}).get("seq_len"), config.train
    if before is None or before == t.seq_len:
        return None
    fix = f"resume at train.seq_len={before}, or start the stage as a new run.dir with model.init_from"
    if config.data.mixture:
        raise UsageError(
            f"train.seq_len: {t.seq_len} here, but checkpoint {path} read data.mixture in windows of "
            f"{before} tokens; a seq_len change is built for data.dir only: {fix}"
        )
    per_step = [
        _tokens_per_step(saved.get("train") or {}, saved.get("parallel") or {}),
        _tokens_per_step(dataclasses.asdict(t), dataclasses.asdict(config.parallel)),
    ]
    if per_step[0] != per_step[1] and t.max_steps is None and t.stage_tokens is None:
        raise UsageError(
            f"train.seq_len: {t.seq_len} here, {before} in checkpoint {path}, and the tokens per step "
            f"go from {per_step[0]:,} to {per_step[1]:,}, so the steps left to train.tokens would be "
            f"counted at the wrong batch; keep the batch in tokens (train.global_batch_tokens="
            f"{per_step[0]}), count the run in steps (train.max_steps) or give the stage its length "
            "(train.stage_tokens)"
        )
    return {
        "event": "stage_changed",
        "seq_len_before": before,
        "seq_len_after": t.seq_len,
        "tokens_per_step_before": per_step[0],
        "tokens_per_step_after": per_step[1],
    }


def stage_length(
    path: Path | str, config: ResolvedConfig, stage: dict[str, Any] | None, saved: dict[str, Any], total_steps: int
) -> dict[str, Any]:
    """The keys that give a new stage its length (a resume from `path`, whose trainer.json is `saved`, into a
    run of `total_steps`): with train.stage_tokens, the run ends that many tokens after the checkpoint, as the
    train.max_steps those tokens take at the stage's own tokens per step (the key itself is then spent, so that
    resuming the stage again is an ordinary resume). Refused in one line, before any tensor is loaded: a stage
    of nothing (a finished run resumed at a new seq_len without its length: it trained 0 steps and still logged
    the stage), and train.stage_tokens outside a new stage."""
    t = config.train
    if stage is None:
        if t.stage_tokens is not None:
            raise UsageError(
                "train.stage_tokens: the length of a new stage, given with --resume at another train.seq_len "
                f"(checkpoint {path} is at {t.seq_len}); a run's own length is train.tokens or train.max_steps"
                if path
                else "train.stage_tokens: the length of a stage begun by --resume at another train.seq_len; a "
                "new run's length is train.tokens or train.max_steps"
            )
        return {}
    if t.stage_tokens is None:
        if saved["step"] >= total_steps:
            raise UsageError(
                f"train.seq_len: checkpoint {path} finished its run (step {saved['step']:,} of {total_steps:,}): a "
                f"new stage at {t.seq_len} would train nothing; give it a length, train.stage_tokens=N (the "
                "tokens it trains)"
            )
        return {}
    # In steps of the stage's own batch, whatever the run was counted in before: well defined at any batch.
    steps = saved["step"] + math.ceil(t.stage_tokens / stage["tokens_per_step_after"])
    return {"train.max_steps": steps, "train.stage_tokens": None}


def _tokens_per_step(train: dict[str, Any], parallel: dict[str, Any]) -> int:
    """Tokens of one optimizer step (after any batch ramp) from a config's train and parallel sections."""
    data_parallel = parallel.get("gpus", 1) // (parallel.get("tensor", 1) * parallel.get("pipeline", 1))
    return train["micro_batch_size"] * train["seq_len"] * train["grad_accum_steps"] * data_parallel


def check_same_data_kind(path: Path, saved: dict[str, Any], data: DataConfig) -> None:
    """data.dir and data.mixture keep different reading states (a position in one permutation; a position and
    the windows drawn per source): a resume cannot switch between them."""

    def described(mixture, directory) -> str:
        if mixture:
            names = ", ".join(s["name"] for s in mixture_sources(DataConfig(mixture=mixture)))
            return f"data.mixture ({names})"
        return f"data.dir {directory}"

    if bool(saved.get("mixture")) != bool(data.mixture):
        then, now = described(saved.get("mixture"), saved.get("dir")), described(data.mixture, data.dir)
        raise UsageError(
            f"the checkpoint's data state is for {then}, but this run reads {now}; a resume continues "
            f"the data stream it started: resume with checkpoint {path}'s {then.split(' ')[0]} (drop the "
            "override), or start a new run.dir"
        )
