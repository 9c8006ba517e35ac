"""The chunked cross-entropy (train.loss: chunked) against the plain one it replaces, on real tiny models.

fp32: the same loss within 1e-6 relative and the same gradients (the chunked path only sums in another
order). Half precision: the matmuls round in bf16 / fp16 in both paths, at different places (the plain path
rounds the full logits, the chunked one the gradient of each chunk), so the gradients agree to bf16's precision.
"""

import json

import pytest

torch = pytest.importorskip("torch")

from pretrain.config import load_config  # noqa: E402
from pretrain.model import build_model  # noqa: E402
from pretrain.model.loss import ChunkedCrossEntropy, CrossEntropy  # noqa: E402
from support import needs_compiler, run_here, tiny  # noqa: E402

SHAPES = {
    "llama": ["model.preset=debug"],
    "llama-tied": ["model.preset=debug", "model.tie_embeddings=true"],
    "gpt2": [
        "model.preset=debug",
        "model.family=gpt2",
        "model.num_kv_heads=4",
        "model.intermediate_size=256",
        "model.tie_embeddings=true",
    ],
    "gpt2-untied": ["model.preset=debug", "model.family=gpt2", "model.num_kv_heads=4", "model.intermediate_size=256"],
}
BATCH, SEQ = 3, 16
CHUNK = 7  # does not divide BATCH x SEQ = 48: the last chunk is short
AUTOCAST = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


def batches(n: int):
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randint(0, 512, (BATCH, SEQ), generator=g), torch.randint(0, 512, (BATCH, SEQ), generator=g))
        for _ in range(n)
    ]


def accumulated_step(shape, loss, precision="fp32", micro_batches=2):
    """Losses and accumulated gradients (unscaled, fp32) of `micro_batches` micro-batches, as the trainer runs
    them: backward of loss / micro_batches, through a GradScaler under fp16."""
    c = load_config(overrides=["model.num_layers=2", f"train.seq_len={SEQ}", *SHAPES[shape]])
    model = build_model(c.model, seed=3, loss=loss, loss_chunk_tokens=CHUNK)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12) if precision == "fp16-mixed" else None
    losses = []
    for x, y in batches(micro_batches):
        with torch.autocast("cpu", dtype=AUTOCAST.get(precision, torch.bfloat16), enabled=precision in AUTOCAST):
            out = model(x, y)
        losses.append(out.item())
        scaled = out / micro_batches
        (scaler.scale(scaled) if scaler else scaled).backward()
    scale = scaler.get_scale() if scaler else 1.0
    return losses, {n: p.grad.float() / scale for n, p in model.named_parameters()}


