"""Tensor and sequence parallelism under a real torchrun on the CPU (gloo): the tiny LLaMA trains as one process
with the same global batch does, each rank holds exactly the planner's per-rank bytes, and checkpoints
saved on a (data 2 x tensor 2) grid resume on other grids and survive a kill -9."""

import contextlib
import json
import subprocess
import time

import psutil
import pytest

from support import (
    exported_tensors,
    finished_run,
    finished_torchrun,
    losses,
    needs_compiler,
    params,
    per_rank_reports,
    run_here,
    same_task_rows,
    torchrun,
    write_mc_task,
)

torch = pytest.importorskip("torch")

STEPS = 10


def settings(prepared, run_dir, micro_batch, *extra):
    # The debug preset's 4 heads / 2 k/v heads split over 2 tensor ranks (one k/v group each); an odd
    # vocabulary padded to 518 rows (one padded row), 259 per tensor rank: FSDP's chunks are uneven (130 / 129).
    return [
        "model.preset=debug",
        "model.vocab_size=517",
        "model.pad_vocab_to=2",
        "train.seq_len=32",
        f"train.micro_batch_size={micro_batch}",
        "train.grad_accum_steps=2",
        "train.precision=fp32",
        "train.device=cpu",
        "train.optimizer=adamw",
        "train.lr=3e-3",
        "train.warmup=1",
        f"train.max_steps={STEPS}",
        f"data.dir={prepared}",
        f"run.dir={run_dir}",
        "run.log_every=1",
        "run.eval_every=0",
        "run.eval_batches=2",
        "run.checkpoint_every=5",
        "run.progress=false",
        "hardware.peak_tflops=0.05",
        *extra,
    ]


def assert_same_run(reference, run_dir, steps=range(1, STEPS + 1)):
    # The logged loss is the global batch's mean; the reduction orders differ (row- vs column-split matmul
    # sums, all-reduces): measured within 2e-7 relative over 10 steps, asked 1e-4 (the bound).
    a, b = losses(reference), losses(run_dir)
    assert sorted(b) == sorted(a)
    assert all(b[k] == pytest.approx(a[k], rel=1e-4) for k in steps)


def assert_planned_bytes(run_dir):
    rows = {x["name"]: x for x in json.loads((run_dir / "plan_vs_run.json").read_text())["rows"]}
    for name in ("parameters", "gradients", "optimizer_states"):
        assert rows[name]["planned"] == rows[name]["measured"]


@pytest.fixture(scope="module")
def mc_task(tmp_path_factory):
    """A local downstream task for run.eval_tasks (at steps 5 and 10): the tensor ranks of a replica score the
    same examples together, the data ranks split them (9 examples: 5 and 4)."""
    path = write_mc_task(tmp_path_factory.mktemp("mc") / "mc.jsonl", examples=9)
    return ["run.eval_tasks_every=5", f"run.eval_tasks=[{path}]"]


@pytest.fixture(scope="module")
def single(prepared, mc_task, tmp_path_factory):
    """One process, micro-batch 8: the global batch of every layout below."""
    run_dir = tmp_path_factory.mktemp("single") / "run"
    return finished_run(run_dir, *settings(prepared, run_dir, 8, *mc_task))


@pytest.fixture(scope="module")
def grid(prepared, mc_task, tmp_path_factory):
    """(data 2, tensor 2) on 4 ranks, FSDP (ZeRO-3) over the data ranks, scoring the task in the loop; every
    rank asserts it holds the planner's bytes for its (data rank, tensor rank)."""
    run_dir = tmp_path_factory.mktemp("grid") / "run"
    finished_torchrun(
        *settings(
            prepared,
            run_dir,
            4,
            "parallel.tensor=2",
            "parallel.zero_stage=3",
            "debug.check_sharding=true",
            "debug.plan_vs_run_per_rank=true",
            *mc_task,
        ),
        nproc=4,
    )
    return run_dir


def test_tensor_x_data_parallel_trains_as_one_process(single, grid):
    assert_same_run(single, grid)
    # run.eval_tasks: each data rank's FSDP root forward gives the logits whole on both of its tensor ranks
    same_task_rows(single, grid, steps=[5, 10])
    assert_planned_bytes(grid)
    # The checkpoint holds the single-process layout (fused q|k|v and gate|up rows in their own order):
    # the same parameters, read by one process.
    pa, pb = params(single), params(grid)
    for k in pa:
        torch.testing.assert_close(pb[k], pa[k], rtol=1e-5, atol=3e-5)


