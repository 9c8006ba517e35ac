"""Training options end to end: fp16 with a loss scaler, pure bf16, recomputation, the batch ramp, and the
one-line errors the trainer gives before it builds anything."""

import json

import pytest

from support import needs_compiler, run_cli, run_here, tiny

torch = pytest.importorskip("torch")


def train_lines(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]


@pytest.mark.parametrize(
    "extra",
    [
        ["train.precision=fp16-mixed"],
        ["train.precision=bf16", "train.optimizer=adafactor", "train.lr=1e-2"],  # Adafactor's own default: smaller
        # steps round away in bf16 weights (12 steps at 3e-3 left the loss flat on the sample data)
        ["train.precision=bf16-mixed", "train.activation_checkpointing=full", "train.optimizer=sgd"],
        [
            "train.activation_checkpointing=selective",
            "train.schedule=wsd",
            "model.family=gpt2",
            "model.num_kv_heads=4",
            "model.intermediate_size=256",
        ],
    ],
    ids=["fp16-scaler", "bf16-adafactor", "bf16-mixed-full-sgd", "gpt2-selective-wsd"],
)
def test_precisions_and_options_train(prepared, tmp_path, extra):
    run_dir = tmp_path / "run"
    r = run_here("train", *tiny(prepared, run_dir, "stability.spike_detection=false", *extra))
    assert r.returncode == 0, r.stderr
    lines = train_lines(run_dir)
    assert len(lines) == 12 and all(x["loss"] == x["loss"] for x in lines)  # no NaN
    assert lines[-1]["loss"] < lines[0]["loss"]


@pytest.mark.kernels
@pytest.mark.slow
@needs_compiler
def test_compiled_step_trains_like_eager(prepared, tmp_path):
    """torch.compile (inductor's CPU code here) of the model with selective recomputation: the same losses as
    eager, up to the rounding of fused kernels, and one compilation (the rotary tables exist before it)."""

    def losses(name, *extra):
        run_dir = tmp_path / name
        r = run_cli(
            "train",
            *tiny(prepared, run_dir, "train.max_steps=6", "train.activation_checkpointing=selective", *extra),
            env={"TORCH_LOGS": "recompiles"},
        )
        assert r.returncode == 0, r.stderr[-3000:]
        return [x["loss"] for x in train_lines(run_dir)], r.stderr

    eager, _ = losses("eager")
    compiled, log = losses("compiled", "train.compile=true")
    assert compiled[0] == pytest.approx(eager[0], rel=1e-5)  # the same forward, up to fused-kernel rounding
    # AdamW turns rounding-level gradient differences into whole updates where gradients are tiny (torch 2.6:
    # 8e-4 relative by step 6; 2.13: 1e-5): later losses agree to 2e-3.
    assert compiled == pytest.approx(eager, rel=2e-3)
    # One graph, for training: evaluation (every 6 steps here, and at the end) runs eager, compiling nothing.
    assert "Recompiling" not in log, log[-3000:]


def test_batch_ramp_grows_the_global_batch(prepared, tmp_path):
    run_dir = tmp_path / "run"
    # Target 4 micro-batches x 4 x 32 = 512 tokens per step, from 128 over the first 2,048 tokens.
    r = run_here(
        "train",
        *tiny(
            prepared, run_dir, "train.grad_accum_steps=4", "train.batch_ramp_tokens=2048", "train.batch_ramp_start=128"
        ),
    )
    assert r.returncode == 0, r.stderr
    batches = [x["batch_tokens"] for x in train_lines(run_dir)]
    assert batches[0] == 128 and batches[-1] == 512 and batches == sorted(batches)
    from pretrain.plan.schedule import micro_batches_per_step

    seen = 0
    for b in batches:
        assert b == 128 * micro_batches_per_step(
            seen, seq_len=32, micro_batch_size=4, data_parallel=1, grad_accum_steps=4, ramp_tokens=2048, ramp_start=128
        )
        seen += b


