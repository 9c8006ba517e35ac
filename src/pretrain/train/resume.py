"""Which checkpoint a reader uses, and whether it may: a resume's starting point (corrupt ones set aside,
never trained over), a rollback's target, the checkpoint export and generate read, `load_model`. Every one
goes through checkpoint.verify; the on-disk format itself is checkpoint.py's."""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path

import torch

from ..errors import UsageError
from .checkpoint import CHECKPOINT_NAME, latest_checkpoint, list_checkpoints, load_state, verify


def resume_point(run_dir) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the checkpoint a resume continues from, [(corrupt checkpoint newer than it, why)]), warning nothing.
    (None, []) when the run has no checkpoint at all; UsageError when it has some and none verifies: a
    restart from step 0 would write over them."""
    corrupt = []
    for path in reversed(list_checkpoints(run_dir)):
        problem = verify(path)
        if problem is None:
            return path, corrupt
        corrupt.append((path, problem))
    if corrupt:
        newest, why = corrupt[0]
        raise UsageError(
            f"every checkpoint in {Path(run_dir) / 'checkpoints'} is corrupt ({len(corrupt)}; the "
            f"newest, {newest.name}: {why}); nothing was changed and training did not restart from "
            "step 0: restore a checkpoint from a backup, or start over with another run.dir"
        )
    return None, []


def set_aside(corrupt: list[tuple[Path, str]]) -> list[Path]:
    """Rename corrupt checkpoints to `step_N.corrupt/` with a warning each (rank 0, before the run goes on):
    kept for a person to look at, never pruned, never replaced by a new checkpoint of the same step."""
    moved = []
    for path, why in corrupt:
        target = path.with_name(path.name + ".corrupt")
        n = 1
        while target.exists():
            n += 1
            target = path.with_name(f"{path.name}.corrupt-{n}")
        os.rename(path, target)
        warnings.warn(
            f"checkpoint {path} is corrupt ({why}); kept as {target.name}, resuming from the one before it",
            stacklevel=2,
        )
        moved.append(target)
    return moved


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


def _saved_config(path: Path) -> dict:
    import yaml

    return yaml.safe_load((Path(path) / "config.yaml").read_text()) or {}


def check_resume_compatible(path: Path, config) -> None:
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


def stage_change(path: Path, config) -> dict | None:
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
    if per_step[0] != per_step[1] and t.max_steps is None:
        raise UsageError(
            f"train.seq_len: {t.seq_len} here, {before} in checkpoint {path}, and the tokens per step "
            f"go from {per_step[0]:,} to {per_step[1]:,}, so the steps left to train.tokens would be "
            f"counted at the wrong batch; keep the batch in tokens (train.global_batch_tokens="
            f"{per_step[0]}) or count the run in steps (train.max_steps)"
        )
    return {
        "event": "stage_changed",
        "seq_len_before": before,
        "seq_len_after": t.seq_len,
        "tokens_per_step_before": per_step[0],
        "tokens_per_step_after": per_step[1],
    }


def _tokens_per_step(train: dict, parallel: dict) -> int:
    """Tokens of one optimizer step (after any batch ramp) from a config's train and parallel sections."""
    data_parallel = parallel.get("gpus", 1) // (parallel.get("tensor", 1) * parallel.get("pipeline", 1))
    return train["micro_batch_size"] * train["seq_len"] * train["grad_accum_steps"] * data_parallel


def check_same_data_kind(path: Path, saved: dict, data) -> None:
    """data.dir and data.mixture keep different reading states (a position in one permutation; a position and
    the windows drawn per source): a resume cannot switch between them."""
    from ..config import mixture_sources
    from ..config.schema import DataConfig

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


def resolve_checkpoint(path) -> Path:
    """A checkpoint directory, or the newest one of a run directory that verifies. The one verification
    path of every reader: a checkpoint named directly is refused if it fails, as one of a run is skipped."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist; give a run directory or one of its checkpoints")
    named = (
        CHECKPOINT_NAME.fullmatch(path.name) or (path / "manifest.json").exists() or (path / "trainer.json").exists()
    )
    if named:
        problem = verify(path)
        if problem:
            raise UsageError(
                f"checkpoint {path} fails verification: {problem}; give another checkpoint, or the "
                "run directory (its newest checkpoint that verifies)"
            )
        return path
    found = latest_checkpoint(path)
    if found is None:
        if list_checkpoints(path):
            raise UsageError(
                f"every checkpoint in {path / 'checkpoints'} is corrupt (the warnings above say "
                "why); restore one from a backup"
            )
        raise UsageError(
            f"{path} holds no complete checkpoint; train with run.checkpoint_every or wait for the first checkpoint"
        )
    return found


def load_model(path, device: str = "cpu") -> torch.nn.Module:
    """Our model from a run directory (its newest checkpoint) or one checkpoint, in eval mode."""
    from ..config import load_config
    from ..model import build_model

    ckpt = resolve_checkpoint(path)
    import yaml

    raw = yaml.safe_load((ckpt / "config.yaml").read_text())
    raw["model"]["hf_config"] = None  # every model key is saved resolved: the source may be gone or relative
    config = load_config(raw)
    model = build_model(
        config.model,
        attention=config.train.attention,
        device=device,
        loss=config.train.loss,
        loss_chunk_tokens=config.train.loss_chunk_tokens,
    )
    state = {"model": model.state_dict()}
    load_state(ckpt, state)
    model.load_state_dict(state["model"])
    model.training_config = config  # the whole run config (data directory, tokenizer) for export and generate
    return model.eval()
