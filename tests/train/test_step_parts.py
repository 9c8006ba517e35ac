"""The pieces of the reshaped trainer, in process: read-ahead batches keep an exact resume position, the
MFU peak comes from a stable source, the SDPA kernel that runs is named, compiled blocks have no graph break."""

import json
import math
import os

import pytest

from support import needs_compiler

torch = pytest.importorskip("torch")

from pretrain.config import load_config  # noqa: E402
from pretrain.data.loader import PreparedData  # noqa: E402
from pretrain.data.windows import RandomWindows  # noqa: E402
from pretrain.train.prefetch import Prefetcher  # noqa: E402


def windows(prepared):
    return RandomWindows(PreparedData(prepared), "train", 16, seed=7)


def test_read_ahead_batches_resume_where_training_stopped(prepared):
    plain = windows(prepared)
    expected = [plain.next_batch(2) for _ in range(6)]
    ahead = Prefetcher(windows(prepared), 2, torch.device("cpu"))
    for x, _ in expected[:3]:
        assert torch.equal(ahead.next_batch()[0], x)
    state = ahead.state_dict()  # after 3 batches, although the thread has read further
    ahead.close()
    resumed = Prefetcher(windows(prepared), 2, torch.device("cpu"))
    resumed.load_state_dict(state)
    for x, y in expected[3:]:
        got = resumed.next_batch()
        assert torch.equal(got[0], x) and torch.equal(got[1], y)
    resumed.close()


def test_a_data_error_in_the_reading_thread_reaches_the_trainer():
    class Broken:
        def next_batch(self, batch_size):
            raise ValueError("token 9999 is outside the vocabulary")

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    with pytest.raises(ValueError, match="outside the vocabulary"):
        Prefetcher(Broken(), 2, torch.device("cpu")).next_batch()


def test_a_cpu_profile_is_measured_once_kept_per_machine_threads_and_torch_and_named(tmp_path, monkeypatch):
    # The per-user cache set the plan's speed silently: now one profile per machine, CPU, dtype, threads and
    # torch, and the plan says which measured it and when (issue 43 item 7).
    import platform

    from pretrain.bench.timing import torch_threads
    from pretrain.config import replaced
    from pretrain.plan import make_plan
    from pretrain.plan.cpu_time import micro_batch_ops
    from pretrain.train import plan_check

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    config = load_config(None, ["model.preset=debug", "hardware.gpu=cpu", "train.precision=fp32"])
    hardware, source = plan_check.measured_hardware(config, torch.device("cpu"))
    (path,) = (tmp_path / "pretrain" / "profiles").iterdir()
    assert hardware == {"hardware.profile": str(path)}
    profile = json.loads(path.read_text())
    assert profile["peak_tflops"]["fp32"] > 0 and profile["op_seconds"] > 0 and profile["memory_bandwidth_gbps"] > 0
    threads = torch.get_num_threads()
    for said in (str(path), platform.node(), f"threads {threads}", f"torch {torch.__version__}", "measured once"):
        assert said in source, said
    # Kept: a figure changed by hand is what the next plan reads (a new measurement would show).
    profile.update(op_seconds=1e-3, busy_cores=0.0)
    path.write_text(json.dumps(profile))
    assert plan_check.measured_hardware(config, torch.device("cpu"))[0] == hardware
    planned = make_plan(replaced(config, hardware))["step_time"]["kernel_overhead_s"]
    assert planned == pytest.approx(1e-3 * micro_batch_ops(config, config.model.num_layers))
    # Another thread count is another profile; one measured while other work ran says so in the plan.
    with torch_threads(threads + 1):
        assert plan_check.cpu_profile_path("fp32") != path
    path.write_text(json.dumps({**profile, "busy_cores": 1.5}))
    assert (
        "while other processes kept 1.5 cores busy" in make_plan(replaced(config, hardware))["hardware"]["peak_source"]
    )


@pytest.mark.parametrize("extra, kernel", [([], "flash"), (["train.attention=eager"], "math")])
def test_the_attention_kernel_that_runs_is_named(extra, kernel):
    from pretrain.train.attention import kernel_that_runs

    config = load_config(None, ["model.preset=debug", "train.seq_len=32", "train.precision=fp32", *extra])
    assert kernel_that_runs(config, torch.device("cpu")) == kernel


