"""pretrain.eval.scoring on its own: the metrics of three hand-made examples, worked out below; the moments
that ranks add up; the log-likelihoods of a real tiny model, batched or not, against its own forward."""

import math

import pytest

torch = pytest.importorskip("torch")

from pretrain.eval.scoring import (  # noqa: E402
    METRICS,
    loglikelihoods,
    moments,
    per_example,
    reported,
    summarize,
    task_metrics,
)
from pretrain.eval.tasks import Request, Task  # noqa: E402

LN2 = math.log(2)


def request(doc, choice, gold, chars, nbytes):
    return Request(doc, choice, (1, 2, 3), 1, chars, nbytes, gold)


# Three examples of two choices: (log-likelihood, characters, UTF-8 bytes) of each choice's continuation.
#   doc 0, gold 1:  (-4, 4, 4) (-6, 12, 12)  acc: -4 wins, miss; per char/byte -1 < -0.5: hit, hit;
#                                            bits/byte 6 / 12 / ln 2
#   doc 1, gold 0:  (-3, 2, 4) (-2.5, 2, 2)  acc: -2.5 wins, miss; per char -1.5 < -1.25: miss; per byte
#                                            -0.75 > -1.25: hit (two non-ASCII characters); bits/byte 3 / 4 / ln 2
#   doc 2, gold 0:  (-2, 2, 2) (-2, 2, 2)    every score ties: the first choice wins, hit, hit, hit; 2 / 2 / ln 2
EXAMPLES = {(0, 0): (-4.0, 4, 4), (0, 1): (-6.0, 12, 12), (1, 0): (-3.0, 2, 4), (1, 1): (-2.5, 2, 2)}
EXAMPLES |= {(2, 0): (-2.0, 2, 2), (2, 1): (-2.0, 2, 2)}
GOLD = {0: 1, 1: 0, 2: 0}


def shuffled_requests():
    """The requests in an order of their own (scoring sorts by example and choice), with their lls."""
    keys = [(2, 1), (0, 1), (1, 0), (2, 0), (0, 0), (1, 1)]
    return [request(d, c, GOLD[d], *EXAMPLES[d, c][1:]) for d, c in keys], [EXAMPLES[k][0] for k in keys]


def test_the_metrics_of_three_examples_worked_out_by_hand():
    requests, lls = shuffled_requests()
    assert per_example(requests, lls) == {
        "acc": [0.0, 0.0, 1.0],
        "acc_norm": [1.0, 0.0, 1.0],
        "acc_bytes": [1.0, 1.0, 1.0],
        "bits_per_byte": [0.5 / LN2, 0.75 / LN2, 1.0 / LN2],
    }
    got = task_metrics(Task("hand", requests, 3), lls)
    # acc [0, 0, 1]: mean 1/3, sample variance ((1/3)^2 + (1/3)^2 + (2/3)^2) / 2 = 1/3, stderr sqrt(1/3 / 3) = 1/3;
    # acc_norm [1, 0, 1] the same spread; bits/byte (0.5, 0.75, 1) / ln 2: mean 0.75 / ln 2, sample variance
    # 0.0625 / ln 2^2, stderr 0.25 / sqrt(3) / ln 2; two choices each: chance 1/2
    expected = {
        "acc": 1 / 3,
        "acc_stderr": 1 / 3,
        "acc_norm": 2 / 3,
        "acc_norm_stderr": 1 / 3,
        "acc_bytes": 1.0,
        "acc_bytes_stderr": 0.0,
        "bits_per_byte": 0.75 / LN2,
        "bits_per_byte_stderr": 0.25 / math.sqrt(3) / LN2,
        "chance": 0.5,
        "examples": 3,
    }
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
    # the in-loop line logs these of them, in this order
    assert list(reported(got)) == [
        "acc",
        "acc_stderr",
        "acc_norm",
        "acc_norm_stderr",
        "acc_bytes",
        "bits_per_byte",
        "chance",
    ]


def test_ranks_moments_add_up_to_one_process():
    """Two ranks, one with example 0 and one with 1 and 2: their moments summed give the one-process results;
    one example alone has no standard error."""
    requests, lls = shuffled_requests()
    first = [(r, ll) for r, ll in zip(requests, lls) if r.doc == 0]
    rest = [(r, ll) for r, ll in zip(requests, lls) if r.doc != 0]
    parts = [moments(per_example([r for r, _ in part], [ll for _, ll in part])) for part in (first, rest)]
    summed = {m.name: [a + b for a, b in zip(parts[0][m.name], parts[1][m.name])] for m in METRICS}
    assert summarize(summed, 0.5) == pytest.approx(task_metrics(Task("hand", requests, 3), lls))
    alone = summarize(parts[0], 0.5)
    assert alone["examples"] == 1 and alone["acc_stderr"] is None and alone["acc_norm"] == 1.0


def test_log_likelihoods_are_the_models_own_in_any_batching():
    """A real tiny model: each continuation's summed log-probability equals the log-softmax of one forward of
    its request alone, whatever the batch size (right padding changes nothing before it), and a context longer
    than the window loses its first tokens."""
    from pretrain.config import load_config
    from pretrain.eval.models import OurModel
    from pretrain.model import build_model

    model = build_model(load_config(None, ["model.preset=debug"]).model, seed=1).eval()
    g = torch.Generator().manual_seed(0)
    lengths, conts = [5, 9, 3, 12, 40], [1, 3, 2, 4, 2]
    requests = [
        Request(i, 0, tuple(torch.randint(1, 250, (n,), generator=g).tolist()), c, c, c, 0)
        for i, (n, c) in enumerate(zip(lengths, conts))
    ]
    lm = OurModel(model, max_len=32)
    with torch.no_grad():
        expected = []
        for r in requests:
            window = torch.tensor(r.tokens[:-1][-32:])[None]
            logits = model(window)[..., : model.config.vocab_size]  # the whole forward, every position's logits
            logprobs = logits.log_softmax(-1)[0, -r.cont_len :]
            targets = torch.tensor(r.tokens[-r.cont_len :])
            expected.append(float(logprobs.gather(-1, targets[:, None]).sum()))
    for batch in (1, 2, 5):
        assert loglikelihoods(lm, requests, batch) == pytest.approx(expected, rel=1e-5)
