"""A token file changed under the run (data/token_files.py: truncated, deleted, replaced, rewritten): the run
stops as a preemption does, with a checkpoint of the last complete step, but with one line naming the source
and the fix, exit 2: it cannot go on until a person restores the data."""

from __future__ import annotations

from pathlib import Path

from ..checkpoint.format import set_rng_state
from ..data.token_files import DataChanged
from ..errors import UsageError


def stopped_by_data_change(trainer, error: DataChanged) -> UsageError:
    """Checkpoint the last complete step (a step the fault cut short is rewound first: its micro-batch count,
    data position and RNG as the step found them; the optimizer had not stepped) and return the one line.
    Under torchrun the other ranks may wait inside the step's collectives, so no rank writes: the newest
    checkpoint stands. With run.checkpoint_every=0 the run keeps none, here too."""
    st, run_dir = trainer.state, trainer.run_dir
    source = next(
        (
            f"data.mixture source {s['name']!r}"
            for s in trainer.mixture or []
            if Path(s["data"].path) in error.path.parents
        ),
        "data.dir",
    )
    fix = (
        f"restore it as it was (or prepare the source again from the same inputs) and resume: pretrain train "
        f"--resume {run_dir}"
    )
    event = {
        "event": "data_changed",
        "step": st.step,
        "tokens": st.tokens,
        "source": source,
        "file": str(error.path),
        "path": None,
    }
    if trainer.rt.distributed or not trainer.config.run.checkpoint_every:
        why = "run.checkpoint_every=0" if not trainer.config.run.checkpoint_every else "the newest one stands"
        trainer.log.event(event)
        return UsageError(f"{source}: {error}; stopped at step {st.step:,} without a checkpoint ({why}); {fix}")
    if trainer.in_step is not None:
        st.micro_batches, data, rng = trainer.in_step
        trainer.batches.load_state_dict(data)
        if rng is not None:
            set_rng_state(rng)
    path = trainer.checkpoints.saved_now() or trainer.save()
    trainer.log.event({**event, "path": str(path)})
    return UsageError(f"{source}: {error}; stopped after step {st.step:,} with checkpoint {path}; {fix}")
