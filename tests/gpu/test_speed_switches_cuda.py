"""The speed switches a GPU turns on by default (issue #44), on CUDA (they skip without a GPU): a compiled
bf16-mixed run keeps its residual stream in bf16 and trains as the fp32 stream does within rounding; the MoE
layer waits for the device nowhere (torch.cuda.set_sync_debug_mode), on the grouped GEMM of sm_90."""

import pytest

from support import GPU_MODEL

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def trainer(prepared, tmp_path, *extra):
    from pretrain.config import load_config
    from pretrain.distributed.runtime import init_runtime
    from pretrain.train.trainer import Trainer

    config = load_config(
        None,
        [
            *GPU_MODEL,
            "train.seq_len=256",
            "train.micro_batch_size=8",
            "train.grad_accum_steps=2",
            "train.max_steps=6",
            "train.precision=bf16-mixed",
            "train.device=cuda",
            "hardware.peak_tflops=null",
            "stability.spike_detection=false",
            f"data.dir={prepared}",
            f"run.dir={tmp_path}",
            *extra,
        ],
    )
    return Trainer(config, init_runtime("cuda"), quiet=True)


def test_compiled_cuda_runs_keep_a_bf16_residual_stream_by_default(prepared, tmp_path):
    losses, dtypes = {}, {}
    for name, extra in [("default", ()), ("fp32 stream", ("train.half_residual=false",))]:
        t = trainer(prepared, tmp_path / name, "train.compile=true", *extra)
        dtypes[name] = t.engine.module.residual_dtype
        losses[name] = [t.step().loss for _ in range(6)]
        t.batches.close()
    assert dtypes == {"default": torch.bfloat16, "fp32 stream": None}
    assert losses["default"][-1] < losses["default"][0]
    assert losses["default"] == pytest.approx(losses["fp32 stream"], rel=2e-2)
    eager = trainer(prepared, tmp_path / "eager", "train.compile=false")
    assert eager.engine.module.residual_dtype is None  # eager: the default stays fp32
    eager.batches.close()


def test_the_moe_layer_never_waits_for_the_device():
    from pretrain.config import load_config
    from pretrain.model.moe import MoE, grouped_mm_on_cuda

    if not grouped_mm_on_cuda(torch.cuda.get_device_capability(), torch.bfloat16):
        pytest.skip("the grouped GEMM serves the experts on sm_90 only; the per-expert loop reads its splits")
    cfg = load_config(None, ["model.preset=moe-debug"]).model
    layer = MoE(cfg).cuda().train()
    x = torch.randn(4, 256, cfg.hidden_size, device="cuda", requires_grad=True)

    def step():
        with torch.autocast("cuda", torch.bfloat16):
            y = layer(x)
        (y.float().sum() + layer.router_loss).backward()

    step()  # kernels loaded, workspaces allocated
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
