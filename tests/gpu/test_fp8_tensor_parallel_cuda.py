"""fp8 under tensor and sequence parallelism on two GPUs: torchao's Float8ColwiseParallel / Float8RowwiseParallel
(as torchtitan), so the sequence-parallel all-gathers carry float8 over NCCL (distributed/fp8.py:
float8_tensor_parallel). On CPU the collectives stay bf16: gloo cannot carry float8 (tests/train/test_fp8.py).
Skips without two CUDA GPUs that multiply in float8 (compute capability 8.9: Ada, Hopper and newer)."""

import json

import pytest

from support import GPU_MODEL, finished_torchrun, losses, run_cli, tiny

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")
pytestmark = pytest.mark.skipif(
    torch.cuda.device_count() < 2 or torch.cuda.get_device_capability() < (8, 9),
    reason="needs two CUDA GPUs with float8 matmuls",
)

# Every block linear a multiple of 16 on each of the 2 tensor ranks (qkv 1024 -> 512, up 2752 -> 1376, down's
# input 1376 -> 688), all converted (min 16); compiled (train.compile: auto on CUDA), as fp8 is meant to run.
FP8_TP = [
    *GPU_MODEL,
    "train.seq_len=256",
    "train.micro_batch_size=8",
    "train.grad_accum_steps=1",
    "train.device=cuda",
    "train.precision=fp8",
    "train.fp8_min_features=16",
    "train.max_steps=6",
    "hardware.peak_tflops=null",
    "run.eval_every=0",
    "run.checkpoint_every=0",
]


def test_fp8_tensor_parallel_all_gathers_in_float8_and_trains_as_one_gpu(prepared, tmp_path):
    tp = tmp_path / "tp"
    finished_torchrun(
        *tiny(prepared, tp, *FP8_TP, "parallel.gpus=2", "parallel.tensor=2", "parallel.sequence_parallel=true")
    )
    report = json.loads((tp / "plan_vs_run.json").read_text())
    assert report["fp8"] == {"recipe": "tensorwise", "linears": 16, "skipped": 1, "tensor_parallel": "float8"}
    one = tmp_path / "one"
    r = run_cli("train", *tiny(prepared, one, *FP8_TP))
    assert r.returncode == 0, r.stderr[-3000:]
    # the same float8 casts (tensorwise scales from the whole tensor's amax), cast before the all-gather rather
    # than after; the row-split partial sums add in bf16 across ranks (4.3e-4 relative on CPU's bf16 route)
    assert losses(tp).keys() == losses(one).keys()
    assert all(losses(tp)[k] == pytest.approx(losses(one)[k], rel=5e-3) for k in losses(one))
    # debug.fp8_check keeps the wire bf16 (its shadow needs the linears' inputs before the cast), and still trains
    checked = tmp_path / "checked"
    finished_torchrun(
        *tiny(
            prepared,
            checked,
            *FP8_TP,
            "parallel.gpus=2",
            "parallel.tensor=2",
            "parallel.sequence_parallel=true",
            "debug.fp8_check=1",
        )
    )
    assert json.loads((checked / "plan_vs_run.json").read_text())["fp8"]["tensor_parallel"] == "bf16"
    assert all(losses(checked)[k] == pytest.approx(losses(tp)[k], rel=5e-3) for k in losses(tp))