def test_the_hopper_kernel_order_holds_for_the_step_only():
    # cuDNN, then flash, on compute capability 9.0+ in 16-bit, entered around a step and undone after it:
    # the process's flags stay on, so an fp32 attention after it (a precision sweep's next cell) finds every
    # kernel. The choice used to be made by switching the math and memory-efficient kernels off for good.
    from torch.nn.attention import SDPBackend

    from pretrain.train.attention import SET_PRIORITY, kernel_choice, preferred_kernels

    backends = preferred_kernels("bf16-mixed", (9, 0))
    assert backends[:2] == [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]
    assert preferred_kernels("fp32", (9, 0)) is None and preferred_kernels("bf16-mixed", (8, 0)) is None
    assert preferred_kernels("bf16", None) is None  # not a GPU: torch's own choice
    # Blackwell: cuDNN corrupts GQA with fewer than 8 k/v heads (pytorch#193893), never chosen there
    assert preferred_kernels("bf16-mixed", (9, 0), kv_heads=2) == backends
    assert preferred_kernels("bf16-mixed", (10, 0), kv_heads=8) == backends
    blackwell = preferred_kernels("bf16-mixed", (10, 0), kv_heads=4)
    assert blackwell == [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    flags, order = sdp_flags(), torch._C._get_sdp_priority_order()
    q = torch.randn(1, 2, 8, 16, dtype=torch.bfloat16)
    with kernel_choice(backends)():
        if SET_PRIORITY:
            assert torch._C._get_sdp_priority_order()[:2] == [int(b) for b in backends[:2]]
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert sdp_flags() == flags and torch._C._get_sdp_priority_order() == order
    assert torch.backends.cuda.math_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()


def test_a_16_bit_run_then_an_fp32_run_in_one_process(prepared, tmp_path):
    from pretrain.distributed.runtime import init_runtime
    from pretrain.train.trainer import Trainer

    flags = sdp_flags()
    for precision in ("bf16-mixed", "fp32"):
        config = load_config(
            None,
            [
                "model.preset=debug",
                "train.seq_len=32",
                "train.micro_batch_size=2",
                "train.max_steps=2",
                f"train.precision={precision}",
                "train.device=cpu",
                "stability.spike_detection=false",
                f"data.dir={prepared}",
                f"run.dir={tmp_path / precision}",
                "hardware.peak_tflops=0.05",
            ],
        )
        trainer = Trainer(config, init_runtime("cpu"), quiet=True)
        try:
            assert math.isfinite(trainer.step().loss)
        finally:
            trainer.batches.close()
        assert sdp_flags() == flags


def sdp_flags() -> tuple:
    b = torch.backends.cuda
    return b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled(), b.cudnn_sdp_enabled()


@needs_compiler
@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_compiled_blocks_have_no_graph_break(recompute):
    from pretrain.distributed.parallelize import parallelize
    from pretrain.distributed.runtime import init_runtime
    from pretrain.model import build_model

    torch._dynamo.reset()
    config = load_config(
        None,
        [
            "model.preset=debug",
            "train.seq_len=32",
            "train.precision=fp32",
            "train.compile=true",
            f"train.activation_checkpointing={recompute}",
        ],
    )
    engine = parallelize(build_model(config.model), config, init_runtime("cpu"))
    x = torch.randint(0, 512, (2, 32))
    block = engine.module.blocks[0]
    h = engine.module.embed(x)
    explained = torch._dynamo.explain(block._orig_mod if hasattr(block, "_orig_mod") else block.forward)(
        h, engine.module.rotary(32, h.device)
    )
    assert explained.graph_break_count == 0, explained.break_reasons


@needs_compiler
@pytest.mark.slow
@pytest.mark.parametrize("loss", ["chunked", "plain"])
def test_the_compiled_output_layer_and_loss_are_one_graph(loss):
    # Issue 13: per-block compile plus a compiled output layer and loss. parallelize() compiles `model.loss`
    # (which takes the output weight as an argument) in place, with fullgraph, in every layout.
    from pretrain.distributed.parallelize import parallelize
    from pretrain.distributed.runtime import init_runtime
    from pretrain.model import build_model

    torch._dynamo.reset()
    config = load_config(
        None,
        [
            "model.preset=debug",
            "train.seq_len=32",
            "train.precision=fp32",
            "train.compile=true",
            f"train.loss={loss}",
            "train.loss_chunk_tokens=24",
        ],
    )
    model = build_model(config.model, loss=loss, loss_chunk_tokens=config.train.loss_chunk_tokens)
    engine = parallelize(model, config, init_runtime("cpu"))
    assert model.loss._compiled_call_impl is not None  # what nn.Module.compile sets
    h, y = torch.randn(2, 32, config.model.hidden_size, requires_grad=True), torch.randint(0, 512, (2, 32))
    explained = torch._dynamo.explain(model.loss.forward)(h, engine.module.lm_head.weight, y)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_the_cuda_allocator_grows_segments_unless_the_user_chose(monkeypatch):
    from pretrain.train import use_expandable_segments

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    use_expandable_segments()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    use_expandable_segments()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"  # the user's choice stands
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:512")  # its newer name (torch >= 2.9)
    use_expandable_segments()
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
