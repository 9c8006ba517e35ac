"""train.precision=fp8 on a CPU (torchao's float8 casts round to e4m3 there as on a GPU): the tiny LLaMA
trains to the bf16-mixed run's validation loss, resumes bitwise, exports a bf16 model transformers loads;
without torchao it is one line and exit 2. Speed is a GPU's question (tests/bench/test_gpu_acceptance.py)."""

import json
import math
import os
import subprocess
import sys

import pytest

from support import (
    exported_tensors,
    finished_run,
    finished_torchrun,
    losses,
    needs_compiler,
    params,
    run_cli,
    run_here,
    tiny,
)

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")

# The debug preset's linears are 64-352 wide: a minimum of 16 converts all 8 of the blocks' (the default
# 1024 is a real model's) and leaves the output layer bf16. Checkpoints at 10 and 20, one eval at the end.
STEPS = 20
FP8 = [
    "train.precision=fp8",
    "train.fp8_min_features=16",
    f"train.max_steps={STEPS}",
    "run.eval_every=0",
    "run.eval_batches=4",
    "run.checkpoint_every=10",
    "train.grad_accum_steps=1",
]


def final_val_loss(run_dir) -> float:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["val_loss"] for r in rows if "val_loss" in r][-1]


def in_process(prepared, tmp_path, *extra) -> tuple[float, object]:
    """The tiny run in this process (no interpreter to start, nothing written): its final validation loss and
    counters."""
    from pretrain.config import load_config
    from pretrain.distributed.runtime import init_runtime
    from pretrain.train.trainer import Trainer

    overrides = tiny(prepared, tmp_path / "unused", *FP8, "run.checkpoint_every=0", *extra)
    trainer = Trainer(load_config(None, overrides), init_runtime("cpu"), quiet=True)
    return trainer.fit()["val_loss"], trainer.state


def logged(prepared, run_dir, *extra) -> list[dict]:
    """A 4-step fp8 run in this process, its metrics.jsonl rows."""
    from pretrain.config import load_config
    from pretrain.distributed.runtime import init_runtime
    from pretrain.train.trainer import Trainer

    overrides = tiny(prepared, run_dir, *FP8, *SHORT, *extra)
    Trainer(load_config(None, overrides), init_runtime("cpu")).fit()
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


SHORT = ["train.max_steps=4", "run.checkpoint_every=0"]


@pytest.fixture(scope="module")
def tensorwise(prepared, tmp_path_factory):
    """The tiny fp8 run as a user starts it: metrics, plan_vs_run.json, checkpoints at 10 and 20."""
    run_dir = tmp_path_factory.mktemp("fp8") / "run"
    return finished_run(run_dir, *tiny(prepared, run_dir, *FP8))


@pytest.mark.slow
def test_fp8_ends_within_2_percent_of_bf16_with_no_non_finite_step(prepared, tensorwise, tmp_path):
    bf16, _ = in_process(prepared, tmp_path, "train.precision=bf16-mixed")
    rowwise, state = in_process(prepared, tmp_path, "train.fp8_recipe=rowwise")
    # checkpoint_every=0: a non-finite loss or a spike would have stopped the run before its last step
    assert state.step == STEPS and state.nonfinite_skips == 0 and not state.rollbacks
    fp8 = final_val_loss(tensorwise)
    for loss in (fp8, rowwise):
        assert abs(loss - bf16) / bf16 < 0.02, (loss, bf16)
        assert loss != bf16  # float8 really multiplied: the losses are its own
    assert len(losses(tensorwise)) == STEPS and all(map(math.isfinite, losses(tensorwise).values()))
    events = (tensorwise / "events.jsonl").read_text()
    assert not any(e in events for e in ("nonfinite_skip", "spike", "rollback", "stopped"))
    report = json.loads((tensorwise / "plan_vs_run.json").read_text())
    assert report["fp8"] == {"recipe": "tensorwise", "linears": 8, "skipped": 1}


@pytest.mark.slow
def test_fp8_resumes_bitwise_and_exports_bf16_that_transformers_loads(prepared, tensorwise, tmp_path):
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "run"
    first = run_cli("train", *tiny(prepared, run_dir, *FP8, "debug.stop_after_step=10"))
    assert first.returncode == 0, first.stderr
    second = run_cli("train", "--resume", run_dir, "debug.stop_after_step=0")
    assert second.returncode == 0, second.stderr
    assert losses(run_dir) == losses(tensorwise)
    pa, pb = params(run_dir), params(tensorwise)
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)

    tensors = exported_tensors(run_dir, tmp_path / "hf")
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert model.dtype == torch.bfloat16
    logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.isfinite(logits).all()


