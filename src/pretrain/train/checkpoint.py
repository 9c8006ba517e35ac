"""Checkpoints that survive crashes: atomic, checksummed, resumable on another number of ranks.

Layout of RUN_DIR/checkpoints/step_00000100/:
  state/               model and optimizer, torch.distributed.checkpoint (sharded under FSDP, one file
                       per rank, and `.metadata`; loads onto any number of ranks)
  trainer.json         step, tokens, data-loader position, schedule and stability state, version, "good"
  rng_rank{r}.pt       RNG states of every rank (torch, CUDA, numpy, python)
  config.yaml          the resolved config of the run
  manifest.json        sha256 and size of every file above; written last
A checkpoint is written into `step_N.tmp/` and renamed to `step_N/` only when complete, so a crash at any
moment leaves either the previous checkpoint or a `.tmp` directory that the next run deletes.

Every reader (resume, rollback, export, generate, `load_model`) goes through `verify`: the manifest must exist,
list every file the format requires and every file present, and each must match its size and sha256. A
corrupt checkpoint is never used, deleted or written over: a resume takes the newest one that verifies and
renames the corrupt ones after it to `step_N.corrupt/` (kept for a person to look at); when none verifies,
the resume stops. Only directories named `step_` + 8 digits are checkpoints; anything else in checkpoints/
is left alone, with one warning.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp

from ..errors import UsageError
from ..files import sha256_file

PREFIX = "step_"
CHECKPOINT_NAME = re.compile(r"step_(\d{8})")
# What this module itself leaves in checkpoints/: partial writes, deletions under way, corrupt ones set aside.
OWN_NAME = re.compile(r"step_\d{8}(\.tmp|\.removed\.tmp|\.corrupt(-\d+)?)")
# Files every checkpoint has, whatever the number of ranks (the manifest lists these and every other file).
REQUIRED_FILES = ("trainer.json", "config.yaml", "state/.metadata", "rng_rank0.pt")


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{PREFIX}{step:08d}"


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != "manifest.json")


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_initialized():  # this rank's own device only: a resume may see fewer (or other) GPUs
        state["cuda_device"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda_device" in state and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda_device"])


# DCP runs without a process group when none is initialised (one process) and says so each time.
warnings.filterwarnings("ignore", message="torch.distributed is .*unavailable or uninitialized")
# torch 2.6's DCP file writer still calls tensor.storage(), which warns on every save.
warnings.filterwarnings("ignore", message="TypedStorage is deprecated", module="torch.distributed.checkpoint")


def save_checkpoint(run_dir, step: int, state_dict: dict, trainer: dict, config_yaml: str, rank: int = 0,
                    barrier=lambda: None, fail_disk_full: bool = False, pause: float = 0.0) -> Path:
    """Write checkpoint `step` atomically. `state_dict` holds the model/optimizer state (DCP-ready).
    `fail_disk_full` and `pause` are fault injection for tests: the write fails half-way as on a full disk,
    or waits half-way so that a test can kill the process there."""
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    try:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        barrier()
        dcp.save(state_dict, checkpoint_id=str(tmp / "state"))
        torch.save(rng_state(), tmp / f"rng_rank{rank}.pt")
        if fail_disk_full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))
        time.sleep(pause)
        barrier()
        if rank == 0:
            _write_json(tmp / "trainer.json", trainer)
            (tmp / "config.yaml").write_text(config_yaml)
            manifest = {str(p.relative_to(tmp)): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
                        for p in _files(tmp)}
            _write_json(tmp / "manifest.json", {"step": step, "files": manifest})
            _fsync_dir(tmp)
            if final.exists():  # a checkpoint of the same step from an earlier attempt: replace it
                _discard(final)
            os.rename(tmp, final)
            _fsync_dir(final.parent)
        barrier()
    except OSError as e:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if e.errno == errno.ENOSPC:
            previous = latest_checkpoint(run_dir)
            kept = f"the previous checkpoint {previous.name} is intact" if previous else "no earlier checkpoint"
            raise UsageError(f"disk full while writing checkpoint {final}; {kept}; free space and resume "
                             f"with `pretrain train --resume {run_dir}`") from None
        raise
    return final


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def step_of(path: Path) -> int:
    return int(CHECKPOINT_NAME.fullmatch(path.name).group(1))


_warned_stray: set[Path] = set()


def list_checkpoints(run_dir) -> list[Path]:
    """The checkpoint directories of a run (`step_` + 8 digits), oldest first, verified or not. Other entries
    of checkpoints/ (a user's `step_00000006_backup/`, notes) are ignored, with one warning per process."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found, stray = [], []
    for p in root.iterdir():
        if p.is_dir() and CHECKPOINT_NAME.fullmatch(p.name):
            found.append(p)
        elif not OWN_NAME.fullmatch(p.name):
            stray.append(p.name)
    if stray and root not in _warned_stray:
        _warned_stray.add(root)
        warnings.warn(f"ignoring {', '.join(sorted(stray))} in {root}: only step_NNNNNNNN directories are "
                      "checkpoints", stacklevel=2)
    return sorted(found, key=step_of)


def remove_partial(run_dir) -> list[Path]:
    """Delete `.tmp` directories a crash left behind (only rank 0 calls this)."""
    root = Path(run_dir) / "checkpoints"
    partial = [p for p in root.glob(f"{PREFIX}*.tmp")] if root.is_dir() else []
    for p in partial:
        shutil.rmtree(p, ignore_errors=True)
    return partial


def verify(path: Path) -> str | None:
    """None when the checkpoint is complete and intact, else the reason: the manifest must exist, list
    every file the format requires and every file present, and each file must match its size and sha256."""
    path = Path(path)
    if not (path / "manifest.json").is_file():
        return "no manifest.json (a checkpoint is complete only once its manifest is written)"
    try:
        manifest = json.loads((path / "manifest.json").read_text())
        files = manifest["files"]
        sizes = {name: int(entry["bytes"]) for name, entry in files.items()}
        sums = {name: str(entry["sha256"]) for name, entry in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"unreadable manifest.json ({type(e).__name__}: {e})"
    if CHECKPOINT_NAME.fullmatch(path.name) and manifest.get("step") != step_of(path):
        return f"manifest.json is of step {manifest.get('step')}, not of step {step_of(path)}"
    for name in REQUIRED_FILES:
        if name not in files:
            return f"manifest.json does not list {name}"
    for name in _files(path):
        rel = str(name.relative_to(path))
        if rel not in files and _loaded(rel):  # a file a loader reads must be vouched for; a note need not
            return f"{rel} is not listed in manifest.json"
    for name in files:
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != sizes[name]:
            return f"{name} has {f.stat().st_size} bytes, expected {sizes[name]}"
        if sha256_file(f) != sums[name]:
            return f"{name} fails its sha256 checksum"
    return None


def _loaded(rel: str) -> bool:
    """A file some loader reads: the required ones, DCP's state/, an RNG file of any rank."""
    return rel in REQUIRED_FILES or rel.startswith("state/") or re.fullmatch(r"rng_rank\d+\.pt", rel) is not None


def read_trainer_state(path: Path) -> dict:
    return json.loads((Path(path) / "trainer.json").read_text())


def latest_checkpoint(run_dir, good_only: bool = False, before_step: int | None = None,
                      check: bool = True) -> Path | None:
    """Newest checkpoint that verifies (optionally: written while no loss spike was active)."""
    for path in reversed(list_checkpoints(run_dir)):
        if before_step is not None and step_of(path) > before_step:
            continue
        if check:
            problem = verify(path)
            if problem:
                warnings.warn(f"checkpoint {path} is corrupt ({problem}); using the one before it", stacklevel=2)
                continue
        if good_only and not read_trainer_state(path).get("good", True):
            continue
        return path
    return None


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
        raise UsageError(f"every checkpoint in {Path(run_dir) / 'checkpoints'} is corrupt ({len(corrupt)}; the "
                         f"newest, {newest.name}: {why}); nothing was changed and training did not restart from "
                         "step 0: restore a checkpoint from a backup, or start over with another run.dir")
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
        warnings.warn(f"checkpoint {path} is corrupt ({why}); kept as {target.name}, resuming from the one "
                      "before it", stacklevel=2)
        moved.append(target)
    return moved


# The model keys that decide which tensors exist and their shapes (the rest: dropout, init, RoPE base, ...
# may change on a resume). max_seq_len sizes GPT-2's position table only: a LLaMA may extend its context.
SHAPE_KEYS = ("family", "vocab_size", "pad_vocab_to", "hidden_size", "intermediate_size", "num_layers",
              "num_heads", "num_kv_heads", "head_dim", "max_seq_len", "tie_embeddings", "qkv_bias", "bias")


def check_resume_compatible(path: Path, config) -> None:
    """A resume must build the model the checkpoint holds: compare the checkpoint's own (verified)
    config.yaml with the resumed config before any tensor is loaded, and name the first key that differs."""
    import yaml

    saved = (yaml.safe_load((Path(path) / "config.yaml").read_text()) or {}).get("model") or {}
    now = config.to_dict()["model"]
    for key in SHAPE_KEYS:
        if key == "max_seq_len" and saved.get("family") != "gpt2":
            continue
        if key in saved and saved[key] != now.get(key):
            raise UsageError(f"model.{key}: {now.get(key)!r} here, but checkpoint {path} was trained with "
                             f"{saved[key]!r}; a resume keeps the model's shape: drop the override, or start a "
                             "new run.dir")


def _ours(path: Path) -> bool:
    """A checkpoint this code wrote (it has a manifest): the only kind pruning may delete."""
    return (path / "manifest.json").is_file()


def prune(run_dir, keep: int) -> None:
    """Keep the newest `keep` checkpoints, and always the newest good one (rollback target)."""
    complete = [p for p in list_checkpoints(run_dir) if _ours(p)]
    keep_set = set(complete[-keep:])
    for path in reversed(complete):
        if read_trainer_state(path).get("good", True):
            keep_set.add(path)
            break
    for path in complete:
        if path not in keep_set:
            _discard(path)


def remove_after(run_dir, step: int) -> None:
    """Delete the checkpoints newer than `step` (a rollback abandons the steps that wrote them)."""
    for path in list_checkpoints(run_dir):
        if step_of(path) > step and _ours(path):
            _discard(path)


def _discard(path: Path) -> None:
    """Delete a checkpoint so that a crash half-way leaves a `.tmp` directory, never a broken `step_N/`."""
    doomed = path.with_name(path.name + ".removed.tmp")
    shutil.rmtree(doomed, ignore_errors=True)
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def load_state(path: Path, state_dict: dict) -> None:
    """Fill `state_dict` (model/optimizer, as built for this run's layout) from a checkpoint in place."""
    dcp.load(state_dict, checkpoint_id=str(Path(path) / "state"))


def load_rng(path: Path, rank: int) -> None:
    f = Path(path) / f"rng_rank{rank}.pt"
    if f.exists():  # resumed on more ranks than were saved: the new ranks keep their fresh seeds
        set_rng_state(torch.load(f, weights_only=False))


def resolve_checkpoint(path) -> Path:
    """A checkpoint directory, or the newest one of a run directory that verifies. The one verification
    path of every reader: a checkpoint named directly is refused if it fails, as one of a run is skipped."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist; give a run directory or one of its checkpoints")
    named = CHECKPOINT_NAME.fullmatch(path.name) or (path / "manifest.json").exists() or \
        (path / "trainer.json").exists()
    if named:
        problem = verify(path)
        if problem:
            raise UsageError(f"checkpoint {path} fails verification: {problem}; give another checkpoint, or the "
                             "run directory (its newest checkpoint that verifies)")
        return path
    found = latest_checkpoint(path)
    if found is None:
        if list_checkpoints(path):
            raise UsageError(f"every checkpoint in {path / 'checkpoints'} is corrupt (the warnings above say "
                             "why); restore one from a backup")
        raise UsageError(f"{path} holds no complete checkpoint; train with run.checkpoint_every or wait "
                         "for the first checkpoint")
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
    model = build_model(config.model, attention=config.train.attention, device=device, loss=config.train.loss,
                        loss_chunk_tokens=config.train.loss_chunk_tokens)
    state = {"model": model.state_dict()}
    load_state(ckpt, state)
    model.load_state_dict(state["model"])
    model.run_config = config  # the whole run config (data directory, tokenizer) for export and generate
    return model.eval()
