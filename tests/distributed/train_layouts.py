"""Train each of several layouts for a few steps in one torchrun (one process group, one start-up of torch):

    python -m torch.distributed.run --nproc-per-node N tests/distributed/train_layouts.py JOB.json

JOB.json: {"base": [overrides], "layouts": [{key: value}, ...], "out": DIR}. Layout i trains with the base
overrides, its own and run.dir=DIR/i, through the trainer `pretrain train` runs (pretrain.train.trainer.Trainer);
rank 0 writes DIR/results.json: [the run's summary of each layout, in order]. A layout the trainer refuses or
fails on stops the job, as `pretrain train` would.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(job_path: str) -> None:
    from pretrain.config import load_config
    from pretrain.distributed.runtime import init_runtime, shutdown
    from pretrain.train.trainer import Trainer

    job = json.loads(Path(job_path).read_text())
    out = Path(job["out"])
    rt = init_runtime("cpu")
    results = []
    try:
        for i, layout in enumerate(job["layouts"]):
            overrides = [
                *job["base"],
                *(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in layout.items()),
            ]
            config = load_config(overrides=[*overrides, f"run.dir={out / str(i)}"])
            summary = Trainer(config, rt).fit()
            results.append({k: v for k, v in summary.items() if isinstance(v, (int, float, str))})
        if rt.is_main:
            (out / "results.json").write_text(json.dumps(results))
    finally:
        shutdown(rt)


if __name__ == "__main__":
    main(sys.argv[1])
