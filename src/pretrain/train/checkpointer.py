"""What a checkpoint holds, saved and loaded as one: the run's stateful parts.

  tensors    model + optimizer (+ loss scaler): torch.distributed.checkpoint, sharded as the run holds them
  counters   the trainer's few numbers (step, tokens, ...): the top level of trainer.json
  parts      small named states (the data position, the spike detector): trainer.json[name]
  RNG        every rank's generators, one file per rank
The on-disk format (atomic, checksummed, pruned) is `checkpoint.py`'s. A resume loads everything; a
rollback loads everything except the data position and the RNG (the run goes on past the bad data).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from .. import __version__
from ..distributed.runtime import barrier, gather_to_main
from . import checkpoint as ckpt


class Checkpointer:
    def __init__(self, run_dir, rt, tensors, counters, parts: dict, config, total_steps: int, warmup_steps: int):
        self.run_dir, self.rt = Path(run_dir), rt
        self.tensors, self.counters, self.parts = tensors, counters, parts
        self.config_yaml = yaml.safe_dump(config.to_dict(), sort_keys=False)
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
        path = ckpt.save_checkpoint(
            self.run_dir,
            step,
            self.tensors.state_dict(),
            trainer,
            self.config_yaml,
            rank=self.rt.rank,
            barrier=lambda: barrier(self.rt),
            gather=lambda value: gather_to_main(value, self.rt),
            # the tests' fault injection (see checkpoint.save_checkpoint)
            fail_disk_full=step == self.debug.inject_disk_full_step > 0,
            pause=self.debug.checkpoint_sleep,
        )
        self.last_saved = (step, path)
        return path

    def saved_now(self) -> Path | None:
        """The checkpoint of the current step, if one was written."""
        if self.last_saved and self.last_saved[0] == self.counters.step:
            return self.last_saved[1]
        return None

    def load(self, path: Path, skip: tuple[str, ...] = ()) -> dict:
        """Restore every part from `path`, except those named in `skip` ("rng" or a part's name); returns the
        saved trainer.json."""
        sd = self.tensors.state_dict()
        ckpt.load_state(path, sd)
        self.tensors.load_state_dict(sd)
        saved = ckpt.read_trainer_state(path)
        self.counters.load_state_dict(saved)
        for name, part in self.parts.items():
            if name not in skip:
                part.load_state_dict(saved[name])
        if "rng" not in skip:
            ckpt.load_rng(path, self.rt.rank)
        self.last_saved = None
        return saved