@pytest.mark.slow
def test_fsdp_gathers_fp8_weights_and_holds_the_planned_bytes(prepared, tmp_path):
    # ZeRO-3 over 2 ranks, tensorwise: torchao's float8 all-gather wraps each sharded weight; every rank
    # still holds exactly the planner's parameter, gradient and optimizer bytes (debug.check_sharding).
    run_dir = tmp_path / "run"
    finished_torchrun(
        *tiny(
            prepared,
            run_dir,
            *FP8,
            "train.max_steps=4",
            "parallel.gpus=2",
            "parallel.zero_stage=3",
            "debug.check_sharding=true",
        )
    )
    report = json.loads((run_dir / "plan_vs_run.json").read_text())
    assert report["fp8"] == {"recipe": "tensorwise", "linears": 8, "skipped": 1, "fsdp_float8_all_gather": True}
    assert all(math.isfinite(x) for x in losses(run_dir).values())


# One rank of ZeRO-3 in fp8: after a step, every converted weight's float8 all-gather has its scale already,
# computed once for all weights (torchao's precompute), e4m3's largest value over the whole weight's amax.
RANK = """
import json, os, sys
from pathlib import Path
from pretrain.config import load_config
from pretrain.distributed.runtime import init_runtime, shutdown
from pretrain.train.trainer import Trainer
from torchao.float8.float8_linear import Float8Linear

rt = init_runtime("cpu")
trainer = Trainer(load_config(None, sys.argv[1:]), rt, quiet=True)
linears = [m for m in trainer.engine.module.modules() if isinstance(m, Float8Linear)]
before = [m.weight._local_tensor._precomputed_scale for m in linears]
trainer.step()
scales = []
for m in linears:
    expected = 448.0 / m.weight.full_tensor().abs().max().double()
    scales.append([float(m.weight._local_tensor._precomputed_scale), float(expected)])
out = {"before": [x is None for x in before], "scales": scales}
Path(os.environ["RANK_OUT"], f"rank{rt.rank}.json").write_text(json.dumps(out))  # not stdout: ranks interleave
shutdown(rt)
"""


@pytest.mark.slow
def test_fsdp_float8_weight_scales_are_precomputed_after_each_step(prepared, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    args = tiny(prepared, tmp_path / "run", *FP8, "parallel.gpus=2", "parallel.zero_stage=3", "run.checkpoint_every=0")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", script, *args]
    env = {**os.environ, "RANK_OUT": str(tmp_path)}
    r = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]:
        assert all(rank["before"]) and len(rank["scales"]) == 8  # none before the first step
        for got, expected in rank["scales"]:
            assert got == pytest.approx(expected, rel=1e-6)


