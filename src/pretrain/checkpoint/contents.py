"""What a checkpoint holds, saved and loaded as one: the run's stateful parts.

  tensors    model + optimizer (+ loss scaler): torch.distributed.checkpoint, sharded as the run holds them
  counters   the trainer's few numbers (step, tokens, ...): the top level of trainer.json
  parts      small named states (the data position, the spike detector): trainer.json[name]
  RNG        every rank's generators, one file per rank
The on-disk format (atomic, checksummed) is format.py's, which checkpoints a run keeps choice.py's. A resume
loads everything; a rollback loads everything except the data position and the RNG (the run goes on past the
bad data). `load_model` reads the model alone, for export, generate and a user's script.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from .. import __version__
from ..distributed.runtime import barrier, gather_to_main
from ..errors import UsageError
from .choice import latest_checkpoint, resolve_checkpoint
from .format import checkpoint_dir, config_yaml, load_rng, load_state, read_trainer_state, save_checkpoint

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig
    from ..distributed.engines import Parallelized
    from ..distributed.runtime import Runtime


class Stateful(Protocol):
    """A part of the run a checkpoint saves: its state as a dict, and back."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any], /) -> None: ...


class Counters(Stateful, Protocol):
    """The trainer's counters (train/state.py's TrainState): saved at the top level of trainer.json."""

    step: int


class TensorState:
    """Model + optimizer (+ the fp16 loss scaler): the tensors of a checkpoint."""

    def __init__(self, engine: Parallelized, scaler: torch.amp.GradScaler | None) -> None:
        self.engine, self.scaler = engine, scaler

    def state_dict(self) -> dict[str, Any]:
        sd = self.engine.state_dict()
        if self.scaler is not None:
            sd["scaler"] = self.scaler.state_dict()
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.engine.load_state_dict(sd)
        if self.scaler is not None and "scaler" in sd:
            self.scaler.load_state_dict(sd["scaler"])


class Checkpoints:
    """A run's checkpoints as the trainer writes and reads them: every stateful part, as one."""

    def __init__(
        self,
        run_dir: str | Path,
        rt: Runtime,
        tensors: TensorState,
        counters: Counters,
        parts: dict[str, Stateful],
        config: ResolvedConfig,
        total_steps: int,
        warmup_steps: int,
    ) -> None:
        self.run_dir, self.rt = Path(run_dir), rt
        self.tensors, self.counters, self.parts = tensors, counters, parts
        self.config_yaml = config_yaml(config)
        self.total_steps, self.warmup_steps = total_steps, warmup_steps  # the schedule a resume continues
        self.debug = config.debug
        self.last_saved: tuple[int, Path] | None = None

    def save(self, good: bool) -> Path:
        """Write the checkpoint of the current step (all ranks call this)."""
        step = self.counters.step
        trainer = {
            **self.counters.state_dict(),
            **{name: part.state_dict() for name, part in self.parts.items()},
            "good": good,
            "version": __version__,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
        }
        try:
            path = save_checkpoint(
                self.run_dir,
                step,
                self.tensors.state_dict(),
                trainer,
                self.config_yaml,
                rank=self.rt.rank,
                barrier=lambda: barrier(self.rt),
                gather=lambda value: gather_to_main(value, self.rt),
                # the tests' fault injection (see format.save_checkpoint)
                fail_disk_full=step == self.debug.inject_disk_full_step > 0,
                pause=self.debug.checkpoint_sleep,
            )
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise self._disk_full(step) from None
            raise
        self.last_saved = (step, path)
        return path

    def _disk_full(self, step: int) -> UsageError:
        """The one line of a checkpoint that found the disk full (its partial write already removed)."""
        previous = latest_checkpoint(self.run_dir)
        kept = f"the previous checkpoint {previous.name} is intact" if previous else "no earlier checkpoint"
        return UsageError(
            f"disk full while writing checkpoint {checkpoint_dir(self.run_dir, step)}; {kept}; free space and "
            f"resume with `pretrain train --resume {self.run_dir}`"
        )

    def saved_now(self) -> Path | None:
        """The checkpoint of the current step, if one was written."""
        if self.last_saved and self.last_saved[0] == self.counters.step:
            return self.last_saved[1]
        return None

    def load(self, path: Path, skip: tuple[str, ...] = ()) -> dict[str, Any]:
        """Restore every part from `path`, except those named in `skip` ("rng" or a part's name); returns the
        saved trainer.json."""
        sd = self.tensors.state_dict()
        load_state(path, sd)
        self.tensors.load_state_dict(sd)
        saved = read_trainer_state(path)
        self.counters.load_state_dict(saved)
        for name, part in self.parts.items():
            if name not in skip:
                part.load_state_dict(saved[name])
        if "rng" not in skip:
            load_rng(path, self.rt.rank)
        self.last_saved = None
        return saved


def load_model(path: str | Path, device: str = "cpu") -> torch.nn.Module:
    """Our model from a run directory (its newest checkpoint) or one checkpoint, in eval mode."""
    import yaml

    from ..config import load_config
    from ..model import build_model

    checkpoint = resolve_checkpoint(path)
    raw = yaml.safe_load((checkpoint / "config.yaml").read_text())
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
    load_state(checkpoint, state)
    model.load_state_dict(state["model"])
    # The whole run config (data directory, tokenizer) for export and generate. The ignore: torch types
    # nn.Module.__setattr__ for tensors and modules only, yet any other value is a plain attribute.
    model.training_config = config  # pyright: ignore[reportArgumentType]
    return model.eval()
