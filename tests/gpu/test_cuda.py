"""The CUDA paths, run only where a GPU is visible (they skip on CI's CPU machines).

What a CPU cannot check: bf16 autocast and flash attention on a GPU, the fp16 loss scaler, torch.compile,
the allocator's peak against the plan, `pretrain bench` on a card, a sweep's CUDA memory, NCCL. Each test
trains a small real model through the CLI, as a user would, and names the mode it tests: `train.compile: auto`
compiles on CUDA, so a test that left it out would test the compiled step whatever its name says, and a
compiled run measures no activations (the meter's hooks would break the graphs). Run them with
`python -m pytest tests/gpu -v` on a GPU machine (benchmarks/gpu_session.sh does, then measures).
"""

import json

import pytest

from support import GPU_MODEL, run_cli, tiny

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# The GPU model (support.GPU_MODEL) at micro-batch 16.
SMALL = [
    *GPU_MODEL,
    "train.seq_len=256",
    "train.micro_batch_size=16",
    "train.grad_accum_steps=1",
    "train.device=cuda",
    "train.lr=3e-3",
    "hardware.peak_tflops=null",
    "run.eval_every=0",
]


def train(prepared, run_dir, *extra, compile: bool):
    """A run of the small model, compiled or eager: every caller says which, and dynamo's log shows it."""
    r = run_cli(
        "train",
        *tiny(prepared, run_dir, *SMALL, *extra, f"train.compile={str(compile).lower()}"),
        env={"TORCH_LOGS": "dynamo"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert compiled(r) == compile, r.stderr[-3000:]
    return r


def compiled(r) -> bool:
    """Whether torch.compile traced anything in that run (TORCH_LOGS=dynamo's INFO lines)."""
    return "torchdynamo start tracing" in r.stderr


def rows(run_dir):
    return {x["name"]: x for x in json.loads((run_dir / "plan_vs_run.json").read_text())["rows"]}


def losses(run_dir):
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_bf16_mixed_on_cuda_matches_the_plan(prepared, tmp_path, recompute):
    """Eager: the saved activations are counted tensor by tensor only without torch.compile."""
    run_dir = tmp_path / "run"
    train(prepared, run_dir, "train.precision=bf16-mixed", f"train.activation_checkpointing={recompute}", compile=False)
    loss = losses(run_dir)
    assert loss[-1] < loss[0] - 0.5
    r = rows(run_dir)
    for name in ("parameters", "gradients", "optimizer_states", "working_copies"):
        assert r[name]["measured"] == r[name]["planned"], name
    # The tensors autograd saved, counted on the GPU (flash attention keeps what the planner says).
    assert abs(r["activations"]["error_pct"]) <= 10, r["activations"]
    # The allocator's peak against the plan's total less the CUDA context: the calibration target.
    assert abs(r["peak allocated"]["error_pct"]) <= 15, r["peak allocated"]


def test_compiled_bf16_mixed_on_cuda_against_the_plan(prepared, tmp_path):
    """Compiled: model states exact, the peak against the plan's compiled figure where the planner models one
    (memory_bytes.compiled, a number), else at most the eager plan's (compiling keeps less, not more)."""
    run_dir = tmp_path / "run"
    train(prepared, run_dir, "train.precision=bf16-mixed", "train.activation_checkpointing=selective", compile=True)
    r = rows(run_dir)
    for name in ("parameters", "gradients", "optimizer_states"):
        assert r[name]["measured"] == r[name]["planned"], name
    mem = json.loads((run_dir / "plan_vs_run.json").read_text())["plan"]["memory_bytes"]
    peak = r["peak allocated"]["measured"]
    if isinstance(mem.get("compiled"), (int, float)):
        planned = mem["compiled"] - mem["cuda_context"]
        assert abs(peak - planned) <= 0.15 * planned, (peak, planned)
    else:
        assert peak <= 1.15 * r["peak allocated"]["planned"], r["peak allocated"]


def test_fp32_on_cuda_repeats_kv_heads_and_matches_the_plan(prepared, tmp_path):
    run_dir = tmp_path / "run"
    train(prepared, run_dir, "train.precision=fp32", compile=False)  # GQA, memory-efficient kernel: k/v repeated
    r = rows(run_dir)
    for name in ("parameters", "gradients", "optimizer_states"):
        assert r[name]["measured"] == r[name]["planned"], name
    assert abs(r["activations"]["error_pct"]) <= 10, r["activations"]


def test_fp16_mixed_with_the_loss_scaler(prepared, tmp_path):
    run_dir = tmp_path / "run"
    train(prepared, run_dir, "train.precision=fp16-mixed", compile=False)
    loss = losses(run_dir)
    assert loss[-1] < loss[0] - 0.5


def test_compile_trains_like_eager(prepared, tmp_path):
    eager, compiled_run = tmp_path / "eager", tmp_path / "compiled"
    train(prepared, eager, "train.precision=bf16-mixed", "train.max_steps=8", compile=False)  # train() checks
    train(prepared, compiled_run, "train.precision=bf16-mixed", "train.max_steps=8", compile=True)  # dynamo's log
    a, b = losses(eager), losses(compiled_run)
    assert len(a) == len(b) == 8
    assert b == pytest.approx(a, rel=3e-2)  # same init and data; kernels differ (bf16 rounding)


def test_resume_on_cuda_continues_the_same_run(prepared, tmp_path):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train(prepared, straight, "train.precision=bf16-mixed", compile=False)
    train(prepared, stopped, "train.precision=bf16-mixed", "debug.stop_after_step=4", compile=False)
    r = run_cli("train", "--resume", stopped, "debug.stop_after_step=0")
    assert r.returncode == 0, r.stderr[-3000:]
    # GPU kernels with atomics are not bitwise deterministic; the continuation must still be the same run.
    assert losses(stopped) == pytest.approx(losses(straight), rel=2e-2)


def test_a_cuda_checkpoint_loads_on_the_cpu_and_exports(prepared, tmp_path):
    from pretrain import load_model

    run_dir = tmp_path / "run"
    train(prepared, run_dir, "train.precision=bf16-mixed", "train.max_steps=4", compile=False)
    model = load_model(run_dir, device="cpu")
    assert next(model.parameters()).device.type == "cpu"
    r = run_cli("export", run_dir, "--to", "hf", tmp_path / "hf")
    assert r.returncode == 0, r.stderr[-3000:]


def test_bench_on_the_card(tmp_path):
    out = tmp_path / "profile.json"
    r = run_cli("bench", "--device", "cuda", "--quick", "--out", out)
    assert r.returncode == 0, r.stderr[-3000:]
    peaks = json.loads(out.read_text())["peak_tflops"]
    assert peaks["bf16"] > peaks["fp32"] > 0  # tensor cores


def test_sweep_memory_on_cuda(tmp_path):
    r = run_cli(
        "sweep",
        "model.preset=debug",
        "model.hidden_size=512",
        "model.num_layers=4",
        "model.intermediate_size=1376",
        "train.precision=bf16-mixed",
        "train.device=cuda",
        "train.compile=false",
        "model.max_seq_len=1024",
        "train.seq_len=256,1024",
        "train.micro_batch_size=8",
        "--out",
        tmp_path / "sweep",
        "--json",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    cells = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["cells"]
    assert len(cells) == 2
    for cell in cells:
        assert cell["tokens_per_s"] > 0
        assert abs(cell["memory_error_pct"]) <= 15, cell


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL data parallelism needs two GPUs")
@pytest.mark.parametrize("stage", [0, 3])
def test_nccl_data_parallel(prepared, tmp_path, stage):
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "pretrain",
        "train",
        *tiny(
            prepared,
            run_dir,
            *SMALL,
            "train.precision=bf16-mixed",
            f"parallel.zero_stage={stage}",
            "debug.check_sharding=true",
            "train.compile=false",
        ),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    loss = losses(run_dir)
    assert loss[-1] < loss[0] - 0.5


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL tensor parallelism needs two GPUs")
@pytest.mark.parametrize("layout", ["parallel.sequence_parallel=false", "parallel.sequence_parallel=true"])
def test_nccl_tensor_parallel(prepared, tmp_path, layout):
    """Tensor parallelism over two GPUs (NCCL; the CPU tests use gloo): bf16 autocast, the per-rank bytes of
    the plan, a loss that falls (the debug preset's shapes: 2 k/v heads, one per rank)."""
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "pretrain",
        "train",
        *tiny(
            prepared,
            run_dir,
            "train.device=cuda",
            "train.precision=bf16-mixed",
            "parallel.tensor=2",
            layout,
            "debug.check_sharding=true",
            "train.compile=false",
        ),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    loss = losses(run_dir)
    assert loss[-1] < loss[0] - 0.3  # 6.26 -> 5.70 over these 12 steps on a CPU (gloo, fp32)
