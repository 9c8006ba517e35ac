"""What `pretrain eval` scores: our model from a run directory or checkpoint (with the run's tokenizer), or a
Hugging Face model directory (config.json, weights, tokenizer.json) through `transformers`.

Both give `token_logprobs(x, rows, cols, targets)`: the log-probability of targets[k] at position (rows[k],
cols[k]) of the batch x. Only those positions go through the output layer and the softmax: on HellaSwag the
continuations are about a quarter of the tokens, and a 50K-token vocabulary's output layer is a third of a
124M model's forward.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from ..errors import UsageError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from ..model.transformer import Transformer


def _gather_logprobs(logits, targets) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[:, None].to(logits.device))[:, 0]


def _padded(x, rows: int, cols: int) -> torch.Tensor:
    """x (batch, width) right-padded with token 0 to (rows, cols): a causal model's logits at x's positions are
    the same (up to the kernels' rounding), and the extra rows are never scored."""
    return torch.nn.functional.pad(x, (0, cols - x.shape[1], 0, rows - x.shape[0]))


class OurModel:
    """Our Transformer. `whole`: run its forward and keep the scored positions' logits, for a model whose
    parts only its forward may call (FSDP's root gathers the embedding and the output layer in its forward;
    under tensor parallelism the output layer's logits come out whole on every tensor rank, which then all
    score the same positions). `width`: each batch padded to a multiple of it (sequence parallelism splits
    the sequence evenly over the tensor ranks)."""

    def __init__(self, model: Transformer, max_len: int, whole: bool = False, width: int = 1):
        self.model, self.max_len, self.whole, self.width = model, max_len, whole, width
        self.device = next(model.parameters()).device

    def token_logprobs(
        self, x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        x = _padded(x, x.shape[0], -(-x.shape[1] // self.width) * self.width)
        if self.whole:
            return _gather_logprobs(self.model(x)[rows, cols], targets)
        hidden = self.model.hidden_states(x)[rows, cols]
        return _gather_logprobs(self.model.lm_head(hidden)[..., : self.model.config.vocab_size], targets)


class PipelinedModel:
    """Our Transformer split into pipeline stages (distributed/pipeline.py: Pipelined), every rank of a pipeline
    running the same batches: each goes through the schedule's forward-only path (the validation loss's),
    padded to the shape its stages were sized for, (`rows`, `max_len`) = train.micro_batch_size x
    train.seq_len. The log-probabilities are the last stage's; the other stages return zeros, which their
    caller does not count."""

    def __init__(self, engine, rows: int, max_len: int):
        self.engine, self.rows, self.max_len = engine, rows, max_len
        self.device = engine.rt.device

    def token_logprobs(self, x, rows, cols, targets) -> torch.Tensor:
        h = self.engine.last_hidden(_padded(x, self.rows, self.max_len))
        if h is None:
            return torch.zeros(len(targets), device=self.device)
        from torch.distributed.tensor import DTensor

        model = self.engine.model
        if isinstance(model.lm_head.weight, DTensor):  # the whole sequence's logits, gathered (tensor_parallel.py)
            logits = model.lm_head(h)[rows, cols]
        else:
            logits = model.lm_head(h[rows, cols])
        return _gather_logprobs(logits[..., : model.config.vocab_size], targets)


class HFModel:
    """A transformers causal LM: its base model's last hidden state, then the output layer at the scored
    positions only (the full forward where the logits are scaled after the output layer)."""

    def __init__(self, model):
        self.model = model
        self.device = model.device
        config = model.config
        self.max_len = next(
            (
                getattr(config, a)
                for a in ("n_positions", "max_position_embeddings", "n_ctx")
                if isinstance(getattr(config, a, None), int)
            ),
            2048,
        )  # lm-eval's order and default
        self.whole = any(getattr(config, a, None) for a in ("final_logit_softcapping", "logit_scale"))

    def token_logprobs(
        self, x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        if self.whole:
            return _gather_logprobs(self.model(input_ids=x).logits[rows, cols], targets)
        hidden = self.model.base_model(input_ids=x).last_hidden_state[rows, cols]
        return _gather_logprobs(self.model.get_output_embeddings()(hidden), targets)


def is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and not (path / "checkpoints").is_dir()


def load_target(target: str, device: str) -> tuple[OurModel | HFModel, Tokenizer]:
    """(model, tokenizer) for TARGET: a run directory, one of its checkpoints, or a Hugging Face directory.
    The tokenizer is a `tokenizers.Tokenizer`."""
    from tokenizers import Tokenizer

    from ..data.tokenizer import check_fits_model, data_tokenizer, find_tokenizer

    path = Path(target)
    if is_hf_dir(path):
        file = path / "tokenizer.json"
        if not file.is_file():
            raise UsageError(f"{path} has no tokenizer.json; a Hugging Face model directory needs its tokenizer")
        from ..progress import quiet_transformers

        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises a bare Exception for a malformed file
            raise UsageError(f"{file} cannot be loaded ({e}); give the model's own tokenizer.json") from None
        try:
            with quiet_transformers() as transformers:
                config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)  # before the weights
                ids = max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1
                check_fits_model(file, ids, config.vocab_size, f"put the model's own tokenizer.json in {path}")
                model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype="auto", local_files_only=True)
        except (OSError, ValueError) as e:
            raise UsageError(f"{path}: not a Hugging Face causal language model ({str(e).splitlines()[0]})") from None
        return HFModel(cast(torch.nn.Module, model).to(device).eval()), tokenizer
    from ..checkpoint.contents import load_model

    model = cast("Transformer", load_model(path, device=device))  # load_model says nn.Module
    tokenizer = data_tokenizer(model.training_config.data)
    if tokenizer is None:
        raise UsageError(
            f"no tokenizer found for {target} (the run's data directory is gone); export it with "
            "its tokenizer, or restore the data directory"
        )
    files = find_tokenizer(tokenizer)
    check_fits_model(files.source, files.vocab_size, model.config.vocab_size, "restore the run's data directory")
    return OurModel(model, model.config.max_seq_len), files.load()
