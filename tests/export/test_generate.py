"""Sampling: greedy is deterministic, lengths and eos are respected, top-k / top-p restrict the support."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from pretrain.errors import UsageError
from pretrain.export.generate import generate, generate_text
from support import run_here


class FixedDistribution(nn.Module):
    """A stand-in model whose next-token logits are always log(probs), whatever the context."""

    def __init__(self, probs):
        super().__init__()
        self.logits = nn.Parameter(torch.tensor(probs).log())
        self.config = SimpleNamespace(max_seq_len=4, vocab_size=len(probs))

    def forward(self, tokens):
        return self.logits.expand(*tokens.shape, -1)


class Successor(nn.Module):
    """Greedy picks (last token + 1) mod vocab: a known sequence to test stopping on."""

    def __init__(self, vocab=16):
        super().__init__()
        self.vocab = vocab
        self.config = SimpleNamespace(max_seq_len=8, vocab_size=vocab)
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, tokens):
        return nn.functional.one_hot((tokens + 1) % self.vocab, self.vocab).float() + self.dummy


def sampled(model, n=400, **kw):
    out = generate(model, torch.zeros(1, 1, dtype=torch.long), n, generator=torch.Generator().manual_seed(0), **kw)
    return set(out[0, 1:].tolist())


PROBS = [0.4, 0.3, 0.2, 0.1]


def test_plain_sampling_reaches_every_token():
    assert sampled(FixedDistribution(PROBS)) == {0, 1, 2, 3}


@pytest.mark.parametrize("top_k, expected", [(1, {0}), (2, {0, 1}), (3, {0, 1, 2})])
def test_top_k_keeps_the_k_most_likely(top_k, expected):
    assert sampled(FixedDistribution(PROBS), top_k=top_k) == expected


# The smallest set of most likely tokens whose probability reaches top_p: 0.4 | 0.4+0.3 | 0.4+0.3+0.2.
@pytest.mark.parametrize("top_p, expected", [(0.3, {0}), (0.4, {0}), (0.6, {0, 1}), (0.75, {0, 1, 2})])
def test_top_p_keeps_the_nucleus(top_p, expected):
    assert sampled(FixedDistribution(PROBS), top_p=top_p) == expected


def test_temperature_zero_is_argmax():
    assert sampled(FixedDistribution([0.1, 0.2, 0.6, 0.1]), n=20, temperature=0) == {2}


def test_greedy_is_deterministic_and_respects_max_new_tokens(make_model):
    model = make_model(["model.max_seq_len=16"])
    prompt = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(0))
    first = generate(model, prompt, 10, temperature=0)  # 22 tokens: the context is cropped to the last 16
    assert first.shape == (2, 22) and torch.equal(first[:, :12], prompt)
    assert torch.equal(first, generate(model, prompt, 10, temperature=0))


def test_seeded_sampling_is_reproducible(make_model):
    model = make_model()
    prompt = torch.zeros(1, 3, dtype=torch.long)
    runs = [generate(model, prompt, 8, top_k=50, generator=torch.Generator().manual_seed(7)) for _ in range(2)]
    assert torch.equal(*runs)


def test_stops_at_eos_and_pads_finished_rows():
    # Row 0 counts 3, 4, 5 (eos) and waits, padded with eos; row 1 counts 1 .. 5 and ends the loop.
    out = generate(Successor(), torch.tensor([[3], [1]]), max_new_tokens=10, temperature=0, eos_id=5)
    assert out.tolist() == [[3, 4, 5, 5, 5], [1, 2, 3, 4, 5]]


def test_bad_arguments_are_usage_errors():
    model = FixedDistribution(PROBS)
    prompt = torch.zeros(1, 1, dtype=torch.long)
    for kw in (dict(temperature=-1), dict(temperature=float("nan")), dict(top_k=0), dict(top_p=0), dict(top_p=1.5)):
        with pytest.raises(UsageError):
            generate(model, prompt, 1, **kw)
    with pytest.raises(UsageError, match="batch, seq"):
        generate(model, torch.zeros(3, dtype=torch.long), 1)
    with pytest.raises(UsageError, match="max_new_tokens must be >= 0, got -5"):
        generate(model, prompt, -5)
    with pytest.raises(UsageError, match=r"token ids must be in \[0, 4\)"):
        generate(model, torch.tensor([[0, 4]]), 1)


def test_a_tokenizer_beyond_the_model_vocabulary_is_refused(tokenizer_dir):
    with pytest.raises(UsageError, match="ids go up to 63, beyond the model's vocabulary of 16"):
        generate_text(Successor(vocab=16), tokenizer_dir, "w50", max_new_tokens=2, temperature=0)


def test_a_prompt_that_is_not_utf8_is_refused(tokenizer_dir):
    prompt = b"w1 caf\xe9".decode("utf-8", "surrogateescape")  # what Python makes of such bytes in argv
    with pytest.raises(UsageError, match="not valid UTF-8"):
        generate_text(Successor(vocab=64), tokenizer_dir, prompt, max_new_tokens=2, temperature=0)


def test_generate_text_continues_the_prompt(make_model, tokenizer_dir):
    model = make_model(["model.vocab_size=64"])  # the conftest tokenizer's 64 words
    text = generate_text(model, tokenizer_dir / "tokenizer.json", "w1 w2 w3", max_new_tokens=5, temperature=0)
    assert text.startswith("w1 w2 w3") and len(text.split()) <= 8


def test_generate_text_starts_at_bos_and_stops_at_eos(tokenizer_dir):
    # Conftest tokenizer: <bos> 1, <eos> 2, <unk> 3, w0 4. Counting on from <bos> reaches <eos> first; without
    # the stop, <eos> <unk> w0 w1 w2 would follow.
    assert generate_text(Successor(vocab=64), tokenizer_dir, "", max_new_tokens=5, temperature=0) == ""
    assert (
        generate_text(Successor(vocab=64), tokenizer_dir, "", max_new_tokens=5, temperature=0, eos_id=None)
        == "w0 w1 w2"
    )


def test_a_padded_id_is_never_sampled(make_model):
    # model.pad_vocab_to=64 makes 512 rows for a 500-id vocabulary. The padded output rows are made to win every
    # argmax and most of every softmax: still no id >= 500 comes out, greedy or sampled.
    model = make_model(["model.vocab_size=500", "model.pad_vocab_to=64"])
    assert model.lm_head.weight.shape[0] == 512
    with torch.no_grad():
        model.lm_head.weight[500:] = 100 * model.lm_head.weight[:12].sign()
    prompt = torch.randint(0, 500, (2, 4), generator=torch.Generator().manual_seed(0))
    for kw in (dict(temperature=0), dict(temperature=2.0, generator=torch.Generator().manual_seed(0))):
        out = generate(model, prompt, 40, **kw)
        assert out.max() < 500, kw


def test_special_token_text_in_the_prompt_is_plain_text_as_in_prepare(trained):
    # prepare encodes the text "<eos>" in a document as its five characters (TokenizerFiles.load), so the model
    # never saw the end-of-document id there: the prompt is read the same way and comes back whole.
    prompt = "x = 1 <eos> y <bos>"
    r = run_here("generate", trained, "--prompt", prompt, "--max-new-tokens", 0)
    assert r.returncode == 0, r.stderr
    assert r.stdout == prompt + "\n"
    r = run_here("generate", trained, "--prompt", prompt, "--max-new-tokens", 5, "--temperature", 0)
    assert r.returncode == 0 and r.stdout.startswith(prompt), r.stdout + r.stderr
