"""Checkpoints that survive crashes: atomic, checksummed, resumable on another number of ranks.

Layout of RUN_DIR/checkpoints/step_00000100/:
  state/               model and optimizer, torch.distributed.checkpoint (sharded under FSDP, one file
                       per rank; loads onto any number of ranks)
  trainer.json         step, tokens, data-loader position, schedule and stability state, version, "good"
  rng_rank{r}.pt       RNG states of every rank (torch, CUDA, numpy, python)
  config.yaml          the resolved config of the run
  manifest.json        sha256 and size of every file above; written last
A checkpoint is written into `step_N.tmp/` and renamed to `step_N/` only when complete, so a crash at any
moment leaves either the previous checkpoint or a `.tmp` directory that the next run deletes. Loading verifies
the manifest; a corrupt checkpoint is skipped (with a warning) for the one before it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp

from ..errors import UsageError

PREFIX = "step_"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{PREFIX}{step:08d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


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
            manifest = {str(p.relative_to(tmp)): {"sha256": _sha256(p), "bytes": p.stat().st_size}
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


def list_checkpoints(run_dir) -> list[Path]:
    """Complete checkpoint directories (renamed, with a manifest), oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and not p.name.endswith(".tmp")
             and (p / "manifest.json").exists()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def remove_partial(run_dir) -> list[Path]:
    """Delete `.tmp` directories a crash left behind (only rank 0 calls this)."""
    root = Path(run_dir) / "checkpoints"
    partial = [p for p in root.glob(f"{PREFIX}*.tmp")] if root.is_dir() else []
    for p in partial:
        shutil.rmtree(p, ignore_errors=True)
    return partial


def verify(path: Path) -> str | None:
    """None when every file matches the manifest, else the reason."""
    try:
        manifest = json.loads((path / "manifest.json").read_text())["files"]
    except (OSError, ValueError, KeyError) as e:
        return f"unreadable manifest ({e})"
    for name, entry in manifest.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != entry["bytes"]:
            return f"{name} has {f.stat().st_size} bytes, expected {entry['bytes']}"
        if _sha256(f) != entry["sha256"]:
            return f"{name} fails its sha256 checksum"
    return None


def read_trainer_state(path: Path) -> dict:
    return json.loads((Path(path) / "trainer.json").read_text())


def latest_checkpoint(run_dir, good_only: bool = False, before_step: int | None = None,
                      check: bool = True) -> Path | None:
    """Newest complete checkpoint that verifies (optionally: written while no loss spike was active)."""
    for path in reversed(list_checkpoints(run_dir)):
        step = int(path.name[len(PREFIX):])
        if before_step is not None and step > before_step:
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


def prune(run_dir, keep: int) -> None:
    """Keep the newest `keep` checkpoints, and always the newest good one (rollback target)."""
    complete = list_checkpoints(run_dir)
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
        if int(path.name[len(PREFIX):]) > step:
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
    """A checkpoint directory, or the newest complete one of a run directory."""
    path = Path(path)
    if (path / "manifest.json").exists():
        return path
    if not path.exists():
        raise UsageError(f"{path} does not exist; give a run directory or one of its checkpoints")
    found = latest_checkpoint(path)
    if found is None:
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
    model = build_model(config.model, attention=config.train.attention, device=device)
    state = {"model": model.state_dict()}
    load_state(ckpt, state)
    model.load_state_dict(state["model"])
    model.run_config = config  # the whole run config (data directory, tokenizer) for export and generate
    return model.eval()
