"""A resume's checkpoint verification split over the ranks (checkpoint/format.py share_of): each rank
hashes its share of each checkpoint's files, once, and all take one verdict. Before, every rank hashed every
file before the first barrier: 0.85 TB per rank for a 70B checkpoint."""

import json
import subprocess
import sys

import pytest

from support import run_here, tiny

torch = pytest.importorskip("torch")

from pretrain.checkpoint.format import list_checkpoints, share_of, verify  # noqa: E402

# Each rank: its own share's verdict on the newest checkpoint, then the resume point all ranks agree on.
RANK = """
import json, sys
from pathlib import Path
from pretrain.distributed.runtime import first_of_ranks, init_runtime, shutdown
from pretrain.checkpoint.choice import resume_point
from pretrain.checkpoint.format import list_checkpoints, verify

rt = init_runtime("cpu")
share = (rt.rank, rt.world_size)
own = verify(list_checkpoints(sys.argv[1])[-1], share)
point, corrupt = resume_point(sys.argv[1], share, lambda problem: first_of_ranks(problem, rt))
out = {"own": own, "point": point.name, "corrupt": [[p.name, why] for p, why in corrupt]}
Path(sys.argv[2], f"rank{rt.rank}.json").write_text(json.dumps(out))  # not stdout: the ranks' lines interleave
shutdown(rt)
"""


def test_each_file_is_hashed_by_one_rank_and_the_ranks_agree(prepared, tmp_path):
    run_dir = tmp_path / "run"
    r = run_here("train", *tiny(prepared, run_dir, "train.max_steps=4", "run.checkpoint_every=2", "run.eval_every=0"))
    assert r.returncode == 0, r.stderr
    *_, older, newest = list_checkpoints(run_dir)
    sizes = {k: v["bytes"] for k, v in json.loads((newest / "manifest.json").read_text())["files"].items()}
    shares = [share_of(sizes, rank, 2) for rank in range(2)]
    assert shares[0] | shares[1] == set(sizes) and not shares[0] & shares[1]  # each file once
    assert abs(sum(sizes[n] for n in shares[0]) - sum(sizes[n] for n in shares[1])) <= max(sizes.values())
    assert share_of(sizes, 0, 1) == set(sizes)  # one rank alone: every file

    victim = sorted(shares[1])[0]  # rank 1's to hash: flip a byte, same size
    data = bytearray((newest / victim).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (newest / victim).write_bytes(bytes(data))
    assert verify(newest) == verify(newest, (1, 2)) == f"{victim} fails its sha256 checksum"
    assert verify(newest, (0, 2)) is None  # rank 0 does not read it

    script = tmp_path / "rank.py"
    script.write_text(RANK)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        script,
        run_dir,
        tmp_path,
    ]
    r = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert sorted(x["own"] is None for x in ranks) == [False, True]  # only rank 1 saw it
    for x in ranks:  # both resume from the older checkpoint and set the newest aside, for the same reason
        assert x["point"] == older.name and x["corrupt"] == [[newest.name, f"{victim} fails its sha256 checksum"]]
