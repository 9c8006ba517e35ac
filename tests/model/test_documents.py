"""Document masking (train.document_masking) and positions that restart at each <eos> (model.position_reset):
a window's second document sees exactly what it would see alone from position 0, in both model families."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pretrain.config import load_config
from pretrain.model import Documents, build_model
from pretrain.model.documents import block_diagonal_mask, document_ids, positions_in_documents

EOS = 0


def tiny_model(family: str, documents):
    shape = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, max_seq_len=64)
    if family == "llama":
        shape["num_kv_heads"] = 2  # grouped-query attention under the mask too
    c = load_config({"model": {"family": family, **shape}, "train": {"seq_len": 48}})
    return build_model(c.model, seed=3, documents=documents).eval()


def window():
    """A window of three documents: [5 tokens + eos][9 tokens + eos][rest, no eos: cut by the window's end]."""
    g = torch.Generator().manual_seed(0)
    first, second, third = (torch.randint(1, 64, (n,), generator=g) for n in (5, 9, 20))
    eos = torch.tensor([EOS])
    return torch.cat([first, eos, second, eos, third])[None], torch.cat([second, eos])[None]


def test_document_ids_and_positions_restart_after_each_eos():
    tokens = torch.tensor([[7, 0, 3, 4, 0, 0, 9]])
    assert document_ids(tokens, EOS).tolist() == [[0, 0, 1, 1, 1, 2, 3]]
    assert positions_in_documents(tokens, EOS).tolist() == [[0, 1, 0, 1, 2, 0, 0]]
    mask = block_diagonal_mask(document_ids(tokens, EOS))[0, 0]
    assert mask[3].tolist() == [False, False, True, True, False, False, False]
    assert mask[1].tolist() == [True, True, False, False, False, False, False]  # the eos sees its own document


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("attention, kernel", [("sdpa", "loop"), ("sdpa", "mask"), ("eager", "mask")])
def test_second_document_equals_itself_alone(family, attention, kernel):
    tokens, alone = window()
    masked = tiny_model(family, Documents(EOS, masking=True, position_reset=True, kernel=kernel))
    masked.blocks[0].attn.attention = masked.blocks[1].attn.attention = attention
    with torch.no_grad():
        inside = masked(tokens)[0, 6:16]
        by_itself = masked(alone)[0]
        packed = tiny_model(family, None)(tokens)[0, 6:16]
    assert torch.allclose(inside, by_itself, rtol=0, atol=1e-6), (inside - by_itself).abs().max()
    assert not torch.allclose(packed, by_itself, rtol=0, atol=1e-3)  # without masking the first document leaks in


def test_the_per_document_loop_equals_the_dense_mask():
    """The CPU's kernel (SDPA per document) against the boolean mask, forward and backward."""
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 64, (3, 48), generator=g)  # ids 0 (<eos>) one in 64: some rows of one document
    tokens[1, ::7] = EOS
    grads = []
    for kernel in ("loop", "mask"):
        model = tiny_model("llama", Documents(EOS, masking=True, position_reset=True, kernel=kernel)).train()
        model(tokens, tokens.roll(-1, 1)).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_positions_alone_are_not_independence(family):
    """Restarted positions without the mask leave the first document in view. (The mask without restarted
    positions is enough for RoPE, whose scores depend on i - j only; GPT-2's absolute positions need both.)"""
    tokens, alone = window()
    cases = [Documents(EOS, masking=False, position_reset=True)]
    if family == "gpt2":
        cases.append(Documents(EOS, masking=True, position_reset=False))
    for documents in cases:
        model = tiny_model(family, documents)
        with torch.no_grad():
            assert not torch.allclose(model(tokens)[0, 6:16], model(alone)[0], rtol=0, atol=1e-3)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_masked_training_equals_training_each_document_alone(family):
    """Ten AdamW steps on packed windows with the mask equal ten steps whose loss is each document's run alone
    from position 0 (the same tokens, targets and mean over tokens): relative 1e-10 on every weight, in fp64.
    (In fp32 the two differ by rounding, ~1e-7, and Adam divides each gradient by its own size: where a gradient
    is zero alone (the keys of a one-token document) and rounding noise packed, the noise becomes a step of
    ~lr, 2.5e-5 relative after ten steps. fp64 takes the rounding out and leaves the mask's logic.)"""
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(10):
        rows = torch.randint(1, 64, (2, 33), generator=g)
        rows[rows < 8] = EOS  # about one token in eight ends a document
        batches.append((rows[:, :-1], rows[:, 1:]))
    masked = tiny_model(family, Documents(EOS, masking=True, position_reset=True, kernel="loop")).train().double()
    alone = tiny_model(family, None).train().double()
    opt_masked = torch.optim.AdamW(masked.parameters(), lr=1e-2)
    opt_alone = torch.optim.AdamW(alone.parameters(), lr=1e-2)
    for x, y in batches:
        F.cross_entropy(masked(x).flatten(0, 1), y.flatten()).backward()
        total = 0.0
        for row, targets in zip(x, y):
            for doc in document_ids(row[None], EOS)[0].unique():
                part = document_ids(row[None], EOS)[0] == doc
                logits = alone(row[part][None])[0]
                total = total + F.cross_entropy(logits, targets[part], reduction="sum")
        (total / y.numel()).backward()
        for opt in (opt_masked, opt_alone):
            opt.step()
            opt.zero_grad()
    for (name, a), b in zip(masked.named_parameters(), alone.parameters()):
        assert (a - b).norm() <= 1e-10 * b.norm(), name
    unmasked = tiny_model(family, None).train().double()
    opt = torch.optim.AdamW(unmasked.parameters(), lr=1e-2)
    for x, y in batches:
        F.cross_entropy(unmasked(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad()
    assert (unmasked.lm_head.weight - alone.lm_head.weight).norm() > 1e-3 * alone.lm_head.weight.norm()


def test_the_kernel_follows_the_device_and_never_falls_back_unmasked():
    from pretrain.errors import UsageError
    from pretrain.model.documents import documents_of_run

    def kernel(device="cpu", eos=EOS, **train):
        c = load_config({"model": {"preset": "debug"}, "train": {"document_masking": True, **train}})
        return documents_of_run(c.model, c.train, torch.device(device), eos).kernel

    assert kernel() == "loop"
    assert kernel(compile=True) == "mask"  # the loop's lengths change per batch: a recompilation each
    assert kernel(attention="eager") == "mask"
    with pytest.raises(UsageError, match="no masked attention kernel for device meta"):
        kernel("meta")
    with pytest.raises(UsageError, match="reads no prepared data"):
        kernel(eos=None)
    off = load_config({"model": {"preset": "debug"}})
    assert documents_of_run(off.model, off.train, torch.device("cpu"), EOS) is None  # today's packing
    reset = load_config({"model": {"preset": "debug", "position_reset": True}})
    assert documents_of_run(reset.model, reset.train, torch.device("cpu"), EOS) == \
        Documents(EOS, masking=False, position_reset=True)