def test_tensor_x_ddp_trains_as_one_process(prepared, single, mc_task, tmp_path):
    # Megatron's layout, tensor 2 x data 2 with DDP (ZeRO-0) over the data ranks: each rank averages its own
    # parts of the DTensor gradients (distributed/data_parts.py; DDP takes no DTensor), sequence parallel.
    # Refused by the trainer before; each rank holds the planned bytes. It scores the task in the loop as one
    # process does (its batches padded to an even split of the sequence).
    run_dir = tmp_path / "run"
    finished_torchrun(
        *settings(
            prepared,
            run_dir,
            4,
            "parallel.tensor=2",
            "parallel.zero_stage=0",
            "parallel.sequence_parallel=true",
            "debug.check_sharding=true",
            *mc_task,
        ),
        nproc=4,
    )
    assert_same_run(single, run_dir)
    assert_planned_bytes(run_dir)
    same_task_rows(single, run_dir, steps=[5, 10])
    pa, pb = params(single), params(run_dir)
    for k in pa:
        torch.testing.assert_close(pb[k], pa[k], rtol=1e-5, atol=3e-5)


def test_tensor_x_zero1_trains_as_one_process_and_resumes_in_one(prepared, single, tmp_path):
    # ZeRO-1 over the data ranks of tensor 2 x data 2: each replica updates and broadcasts the parameter parts
    # it owns (the planner's partition: check_sharding holds each rank to its optimizer bytes) and saves their
    # states; one process continues from step 5 with every state in place. Refused by the trainer before.
    run_dir = tmp_path / "run"
    finished_torchrun(
        *settings(
            prepared,
            run_dir,
            4,
            "parallel.tensor=2",
            "parallel.zero_stage=1",
            "debug.check_sharding=true",
            "debug.stop_after_step=5",
        ),
        nproc=4,
    )
    a, b = losses(single), losses(run_dir)
    assert sorted(b) == [1, 2, 3, 4, 5] and all(b[k] == pytest.approx(a[k], rel=1e-4) for k in b)
    r = run_here(
        "train", "--resume", run_dir, "debug.stop_after_step=0", "parallel.tensor=1", "train.micro_batch_size=8"
    )
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout and "step 5," in r.stdout
    assert_same_run(single, run_dir)


def test_every_rank_reports_its_own_plan_vs_run(grid):
    # Ranks numbered tensor fastest (distributed/mesh.py). A tensor rank's 259 embedding rows split 130 / 129
    # by FSDP over the data ranks: parameters and gradients are padded to equal chunks, the optimizer states are
    # made like the unpadded shard, so the two data ranks hold different state bytes, each its planned ones.
    reports = per_rank_reports(grid, 4)
    assert [(place["data"], place["tensor"]) for place, _ in reports] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    held = [rows["optimizer_states"]["measured"] for _, rows in reports]
    assert held[0] == held[1] > held[2] == held[3]


def test_sequence_parallel_on_two_tensor_ranks_trains_as_one_process(prepared, single, mc_task, tmp_path):
    run_dir = tmp_path / "run"
    finished_torchrun(
        *settings(
            prepared,
            run_dir,
            8,
            "parallel.tensor=2",
            "parallel.sequence_parallel=true",
            "debug.check_sharding=true",
            *mc_task,
        ),
        nproc=2,
    )
    assert_same_run(single, run_dir)
    assert_planned_bytes(run_dir)
    same_task_rows(single, run_dir, steps=[5, 10])  # the two tensor ranks score every example together


def test_tied_embeddings_on_two_tensor_ranks_train_as_one_process(prepared, tmp_path):
    # One vocabulary-split tensor serves as the embedding and the output layer.
    one, two = tmp_path / "one", tmp_path / "two"
    r = run_here("train", *settings(prepared, one, 8, "model.tie_embeddings=true"))
    assert r.returncode == 0, r.stderr
    finished_torchrun(
        *settings(prepared, two, 8, "model.tie_embeddings=true", "parallel.tensor=2", "debug.check_sharding=true"),
        nproc=2,
    )
    assert_same_run(one, two)
    assert_planned_bytes(two)


@needs_compiler
def test_compiled_blocks_with_and_without_sequence_parallelism(prepared, single, tmp_path, monkeypatch):
    """Each block compiled whole (fullgraph) around the tensor-parallel hooks: no graph break, the losses of
    one eager process (within compiled kernels' rounding, as tests/distributed/test_torchrun.py allows). The
    two layouts share one compile cache, as two runs on one machine do: AOTAutograd's cache once handed the
    second run the first one's blocks, and it trained wrong (distributed/parallelize.py)."""
    monkeypatch.setenv("TORCH_LOGS", "graph_breaks")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "compile-cache"))
    for layout in ("parallel.sequence_parallel=false", "parallel.sequence_parallel=true"):
        run_dir = tmp_path / layout
        r = finished_torchrun(
            *settings(prepared, run_dir, 8, "parallel.tensor=2", layout, "train.compile=true"), nproc=2
        )
        assert "Graph break" not in r.stderr
        a, b = losses(single), losses(run_dir)
        assert all(b[k] == pytest.approx(a[k], rel=2e-3) for k in a), layout


