"""The pieces of the reshaped trainer, in process: read-ahead batches keep an exact resume position, the
MFU peak comes from a stable source, the SDPA kernel that runs is named, compiled blocks have no graph break."""

import json

import pytest

from support import needs_compiler

torch = pytest.importorskip("torch")

from pretrain.config import load_config  # noqa: E402
from pretrain.data.loader import PreparedData, RandomWindows  # noqa: E402
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


def test_a_cpu_peak_is_measured_once_and_kept(tmp_path, monkeypatch):
    from pretrain.train import plan_check

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    config = load_config(None, ["model.preset=debug", "hardware.gpu=cpu", "train.precision=fp32"])
    peak, source = plan_check.peak_tflops(config, torch.device("cpu"))
    cache = tmp_path / "pretrain" / "peak_tflops.json"
    assert peak > 0 and "measured once" in source and str(cache) in source
    # A second run reads the kept figure (here changed by hand, so a new measurement would show).
    key, = json.loads(cache.read_text())
    cache.write_text(json.dumps({key: 123.0}))
    assert plan_check.peak_tflops(config, torch.device("cpu"))[0] == 123.0


@pytest.mark.parametrize("extra, kernel", [([], "flash"), (["train.attention=eager"], "math")])
def test_the_attention_kernel_that_runs_is_named(extra, kernel):
    from pretrain.train.attention import kernel_that_runs

    config = load_config(None, ["model.preset=debug", "train.seq_len=32", "train.precision=fp32", *extra])
    assert kernel_that_runs(config, torch.device("cpu")) == kernel


@needs_compiler
@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_compiled_blocks_have_no_graph_break(recompute):
    from pretrain.distributed.parallelize import parallelize
    from pretrain.distributed.runtime import init_runtime
    from pretrain.model import build_model

    torch._dynamo.reset()
    config = load_config(None, ["model.preset=debug", "train.seq_len=32", "train.precision=fp32",
                                "train.compile=true", f"train.activation_checkpointing={recompute}"])
    par = parallelize(build_model(config.model), config, init_runtime("cpu"))
    x = torch.randint(0, 512, (2, 32))
    block = par.module.blocks[0]
    h = par.module.embed(x)
    explained = torch._dynamo.explain(block._orig_mod if hasattr(block, "_orig_mod") else block.forward)(
        h, par.module.rotary(32, h.device))
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
    config = load_config(None, ["model.preset=debug", "train.seq_len=32", "train.precision=fp32",
                                "train.compile=true", f"train.loss={loss}", "train.loss_chunk_tokens=24"])
    model = build_model(config.model, loss=loss, loss_chunk_tokens=config.train.loss_chunk_tokens)
    par = parallelize(model, config, init_runtime("cpu"))
    assert model.loss._compiled_call_impl is not None  # what nn.Module.compile sets
    h, y = torch.randn(2, 32, config.model.hidden_size, requires_grad=True), torch.randint(0, 512, (2, 32))
    explained = torch._dynamo.explain(model.loss.forward)(h, par.module.lm_head.weight, y)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
