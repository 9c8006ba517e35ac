"""Document masking on CUDA: FlexAttention's block mask against the dense boolean mask, forward and backward,
and a masked run through the CLI, compiled and not (they skip without a GPU)."""

import json

import pytest

from support import run_cli, tiny

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("family, length", [("llama", 150), ("gpt2", 150), ("llama", 400)])
def test_flex_block_mask_equals_the_dense_mask(family, length):
    """Documents of ~150 tokens (partial blocks) and of ~400 (whole 128-token blocks of one document: full
    blocks, where the kernel skips the rule)."""
    from pretrain.config import load_config
    from pretrain.model import Documents, build_model

    c = load_config(
        {
            "model": {
                "family": family,
                "vocab_size": 256,
                "hidden_size": 128,
                "intermediate_size": 256,
                "num_layers": 2,
                "num_heads": 4,
                "num_kv_heads": 2 if family == "llama" else None,
                "max_seq_len": 512,
            }
        }
    )
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 256, (2, 512), generator=g)
    tokens[torch.rand(2, 512, generator=g) < 1 / length] = 0  # documents of ~length tokens
    tokens, targets = tokens.cuda(), tokens.roll(-1, 1).cuda()
    grads, losses = [], []
    for kernel in ("flex", "mask"):
        model = build_model(c.model, device="cuda", seed=1, documents=Documents(0, True, True, kernel))
        loss = model(tokens, targets)
        loss.backward()
        losses.append(loss.item())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert (grads[0] - grads[1]).norm() <= 1e-4 * grads[1].norm()


@pytest.mark.parametrize("compile", [False, True])
def test_a_masked_cuda_run_uses_flex(prepared, tmp_path, compile):
    r = run_cli(
        "train",
        *tiny(
            prepared,
            tmp_path / "run",
            "train.device=cuda",
            "train.document_masking=true",
            "train.precision=bf16-mixed",
            "train.max_steps=6",
            "run.checkpoint_every=0",
            "hardware.peak_tflops=null",
            f"train.compile={str(compile).lower()}",
        ),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "plan_vs_run.json").read_text())
    assert report["attention_kernel"] == "flex" and report["document_masking"] is True
