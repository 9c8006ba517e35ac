"""Tiny models and a tiny tokenizer for the export tests. Everything is built locally: no hub downloads."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # set before transformers is imported anywhere

import pytest
import torch

from pretrain.config import load_config
from pretrain.model import build_model
from support import finished_run, tiny


@pytest.fixture
def make_model():
    """Builds a debug-preset model (LLaMA, vocab 512, width 64, 2 layers, 4 query heads sharing 2 key/value
    heads) with `model.` overrides and every parameter perturbed: norm weights of exactly 1 and zero biases
    would hide a swapped or dropped tensor in the name mapping. rope_theta and norm_eps differ from the
    Hugging Face defaults so that the exported config must carry them."""

    def make(overrides=(), seed=0):
        cfg = load_config(overrides=["model.preset=debug", "model.rope_theta=5000", "model.norm_eps=1e-6", *overrides])
        torch.manual_seed(seed)
        model = build_model(cfg.model).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        return model

    return make


@pytest.fixture
def batch():
    return torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(1))


@pytest.fixture
def tokenizer_dir(tmp_path):
    """A word-level tokenizer with the special tokens `pretrain tokenizer` reserves; tokenizer.json only."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(60)]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["<pad>", "<bos>", "<eos>", "<unk>"])
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def trained(prepared, tmp_path_factory):
    """A tiny run with checkpoints at steps 3 and 6, shared by the export and checkpoint-reader tests."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    return finished_run(run_dir, *tiny(prepared, run_dir, "train.max_steps=6", "run.checkpoint_every=3"))