@pytest.mark.parametrize(
    "args, key",
    [
        (["train.lr=0"], "train.lr"),
        (["train.lr=nan"], "train.lr"),
        (["train.grad_clip=nan"], "train.grad_clip"),
        (["stability.window=10"], "stability.min_history"),  # a window shorter than the history judges nothing
        (["train.warmup=50"], "train.warmup"),
        (["train.schedule=wsd", "train.decay_fraction=0.9"], "train.decay_fraction"),  # decay inside the warm-up
        (["train.seq_len=512"], "train.seq_len"),
        (["model.vocab_size=100"], "model.vocab_size"),
        (["train.lrr=1"], "train.lrr"),
        (["parallel.tensor=2", "parallel.gpus=2"], "parallel.tensor"),
        (["parallel.offload=optimizer"], "parallel.offload"),  # generated from the key's `trains` metadata
        (["train.grad_dtype=same", "train.precision=bf16-mixed"], "train.grad_dtype"),
        (["model.rope_theta=0"], "model.rope_theta"),  # trained to NaN, and advised lowering the lr
        (["model.preset=moe-debug", "model.num_shared_experts=-1"], "model.num_shared_experts"),  # crashed
        (["model.preset=moe-debug", "model.first_dense_layers=2"], "model.first_dense_layers"),  # trained dense
    ],
)
def test_config_errors_are_one_line(prepared, tmp_path, args, key):
    r = run_here("train", *tiny(prepared, tmp_path / "run", *args))
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert key in line and "Traceback" not in r.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()  # failed before anything was built or written


@pytest.mark.parametrize("extra", [[], ["parallel.gpus=2"]])  # the check of every config, and the trainer's
def test_a_layout_for_more_processes_says_to_launch_them_with_torchrun(prepared, tmp_path, extra):
    # A config's parallel.gpus is what the planner plans; `pretrain train` runs the processes it is given.
    r = run_here("train", *tiny(prepared, tmp_path / "run", "parallel.pipeline=2", *extra))
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "launch with `torchrun --nproc-per-node 2 -m pretrain train ...`" in line, line
    assert "gpus" not in line


def test_missing_or_mismatched_data_directory(prepared, tmp_path):
    r = run_here("train", *tiny(tmp_path / "nowhere", tmp_path / "run"))
    assert r.returncode == 2 and "nowhere" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(prepared, broken)
    with open(broken / "train.bin", "ab") as f:
        f.write(b"\0\0")  # one token more than meta.json says
    r = run_here("train", *tiny(broken, tmp_path / "run2"))
    assert r.returncode == 2 and "train.bin" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_new_run_never_overwrites_an_old_one(prepared, tmp_path):
    run_dir = tmp_path / "run"
    assert run_here("train", *tiny(prepared, run_dir, "train.max_steps=3")).returncode == 0
    # The lock file aside: each trainer writes its PID there.
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}
    r = run_here("train", *tiny(prepared, run_dir, "train.max_steps=3", "train.lr=0.5"))
    assert r.returncode == 2 and "--resume" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"} == before


def test_a_validation_split_too_small_fails_before_training(prepared, tmp_path):
    from pretrain.data import prepare

    root = prepared.parent
    prepare([str(root / "corpus")], str(root / "tokenizer"), tmp_path / "data", val_fraction=0.0, workers=1)
    r = run_here("train", *tiny(tmp_path / "data", tmp_path / "run"))
    assert r.returncode == 2 and "val split" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_the_runs_peak_is_labelled_with_where_it_came_from(prepared, tmp_path):
    # No hardware.peak_tflops on a CPU: the peak is this machine's cached measurement, and the start-up line
    # says so (it named hardware.peak_tflops, the key the trainer passed the value through).
    run_dir = tmp_path / "run"
    args = [a for a in tiny(prepared, run_dir, "train.max_steps=3") if not a.startswith("hardware.peak_tflops")]
    r = run_cli("train", *args)
    assert r.returncode == 0, r.stderr
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("plan:") and "TFLOP/s" in x]
    assert "measured once" in line and "(hardware.peak_tflops)" not in line