def test_fp8_without_torchao_is_one_line(prepared, tmp_path):
    block = (
        "import runpy, sys\n"
        "sys.modules['torchao'] = None\n"  # how Python reports a missing module: import raises
        "sys.argv = ['pretrain', *sys.argv[1:]]\n"
        "runpy.run_module('pretrain', run_name='__main__')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", block, "train", *tiny(prepared, tmp_path / "run", *FP8)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "pretrain[fp8]" in r.stderr
    assert not (tmp_path / "run").exists()


def test_a_run_whose_linears_all_stay_bf16_says_so_at_start(prepared, tmp_path):
    # The default train.fp8_min_features (1024) converts none of the debug model's 64-wide linears: the run is
    # bf16-mixed under another name, which only plan_vs_run.json said ("linears": 0); now the start does.
    r = run_here("train", *tiny(prepared, tmp_path / "run", "train.precision=fp8", *SHORT, "run.eval_every=0"))
    assert r.returncode == 0, r.stderr[-2000:]
    said = [x for x in r.stdout.splitlines() if "fp8: no linear converts" in x]
    assert len(said) == 1 and "train.fp8_min_features=1024" in said[0] and "narrower sides here: 64" in said[0]
    assert r.stdout.index(said[0]) < r.stdout.index("step ")  # at start, before the first step's line
    assert json.loads((tmp_path / "run" / "plan_vs_run.json").read_text())["fp8"]["linears"] == 0


def test_the_filter_converts_what_the_planner_counts():
    from pretrain.config import load_config
    from pretrain.plan.fp8 import converts

    assert converts("blocks.0.mlp.up", 4096, 28672, 1024)
    assert not converts("lm_head", 4096, 128256, 1024)  # the output layer stays bf16
    assert not converts("blocks.0.attn.qkv", 4096, 4104, 16)  # 4104 is no multiple of 16
    assert not converts("blocks.0.attn.proj", 768, 768, 1024)  # below the minimum
    assert converts("blocks.0.attn.proj", 1024, 1024, 1024)
    assert load_config(overrides=["train.precision=fp8"]).train.fp8_min_features == 1024


def test_the_run_reports_mfu_against_both_peaks():
    from pretrain.config import load_config
    from pretrain.plan import make_plan
    from pretrain.train.plan_check import compare

    p = make_plan(load_config(overrides=["model.preset=llama3-8b", "hardware.gpu=h100", "train.precision=fp8"]))
    states = {k: p["model_states"][k] for k in ("parameters", "gradients", "optimizer_states")}
    rows = {r["name"]: r for r in compare(p, states, None, None, 1000.0, 0.5, 0.4, "cuda:0")["rows"]}
    to_mixed = p["step_time"]["mfu_mixed_peak"] / p["step_time"]["mfu"]
    assert 0.5 < to_mixed < 1  # the mixed peak lies between the bf16 and the fp8 peak
    assert rows["mfu"]["measured"] == 0.5
    assert rows["mfu_mixed_peak"]["measured"] == pytest.approx(0.5 * to_mixed)


def shadowed(rows: list[dict]) -> list[dict]:
    """debug.fp8_check's lines of a run's metrics.jsonl, each checked: every converted linear of the first, middle
    and last block (the debug preset's 2 blocks: 0 and 1), a few percent off (e4m3's 3 significant bits), never
    exactly bf16 (the shadow is not the fp8 output)."""
    shadows = [r for r in rows if "fp8_rel_err" in r]
    for r in shadows:
        assert set(r["fp8_rel_err"]) == {
            f"blocks.{b}.{n}" for b in (0, 1) for n in ("attn.qkv", "attn.proj", "mlp.up", "mlp.down")
        }
        errors = r["fp8_rel_err"].values()
        assert all(0.001 < e < 0.2 for e in errors) and r["fp8_rel_err_max"] == max(errors)
        assert r["fp8_rel_err"][r["fp8_rel_err_worst"]] == r["fp8_rel_err_max"]
    return shadows


def train_losses(rows: list[dict]) -> list[float]:
    return [r["loss"] for r in rows if "loss" in r]


def test_fp8_check_logs_a_bf16_shadows_relative_error_for_the_first_steps_and_changes_nothing(prepared, tmp_path):
    from pretrain.config import load_config
    from pretrain.config.trainable import check_trainable
    from pretrain.errors import ConfigError

    checked, plain = logged(prepared, tmp_path / "checked", "debug.fp8_check=2"), logged(prepared, tmp_path / "plain")
    assert [r["step"] for r in shadowed(checked)] == [1, 2]  # the first N steps only
    # the shadow runs beside the training, not in it: the losses are bitwise the unchecked run's
    assert train_losses(checked) == train_losses(plain)
    with pytest.raises(ConfigError, match="use train.precision=fp8"):
        check_trainable(load_config(None, [*FP8, "debug.fp8_check=2", "train.precision=bf16-mixed"]), needs_data=False)


@needs_compiler
def test_fp8_check_with_compiled_blocks_shadows_them_eager_and_changes_nothing(prepared, tmp_path):
    # The check's forward runs eager after the step (set_stance force_eager): the compiled blocks' graphs are
    # the unchecked run's, so are the losses, bitwise. 2 steps, one micro-batch each: compiling is most of it.
    short = ["train.compile=true", "train.max_steps=2", "train.warmup=1", "run.eval_batches=1"]
    checked = logged(prepared, tmp_path / "checked", *short, "debug.fp8_check=1")
    plain = logged(prepared, tmp_path / "plain", *short)
    assert [r["step"] for r in shadowed(checked)] == [1]
    assert train_losses(checked) == train_losses(plain) and len(train_losses(plain)) == 2


@pytest.mark.slow
def test_fp8_with_tensor_and_sequence_parallelism_trains_as_one_process(prepared, tmp_path):
    # torch's ColwiseParallel / RowwiseParallel split torchao's Float8Linear as a plain linear: each rank
    # multiplies its part in float8 (tensorwise scales from the whole tensor's amax, a DTensor reduction), the
    # tensor-parallel collectives stay bf16.
    run_dir = tmp_path / "tp"
    finished_torchrun(
        *tiny(
            prepared,
            run_dir,
            *FP8,
            *SHORT,
            "parallel.gpus=2",
            "parallel.tensor=2",
            "parallel.sequence_parallel=true",
            "debug.fp8_check=1",
        )
    )
    one = {r["step"]: r["loss"] for r in logged(prepared, tmp_path / "one") if "loss" in r}
    # the rows' partial sums add in bf16 across ranks, in fp32 within one: 4.3e-4 relative at most, measured
    assert losses(run_dir).keys() == one.keys()
    assert all(losses(run_dir)[k] == pytest.approx(one[k], rel=1e-3) for k in one)
    shadow = next(json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if "fp8_rel_err" in x)
    assert len(shadow["fp8_rel_err"]) == 8 and min(shadow["fp8_rel_err"].values()) > 0.01  # split, still float8
    report = json.loads((run_dir / "plan_vs_run.json").read_text())
    # gloo: torch's styles, bf16 on the wire (tests/gpu/test_fp8_tensor_parallel_cuda.py: float8 over NCCL)
    assert report["fp8"] == {"recipe": "tensorwise", "linears": 8, "skipped": 1, "tensor_parallel": "bf16"}


# torchao's float8 styles on a 1-rank tensor mesh (gloo cannot carry float8, a 1-rank mesh sends nothing): each
# block's Float8Linear gets its input already in float8 (cast before the sequence-parallel all-gather), and one
# forward and backward give the bitwise loss and gradients of torch's styles, which cast inside the linear.
FLOAT8_STYLES = """
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from pretrain.config import load_config
from pretrain.distributed.fp8 import convert
from pretrain.distributed.tensor_parallel import apply_tensor_parallel
from pretrain.model import build_model

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
config = load_config(None, ["model.preset=debug", "train.precision=fp8", "train.fp8_min_features=16"])
x = torch.randint(0, 512, (2, 32))
got = {}
for float8 in (False, True):
    model = build_model(config.model, seed=0)
    convert(model, config, "cpu")
    apply_tensor_parallel(model, mesh, sequence_parallel=True, float8=float8)
    reached = []
    for block in model.blocks:
        for linear in (block.attn.qkv, block.attn.proj, block.mlp.up, block.mlp.down):
            linear.register_forward_pre_hook(lambda m, args: reached.append(type(args[0].to_local()).__name__))
    with torch.autocast("cpu", torch.bfloat16):
        loss = model(x, x)
    loss.backward()
    grads = [p.grad.full_tensor() for p in model.parameters()]
    got[float8] = loss, grads, set(reached)
(l0, g0, r0), (l1, g1, r1) = got[False], got[True]
assert r0 == {"Tensor"} and r1 == {"Float8TrainingTensor"}, (r0, r1)
assert torch.equal(l0, l1) and all(torch.equal(a, b) for a, b in zip(g0, g1)), (l0, l1)
dist.destroy_process_group()
print("ok")
"""


def test_torchaos_float8_styles_cast_before_the_all_gather_and_train_as_torchs():
    r = subprocess.run([sys.executable, "-c", FLOAT8_STYLES], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_tensor_parallelism_sends_float8_only_where_nccl_carries_it():
    from pretrain.config import load_config
    from pretrain.plan.fp8 import float8_tensor_parallel

    def wire(device, *extra):
        config = load_config(None, ["train.precision=fp8", "parallel.gpus=2", "parallel.tensor=2", *extra])
        return float8_tensor_parallel(config, device)

    assert wire("cuda")  # NCCL, tensorwise: torchao's styles, as torchtitan
    assert not wire("cpu")  # gloo: "Invalid scalar type" for float8
    assert not wire("cuda", "train.fp8_recipe=rowwise")  # torchao's styles scale tensorwise
    assert not wire("cuda", "debug.fp8_check=1")  # the shadow needs the bf16 input
