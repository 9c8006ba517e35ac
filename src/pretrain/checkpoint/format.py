"""A checkpoint's files: the layout, the atomic checksummed write, `verify`, and the loads of its parts.

Layout of RUN_DIR/checkpoints/step_00000100/:
  state/               model and optimizer, torch.distributed.checkpoint (sharded under FSDP, one file
                       per rank, and `.metadata`; loads onto any number of ranks)
  trainer.json         step, tokens, data-loader position, schedule and stability state, version, "good"
  rng_rank{r}.pt       RNG states of every rank (torch, CUDA, numpy, python)
  config.yaml          the resolved config of the run
  manifest.json        sha256 and size of every file above, each hashed by the rank that wrote it (rank 0
                       gathers them and writes the manifest last)
A checkpoint is written into `step_N.tmp/` and renamed to `step_N/` only when complete, so a crash at any
moment leaves either the previous checkpoint or a `.tmp` directory that the next run deletes (run_dir.py).

Every reader (resume, rollback, export, generate, `load_model`: choice.py) goes through `verify`: the manifest
must exist, list every file the format requires and every file present, and each must match its size and
sha256. A corrupt checkpoint is never used, deleted or written over: a resume takes the newest one that
verifies and sets the corrupt ones after it aside as `step_N.corrupt/` (run_dir.py, kept for a person to look
at); when none verifies, the resume stops. Only directories named `step_` + 8 digits are checkpoints;
anything else in checkpoints/ is left alone, with one warning.
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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
import yaml

from ..files import sha256_file

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig

PREFIX = "step_"
CHECKPOINT_NAME = re.compile(r"step_(\d{8})")
# What this module itself leaves in checkpoints/: partial writes, deletions under way, corrupt ones set aside.
OWN_NAME = re.compile(r"step_\d{8}(\.tmp|\.removed\.tmp|\.corrupt(-\d+)?)")
# Files every checkpoint has, whatever the number of ranks (the manifest lists these and every other file).
REQUIRED_FILES = ("trainer.json", "config.yaml", "state/.metadata", "rng_rank0.pt")


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{PREFIX}{step:08d}"


def config_yaml(config: ResolvedConfig) -> str:
    """config.yaml's text, in every checkpoint and in the run directory: the resolved config, sections and keys
    in the schema's order."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False)


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != "manifest.json")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_initialized():  # this rank's own device only: a resume may see fewer (or other) GPUs
        state["cuda_device"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda_device" in state and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda_device"])


# DCP runs without a process group when none is initialised (one process) and says so each time.
warnings.filterwarnings("ignore", message="torch.distributed is .*unavailable or uninitialized")
# torch 2.6's DCP file writer still calls tensor.storage(), which warns on every save.
warnings.filterwarnings("ignore", message="TypedStorage is deprecated", module="torch.distributed.checkpoint")


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    state_dict: dict[str, Any],
    trainer: dict[str, Any],
    config_yaml: str,
    rank: int = 0,
    barrier: Callable[[], None] = lambda: None,
    gather: Callable[[Any], list[Any] | None] = lambda value: [value],
    fail_disk_full: bool = False,
    pause: float = 0.0,
) -> Path:
    """Write checkpoint `step` atomically. `state_dict` holds the model/optimizer state (DCP-ready).
    `gather(value)`: every rank's value on rank 0, in rank order (runtime.gather_to_main).
    `fail_disk_full` and `pause` are fault injection for tests: the write fails half-way as on a full disk,
    or waits half-way so that a test can kill the process there. A write that fails leaves no `.tmp` behind
    and raises its OSError (contents.py says a full disk in one line)."""
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
        # Each rank hashes the files it wrote, all at once: rank 0 hashing a 70B model's shards alone would
        # keep the other ranks at the next collective past NCCL's timeout.
        hashed = gather(checksums(tmp, own_files(tmp, rank)))
        if rank == 0:
            assert hashed is not None  # rank 0 is where gather puts every rank's part
            _write_json(tmp / "trainer.json", trainer)
            (tmp / "config.yaml").write_text(config_yaml)
            hashed = {name: entry for part in hashed for name, entry in part.items()}
            rest = [p for p in _files(tmp) if str(p.relative_to(tmp)) not in hashed]  # .metadata, trainer.json ...
            hashed.update(checksums(tmp, rest))
            manifest = {str(p.relative_to(tmp)): hashed[str(p.relative_to(tmp))] for p in _files(tmp)}
            _write_json(tmp / "manifest.json", {"step": step, "files": manifest})
            _fsync_dir(tmp)
            if final.exists():  # a checkpoint of the same step from an earlier attempt: replace it
                discard(final)
            os.rename(tmp, final)
            _fsync_dir(final.parent)
        barrier()
    except OSError:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def own_files(directory: Path, rank: int) -> list[Path]:
    """The files of a checkpoint being written that `rank` wrote: its RNG states and its DCP data files
    (FileSystemWriter names rank r's files state/__r_N.distcp). Rank 0 hashes whatever no rank claims."""
    return [directory / f"rng_rank{rank}.pt", *sorted((directory / "state").glob(f"__{rank}_*.distcp"))]


