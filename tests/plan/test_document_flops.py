"""The planner's attention under train.document_masking: sum L_i^2 over each window's documents, not seq^2.

The FLOP counter (torch.utils.flop_counter) counts what a dense kernel executes: the eager attention's QK^T and
AV over the whole seq x seq square, masked or not (SDPA's boolean mask too). The MFU convention with masking is
the pairs the model needs, sum L_i^2 per window (what FlexAttention's block-sparse kernel computes, up to its
128-token blocks): so the test takes the counter's matmuls, scales its attention bmm's to the window's
same-document pairs, and compares with the plan.
"""

import json

import pytest

torch = pytest.importorskip("torch")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from pretrain.config import load_config  # noqa: E402
from pretrain.model import Documents, build_model  # noqa: E402
from pretrain.model.documents import document_ids  # noqa: E402
from pretrain.plan import make_plan  # noqa: E402
from pretrain.plan.documents import mean_context  # noqa: E402
from pretrain.plan.table import render  # noqa: E402

SEQ, EOS = 32, 0


def stream_windows(length: int) -> torch.Tensor:
    """SEQ documents of `length` tokens (<eos> last) end to end, cut into windows of SEQ as the loader cuts
    them: `length` odd, so the documents start at every offset of the window grid once (the planner's
    expectation over offsets, exactly)."""
    g = torch.Generator().manual_seed(length)
    docs = torch.randint(1, 512, (SEQ, length), generator=g)
    docs[:, -1] = EOS
    return docs.flatten().view(-1, SEQ)


def squared_pieces(windows: torch.Tensor) -> int:
    """Sum over windows of sum L_i^2 over the document pieces inside each."""
    return sum(int((torch.bincount(doc) ** 2).sum()) for doc in document_ids(windows, EOS))


def config(*extra):
    return load_config(
        overrides=[
            "model.preset=debug",
            "model.num_layers=2",
            f"train.seq_len={SEQ}",
            "hardware.gpu=cpu",
            "train.precision=fp32",
            "train.attention=eager",
            *extra,
        ]
    )


@pytest.mark.parametrize("length", [5, 25, 45, 97])  # shorter than, near, and longer than a window
def test_the_planned_context_is_the_windows_sum_of_squares(length):
    windows = stream_windows(length)
    assert mean_context({length: 1}, SEQ) == pytest.approx(squared_pieces(windows) / windows.numel(), rel=1e-12)


def test_planned_flops_equal_the_counted_masked_step():
    length = 25
    c = config("train.document_masking=true", f"data.mean_doc_tokens={length}")
    model = build_model(c.model, attention="eager", documents=Documents(EOS, True, True))
    x = stream_windows(length)
    y = x.roll(-1)
    with FlopCounterMode(display=False) as counter:
        model(x, y).backward()
    ops = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    attention = sum(n for op, n in ops.items() if "bmm" in op)  # eager QK^T and AV, forward and backward
    masked = counter.get_total_flops() - attention + attention * squared_pieces(x) / (x.numel() * SEQ)
    flops = make_plan(c)["flops"]
    not_matmul = 6 * sum(p.numel() for p in model.parameters() if p.ndim == 1)  # norms: planned as matmuls
    assert masked / x.numel() == pytest.approx(flops["per_token"] - not_matmul, rel=1e-9)
    assert flops["document_lengths"] == "data.mean_doc_tokens"
    unmasked = make_plan(config())["flops"]
    assert flops["attention_per_token"] < unmasked["attention_per_token"] and "document_lengths" not in unmasked


def test_the_histogram_of_data_dir_prices_the_attention(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({"doc_length_histogram": {"train": {"8": 10, "64": 2}}}))
    flops = make_plan(config("train.document_masking=true", f"data.dir={tmp_path}", "data.mean_doc_tokens=5"))["flops"]
    assert flops["document_lengths"] == "meta.json"  # before data.mean_doc_tokens
    context = mean_context({11.5: 10, 95.5: 2}, SEQ)  # each bin at the mean of its integers, (3 lo - 1) / 2
    assert flops["attention_per_token"] == round(12 * 2 * 4 * 16 * context)  # layers x heads x head_dim (debug)
    unknown = make_plan(config("train.document_masking=true"))["flops"]
    assert unknown["document_lengths"] == "none"
    assert unknown["attention_per_token"] == make_plan(config())["flops"]["attention_per_token"]
    # The plan table says masking is on, with the keys per query its attention is priced at; unmasked, no row.
    masked = config("train.document_masking=true", f"data.dir={tmp_path}")
    assert flops["attention_context"] == pytest.approx(context)
    assert "attention_context" not in make_plan(config())["flops"]
    (row,) = [line for line in render(masked, make_plan(masked)).splitlines() if "Document masking" in line]
    assert f"{context:,.1f} keys per query of {SEQ}" in row and "meta.json" in row
    assert "Document masking" not in render(config(), make_plan(config()))


def test_a_mixture_weights_its_sources_histograms(two_corpora, tmp_path):
    """Each window comes from one source, a share w_s of the tokens: the planned context is sum w_s C_s, each
    C_s from that source's own prepared histogram (worked by hand here, bin by bin)."""
    seq, dirs = 256, (two_corpora["shakespeare"], two_corpora["zh"])

    def by_hand(directory) -> float:
        bins = json.loads((directory / "meta.json").read_text())["doc_length_histogram"]["train"]
        middles = {(3 * int(lo) - 1) / 2: n for lo, n in bins.items()}
        lengths = sum(length * n for length, n in middles.items())
        squares = 0.0
        for length, n in middles.items():
            cut = (
                length * length - length * (length * length - 1) / (3 * seq)
                if length <= seq
                else length * seq - (seq * seq - 1) / 3
            )
            squares += cut * n
        return squares / lengths

    def attention(*extra):
        flops = make_plan(config("train.document_masking=true", f"train.seq_len={seq}", *extra))["flops"]
        return flops["attention_per_token"], flops["document_lengths"]

    english, chinese = by_hand(dirs[0]), by_hand(dirs[1])
    assert abs(english - chinese) > 10  # the two corpora's documents differ, so the weights matter
    per_key = 12 * 2 * 4 * 16  # layers x heads x head_dim of the debug preset, two layers
    mixture = f"data.mixture=[{{dir: {dirs[0]}, weight: 7}}, {{dir: {dirs[1]}, weight: 3}}]"
    assert attention(mixture, "data.mean_doc_tokens=5") == (
        round(per_key * (0.7 * english + 0.3 * chinese)),
        "meta.json",
    )
    alone = attention(f"data.dir={dirs[0]}")  # one source: as data.dir reads it, unchanged by the mixture's rule
    assert alone == (round(per_key * english), "meta.json")
    assert attention(f"data.mixture=[{{dir: {dirs[0]}, weight: 1}}]") == alone
    (tmp_path / "meta.json").write_text(json.dumps({"num_tokens": {"train": 1000, "val": 10}}))  # no histogram
    fallback = attention(
        f"data.mixture=[{{dir: {dirs[0]}, weight: 1}}, {{dir: {tmp_path}, weight: 1}}]", "data.mean_doc_tokens=5"
    )
    assert fallback == (round(per_key * mean_context({5: 1}, seq)), "data.mean_doc_tokens")