def test_a_data_2_tensor_2_checkpoint_resumes_on_data_4_and_on_one_process(prepared, single, tmp_path):
    saved = tmp_path / "saved"
    finished_torchrun(
        *settings(prepared, saved, 4, "parallel.tensor=2", "parallel.zero_stage=3", "debug.stop_after_step=5"), nproc=4
    )
    # Data 4 x tensor 1 (FSDP over all 4 ranks, micro-batch 2: the same global batch).
    four = tmp_path / "four"
    subprocess.run(["cp", "-r", saved, four], check=True)
    r = finished_torchrun(
        "--resume", four, "debug.stop_after_step=0", "parallel.tensor=1", "train.micro_batch_size=2", nproc=4
    )
    assert "resumed from" in r.stdout
    assert_same_run(single, four, steps=range(6, STEPS + 1))
    # One process (data 1 x tensor 1, micro-batch 8).
    one = tmp_path / "one"
    subprocess.run(["cp", "-r", saved, one], check=True)
    r = run_here("train", "--resume", one, "debug.stop_after_step=0", "parallel.tensor=1", "train.micro_batch_size=8")
    assert r.returncode == 0, r.stderr
    assert_same_run(single, one, steps=range(6, STEPS + 1))


def test_export_from_a_tensor_parallel_checkpoint(grid, tmp_path):
    hf, ours = exported_tensors(grid, tmp_path / "hf"), params(grid)
    q = 4 * 16  # debug preset: 4 heads of 16
    assert torch.equal(hf["model.layers.0.self_attn.q_proj.weight"], ours["blocks.0.attn.qkv.weight"][:q])
    assert torch.equal(hf["model.layers.1.mlp.up_proj.weight"], ours["blocks.1.mlp.up.weight"][176:])


def test_kill_9_during_a_tensor_x_data_run_resumes_exactly(prepared, grid, tmp_path):
    """Every process of the job killed at once (a lost node) after the step-5 checkpoint: `--resume` on the
    same grid continues with the losses of the run that was never stopped (same ranks, same order of
    operations: bitwise)."""
    run_dir = tmp_path / "run"
    proc = torchrun(
        *settings(prepared, run_dir, 4, "parallel.tensor=2", "parallel.zero_stage=3", "debug.step_sleep=0.5"),
        nproc=4,
        wait=False,
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline and len(losses(run_dir) if (run_dir / "metrics.jsonl").exists() else {}) < 7:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.1)
        # torchrun starts each rank in a session of its own: kill its whole tree (a lost node), or the ranks
        # outlive the test, blocked in a collective with the dead peers.
        for process in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
    finally:
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()
    assert max(losses(run_dir)) < STEPS  # killed mid-run
    r = finished_torchrun("--resume", run_dir, nproc=4)
    assert "resumed from" in r.stdout and "step 5," in r.stdout
    a, b = losses(grid), losses(run_dir)
    assert all(b[k] == a[k] for k in range(6, STEPS + 1))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.preset=gpt2"], "parallel.tensor: tensor parallelism is built for the LLaMA family, not gpt2"),
        (["model.intermediate_size=175"], "parallel.tensor: 2 must divide model.intermediate_size 175"),
        (["model.dropout=0.1"], "model.dropout: not supported with parallel.tensor > 1"),
        (["model.qk_norm=true"], "model.qk_norm: not built with parallel.tensor > 1 yet"),
        (
            ["parallel.sequence_parallel=true", "parallel.async_tp=true", "train.compile=false"],
            "parallel.async_tp: the overlap is a torch.compile pass",
        ),
        (
            ["model.vocab_size=515"],
            r"parallel.tensor: 2 must divide the vocabulary's rows \(515: .* "
            "model.pad_vocab_to=128",
        ),
    ],
)
def test_what_tensor_parallelism_refuses(overrides, message):
    from pretrain.config import load_config
    from pretrain.config.trainable import check_trainable
    from pretrain.errors import ConfigError

    base = ["model.preset=debug", "parallel.gpus=4", "parallel.tensor=2", "parallel.zero_stage=3"]
    with pytest.raises(ConfigError, match=message):
        check_trainable(load_config(overrides=base + overrides), needs_data=False)


def test_async_tensor_parallelism_needs_compiled_blocks_on_cuda():
    # A compiler pass over NCCL's symmetric memory: an eager run or a CPU would keep the plain collectives and
    # say nothing, so both are refused in the trainer's words.
    from pretrain.distributed.tensor_parallel import enable_async_tp
    from pretrain.errors import ConfigError

    for compiled, device in ((True, "cpu"), (False, "cuda")):
        with pytest.raises(ConfigError, match="parallel.async_tp: needs compiled blocks on CUDA GPUs"):
            enable_async_tp(compiled, device)


def test_rank_order_hands_each_rank_whole_heads():
    from pretrain.distributed.tensor_parallel import rank_order

    # Fused q|k|v rows of 4 q rows and 2 k, 2 v rows over 2 ranks: rank 0 holds q rows 0-1, k row 4, v row 6,
    # rank 1 the rest; a contiguous half of the reordered rows is one rank's.
    assert rank_order([4, 2, 2], 2).tolist() == [0, 1, 4, 6, 2, 3, 5, 7]
    assert rank_order([3, 3], 1).tolist() == list(range(6))  # one rank: the canonical order