def checksums(directory: Path, files: list[Path]) -> dict[str, dict[str, Any]]:
    """{path relative to `directory`: {"sha256", "bytes"}}: the manifest's entries of these files."""
    return {str(p.relative_to(directory)): {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in files}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def step_of(path: Path) -> int:
    match = CHECKPOINT_NAME.fullmatch(path.name)
    if match is None:
        raise ValueError(f"{path} is not a checkpoint directory (step_ and 8 digits)")
    return int(match.group(1))


_warned_stray: set[Path] = set()


def list_checkpoints(run_dir: str | Path) -> list[Path]:
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
        warnings.warn(
            f"ignoring {', '.join(sorted(stray))} in {root}: only step_NNNNNNNN directories are checkpoints",
            stacklevel=2,
        )
    return sorted(found, key=step_of)


def share_of(sizes: dict[str, int], rank: int, world: int) -> set[str]:
    """The files rank `rank` of `world` hashes when the ranks verify a checkpoint together: the largest first,
    each to the rank with the fewest bytes so far (ties: the lowest), so each file is read once and every rank
    reads about 1/world of the bytes (a 70B checkpoint is 0.85 TB)."""
    loads, mine = [0] * world, set()
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        r = loads.index(min(loads))
        loads[r] += sizes[name]
        if r == rank:
            mine.add(name)
    return mine


def verify(path: str | Path, share: tuple[int, int] = (0, 1)) -> str | None:
    """None when the checkpoint is complete and intact, else the reason: the manifest must exist, list
    every file the format requires and every file present, and each file must match its size and sha256.
    `share` (rank, world): ranks verifying together each hash their `share_of` the files only (the rest is
    checked on every rank); the caller combines their verdicts (one rank alone: every file)."""
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
    hashed = share_of(sizes, *share)
    for name in files:
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != sizes[name]:
            return f"{name} has {f.stat().st_size} bytes, expected {sizes[name]}"
        if name in hashed and sha256_file(f) != sums[name]:
            return f"{name} fails its sha256 checksum"
    return None


def _loaded(rel: str) -> bool:
    """A file some loader reads: the required ones, DCP's state/, an RNG file of any rank."""
    return rel in REQUIRED_FILES or rel.startswith("state/") or re.fullmatch(r"rng_rank\d+\.pt", rel) is not None


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / "trainer.json").read_text())


def discard(path: Path) -> None:
    """Delete a checkpoint so that a crash half-way leaves a `.tmp` directory, never a broken `step_N/`."""
    doomed = path.with_name(path.name + ".removed.tmp")
    shutil.rmtree(doomed, ignore_errors=True)
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def load_state(path: str | Path, state_dict: dict[str, Any]) -> None:
    """Fill `state_dict` (model/optimizer, as built for this run's layout) from a checkpoint in place."""
    dcp.load(state_dict, checkpoint_id=str(Path(path) / "state"))


def load_rng(path: str | Path, rank: int) -> None:
    f = Path(path) / f"rng_rank{rank}.pt"
    if f.exists():  # resumed on more ranks than were saved: the new ranks keep their fresh seeds
        set_rng_state(torch.load(f, weights_only=False))