def relative(a, b) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("shape", SHAPES)
def test_fp32_loss_and_every_gradient_equal_the_plain_path(shape):
    plain_losses, plain_grads = accumulated_step(shape, "plain")
    losses, grads = accumulated_step(shape, "chunked")
    assert losses == pytest.approx(plain_losses, rel=1e-6)
    assert grads.keys() == plain_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], plain_grads[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16", "fp16-mixed"])
@pytest.mark.parametrize("shape", ["llama", "gpt2"])
def test_half_precision_matches_the_plain_path_to_its_rounding(shape, precision):
    plain_losses, plain_grads = accumulated_step(shape, "plain", precision)
    losses, grads = accumulated_step(shape, "chunked", precision)
    assert losses == pytest.approx(plain_losses, rel=1e-3)
    for name in grads:
        assert relative(grads[name], plain_grads[name]) < 2e-2, name


def test_the_kept_gradients_carry_grad_output():
    """backward multiplies the kept gradients by grad_output: a GradScaler's scale, 1 / accumulation."""
    torch.manual_seed(0)
    h, w = torch.randn(20, 8, requires_grad=True), torch.randn(50, 8, requires_grad=True)
    y = torch.randint(0, 50, (20,))
    ChunkedCrossEntropy(6)(h, w, y).backward()
    once = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ChunkedCrossEntropy(6)(h, w, y).backward(torch.tensor(1024.0))
    torch.testing.assert_close(h.grad, 1024 * once[0])
    torch.testing.assert_close(w.grad, 1024 * once[1])


def test_evaluation_computes_the_loss_only():
    torch.manual_seed(0)
    h, w = torch.randn(2, 9, 8, requires_grad=True), torch.randn(50, 8, requires_grad=True)
    y = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        evaluated = ChunkedCrossEntropy(4)(h, w, y)
    assert evaluated.grad_fn is None
    assert evaluated.item() == pytest.approx(CrossEntropy()(h, w, y).item(), rel=1e-6)


def test_chunked_loss_keeps_only_the_two_gradients():
    """What stays alive from forward to backward: dL/dh (tokens x h) and dL/dW (V x h), no logits."""
    torch.manual_seed(0)
    h, w = torch.randn(2, 9, 8, requires_grad=True), torch.randn(50, 8, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        ChunkedCrossEntropy(4)(h, w, torch.randint(0, 50, (2, 9)))
    assert sorted(tuple(t.shape) for t in saved) == [(18, 8), (50, 8)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunks_share_one_scratch(dtype):
    """Logsumexp's temporary, the half-precision product and the chunk's gradient are made in one scratch for
    all chunks: per chunk, only its fp32 logits are a new chunk-sized allocation (a fresh one per op costs
    about as much as the op on a CPU)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    chunk, vocab = 5, 96  # 6 full chunks of 32 tokens and a short one; no other tensor has a chunk's sizes
    h = torch.randn(2, 16, 6, dtype=dtype, requires_grad=True)
    w = torch.randn(vocab, 6, dtype=dtype, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        ChunkedCrossEntropy(chunk)(h, w, torch.randint(0, vocab, (2, 16)))
    sizes = []

    def walk(node):
        if node.tag == _EventType.Allocation:
            sizes.append(node.extra_fields.alloc_size)
        for child in node.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    chunk_sized = [n for n in sizes if n in (2 * chunk * vocab, 4 * chunk * vocab)]  # in bf16 or fp32
    assert chunk_sized == [4 * chunk * vocab] * (1 + 6)  # the scratch, then each full chunk's logits


@needs_compiler
def test_output_layer_and_loss_compile_as_one_graph():
    torch.manual_seed(0)
    h, w = torch.randn(2, 15, 32, requires_grad=True), torch.randn(100, 32, requires_grad=True)
    y = torch.randint(0, 100, (2, 15))
    loss = ChunkedCrossEntropy(8)
    loss(h, w, y).backward()
    eager = loss(h.detach(), w.detach(), y), h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    compiled = torch.compile(loss, fullgraph=True)  # fails on a graph break
    out = compiled(h, w, y)
    out.backward()
    torch.testing.assert_close(out, eager[0])
    torch.testing.assert_close(h.grad, eager[1])
    torch.testing.assert_close(w.grad, eager[2])


def test_a_training_run_with_the_default_loss_matches_plain(prepared, tmp_path):
    """`pretrain train` with the default (chunked, 40-token chunks: not a divisor of 4 x 32) against
    train.loss=plain: the logged losses within 1e-6 relative over the run (fp32)."""

    def losses(name, *extra):
        r = run_here("train", *tiny(prepared, tmp_path / name, "train.max_steps=6", "run.eval_every=6", *extra))
        assert r.returncode == 0, r.stderr
        rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [(row["step"], row["loss"]) for row in rows if "loss" in row]

    plain, chunked = losses("plain", "train.loss=plain"), losses("chunked", "train.loss_chunk_tokens=40")
    assert [s for s, _ in chunked] == [s for s, _ in plain] == list(range(1, 7))
    assert [v for _, v in chunked] == pytest.approx([v for _, v in plain], rel=1e-6)
    assert chunked[-1][1] < chunked[0][1]  # it trains


@needs_compiler
def test_a_models_loss_module_compiles_in_place():
    """What the trainer does under FSDP: blocks compiled one by one, and `model.loss` (output layer + loss) too."""
    c = load_config(overrides=["model.num_layers=2", f"train.seq_len={SEQ}", *SHAPES["llama-tied"]])
    ((x, y),) = batches(1)
    eager = build_model(c.model, seed=3, loss_chunk_tokens=CHUNK)
    compiled = build_model(c.model, seed=3, loss_chunk_tokens=CHUNK)
    compiled.loss.compile(fullgraph=True)
    for model in (eager, compiled):
        model(x, y).backward()
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(b.grad, a.grad, msg=name)
