"""fp16's loss scaler skips a step on every rank or on none (issue #31 item 9), whatever the gradients'
placements. Two gloo ranks under torchrun hold DTensor gradients, a replicated one first and a sharded one
after it, with an inf in rank 0's shard only: torch's own reduction of the scaler's flag follows the first
gradient's placement and leaves rank 1 unaware (torch 2.6 to 2.13), so the trainer's step makes the global
gradient norm every rank's flag (train/step.py `_agree_on_overflow`). Runs on torch 2.6, the oldest supported,
where FSDP2 on CPUs (tests/distributed/test_torchrun.py's overflow test) is refused."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

RANK = """
import json, sys
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from pretrain.train.step import _agree_on_overflow

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2,))
rows = []
for mode in ("alone", "agree"):
    norm_w = torch.nn.Parameter(distribute_tensor(torch.ones(8), mesh, [Replicate()]))
    matrix = torch.nn.Parameter(distribute_tensor(torch.ones(4, 8), mesh, [Shard(0)]))
    params = [norm_w, matrix]  # the order GradScaler groups them in: a replicated gradient first
    optimizer = torch.optim.AdamW(params, lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    for p in params:
        p.grad = distribute_tensor(torch.ones(p.shape), mesh, p.placements) * scaler.scale(torch.ones(()))
    if dist.get_rank() == 0:
        matrix.grad._local_tensor[0, 0] = float("inf")  # in rank 0's shard only
    scaler.unscale_(optimizer)
    own = sum(f.item() for f in scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values())
    norm = torch.nn.utils.clip_grad_norm_(params, 1.0).full_tensor()  # as Parallelized.clip
    if mode == "agree":
        _agree_on_overflow(scaler, optimizer, norm)
    scaler.step(optimizer)
    scaler.update()
    rows.append({"mode": mode, "rank": dist.get_rank(), "own_flag": own, "stepped": bool(optimizer.state),
                 "scale": scaler.get_scale()})
with open(f"{sys.argv[1]}/rank{dist.get_rank()}.json", "w") as f:  # one file a rank: their prints interleave
    json.dump(rows, f)
dist.destroy_process_group()
"""


def test_every_rank_skips_an_overflow_in_one_ranks_shard(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(script),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [row for rank in range(2) for row in json.loads((tmp_path / f"rank{rank}.json").read_text())]
    alone, agreed = ([x for x in sorted(rows, key=lambda x: x["rank"]) if x["mode"] == m] for m in ("alone", "agree"))
    # torch by itself: rank 1's flag stays 0 and it steps, rank 0 skips and halves its scale: drift.
    assert [(x["own_flag"], x["stepped"]) for x in alone] == [(1.0, False), (0.0, True)]
    assert [(x["stepped"], x["scale"]) for x in agreed] == [(False, 2.0**15)] * 2
