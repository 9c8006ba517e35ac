"""`train.optimizer: muon` under a real torchrun on 2 CPU ranks (gloo): DDP, ZeRO-1, FSDP2, pipeline, tensor
and expert parallelism train one process's model, each rank holding exactly the optimizer states the plan
gives it; FSDP2's checkpoint resumes on one process. Each layout of a model is one torchrun
(tests/distributed/train_layouts.py): one start-up of torch.

The tolerance: Newton-Schulz runs in bf16, so a gradient a few fp32 ulps apart (another reduction order) can
round to another bf16 update, which the iteration carries on, and AdamW (the embedding's) moves an element whose
gradient is near zero by up to lr on rounding alone, whichever way that rounding goes. So each tensor is held to
one process's by its distance relative to its norm: after 6 steps at lr 3e-3 at most 5.3e-3 (measured, the
attention projections, whose init is small, at every layout but pipeline's: 8.7e-5), the losses within 8e-6
relative. Without whole matrices (FSDP2's shards orthogonalised where they lie, tried by hand) the projections
are 7.6e-2 apart and the losses 1.4e-3."""

import shutil
from pathlib import Path

import pytest

from support import finished_run, losses, params, per_rank_reports, run_here, train_layouts

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="train.optimizer=muon: torch >= 2.9")

LOSS_REL, WEIGHT_REL = 2e-5, 1e-2
MOE = [
    "model.preset=moe-debug",
    "model.qk_norm=false",  # tensor parallelism does not split it yet
    "model.router_aux_loss_coef=0",  # not linear in the batch
    "model.router_bias_update_rate=0",  # a load one token apart flips a bias by the whole rate
]


def settings(prepared, *extra) -> list[str]:
    return [
        "model.preset=debug",
        "model.intermediate_size=176",
        "train.optimizer=muon",
        "train.seq_len=32",
        "train.grad_accum_steps=2",
        "train.precision=fp32",
        "train.device=cpu",
        "train.lr=3e-3",
        "train.warmup=1",
        "train.max_steps=6",
        f"data.dir={prepared}",
        "run.log_every=1",
        "run.eval_every=0",
        "run.checkpoint_every=3",
        "run.progress=false",
        "hardware.peak_tflops=0.05",
        *extra,
    ]


def trained(tmp_path, base, layouts) -> list[Path]:
    """Each layout trained in turn by one torchrun of 2 ranks: their run directories."""
    tmp_path.mkdir()
    train_layouts(tmp_path, base, layouts)
    return [tmp_path / str(i) for i in range(len(layouts))]


def same_losses(single, run_dir) -> None:
    a, b = losses(single), losses(run_dir)
    assert a.keys() == b.keys() == set(range(1, 7))
    assert all(b[k] == pytest.approx(a[k], rel=LOSS_REL) for k in a), (a, b)


def same_training(single, run_dir) -> None:
    same_losses(single, run_dir)
    pa, pb = params(single), params(run_dir)
    far = {k: (torch.linalg.norm(pb[k] - pa[k]) / torch.linalg.norm(pa[k])).item() for k in pa if pa[k].norm() > 0}
    assert max(far.values()) < WEIGHT_REL, far
    for _, rows in per_rank_reports(run_dir, 2):  # each rank's parameter, gradient and optimizer bytes: the plan's
        assert rows["optimizer_states"]["measured"] > 0


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_every_layout_trains_one_process_model(prepared, tmp_path, moe):
    model = MOE if moe else []
    single = tmp_path / "single"
    finished_run(single, *settings(prepared, *model, "train.micro_batch_size=8", f"run.dir={single}"))
    data = [{"parallel.zero_stage": s, "train.micro_batch_size": 4} for s in (0, 1, 3)]
    if moe:
        layouts = [{**x, "parallel.expert": 2} for x in data[::2]]
    else:
        layouts = [*data, {"parallel.pipeline": 2}, {"parallel.tensor": 2}]
    base = settings(prepared, *model, "train.micro_batch_size=8", "parallel.gpus=2", "debug.plan_vs_run_per_rank=true")
    runs = trained(tmp_path / "layouts", base, layouts)
    for run_dir in runs:
        same_training(single, run_dir)
    # FSDP2's step-3 checkpoint (each rank's shard of every momentum; MoE: of its experts) resumed by one
    # process: its steps 4-6.
    fsdp = next(run for run, x in zip(runs, layouts) if x.get("parallel.zero_stage") == 3)
    shutil.rmtree(fsdp / "checkpoints" / "step_00000006")
    one = ["parallel.gpus=1", "parallel.expert=1", "parallel.zero_stage=0", "train.micro_batch_size=8"]
    r = run_here("train", "--resume", fsdp, *one)
    assert r.returncode == 0 and "(step 3," in r.stdout, r.stderr
    same_losses(single, fsdp)
