"""Byte-level BPE tokenizers: train one with Hugging Face `tokenizers`, find one on disk, save it so
`transformers.AutoTokenizer.from_pretrained(dir)` loads it.

Byte-level with no normaliser and no prefix space, so decode(encode(text)) == text for any text. Special
tokens `<eos>`, `<bos>`, `<pad>` take ids 0, 1, 2. Offline: a tokenizer is a local directory holding
`tokenizer.json` or the path of a `tokenizer.json`, never a hub name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError, json_kind
from ..files import check_output_dir, display_path, write_atomic, write_error
from .readers import Corpus, ReadOptions
from .sources import find_files

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from ..config.job_sections import DataConfig

SPECIAL_TOKENS = ("<eos>", "<bos>", "<pad>")
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
# End-of-document tokens of common tokenizers, tried when tokenizer_config.json names none.
EOS_NAMES = ("<eos>", "</s>", "<|endoftext|>", "<|end_of_text|>")
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # every byte, plus the special tokens


@dataclass
class TokenizerFiles:
    """A tokenizer as found on disk: the bytes of tokenizer.json and of its Hugging Face config files."""

    source: Path
    files: dict[str, bytes]  # tokenizer.json and the config files (the source's, else generated ones)
    vocab_size: int  # highest id + 1: what the token files' dtype must hold
    eos_id: int
    eos_token: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.files["tokenizer.json"]).hexdigest()

    @property
    def json(self) -> dict:
        return json.loads(self.files["tokenizer.json"])

    def load(self) -> Tokenizer:
        """A `tokenizers.Tokenizer` that reads special-token strings inside documents as plain text, so the only
        `<eos>` ids in a token file are the ones `prepare` appends, and encodes every document whole: the
        truncation or padding a third-party tokenizer.json may set would cut documents or add <pad> ids."""
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_str(self.files["tokenizer.json"].decode("utf-8"))
        tokenizer.encode_special_tokens = True
        tokenizer.no_truncation()
        tokenizer.no_padding()
        return tokenizer

    def save(self, out_dir: Path) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, content in self.files.items():
            write_atomic(out_dir / name, content)


def find_tokenizer(path: str | Path) -> TokenizerFiles:
    """A local tokenizer directory or tokenizer.json path; UsageError when it is neither."""
    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise UsageError(
            f"tokenizer {path} not found: give a directory holding tokenizer.json or a tokenizer.json "
            "path (train one with `pretrain tokenizer train`)"
        )
    files = {"tokenizer.json": file.read_bytes()}
    files.update({name: (file.parent / name).read_bytes() for name in CONFIG_FILES if (file.parent / name).is_file()})
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_str(files["tokenizer.json"].decode("utf-8"))
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        raise UsageError(f"tokenizer {file} cannot be loaded ({e}); give a Hugging Face tokenizer.json") from None
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    eos = _eos_token(file.parent / "tokenizer_config.json", vocab)
    if eos is None:
        raise UsageError(
            f"tokenizer {file} has no end-of-document token (tried {', '.join(EOS_NAMES)}); "
            "name one as eos_token in tokenizer_config.json"
        )
    if not any(t.special and t.content == eos for t in tokenizer.get_added_tokens_decoder().values()):
        # Only a special token is kept out of the text (load()); any other would also encode the literal text
        # "<eos>" in a document to the end-of-document id, and count(<eos>) == num_docs would break.
        raise UsageError(
            f"tokenizer {file}: its end-of-document token {eos!r} is not a special token, so text "
            f'containing {eos!r} would encode to it; mark it "special": true in added_tokens'
        )
    generated = hf_config_files(eos, *(token if token in vocab else None for token in SPECIAL_TOKENS[1:]))
    for name, content in generated.items():
        files.setdefault(name, content)
    return TokenizerFiles(file, files, max(vocab.values()) + 1, vocab[eos], eos)


def check_fits_model(source: str | Path, vocab_size: int, model_vocab_size: int, fix: str) -> None:
    """A tokenizer whose ids reach past the model's vocabulary (its embedding rows) is not the model's: one line
    before any text is encoded, instead of an IndexError in the embedding. `vocab_size`: its highest id + 1."""
    if vocab_size > model_vocab_size:
        raise UsageError(
            f"{source}: its ids go up to {vocab_size - 1:,}, beyond the model's vocabulary of "
            f"{model_vocab_size:,}: not the tokenizer this model was trained with ({fix})"
        )


def _eos_token(config_path: Path, vocab: dict[str, int]) -> str | None:
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_bytes())
        except (ValueError, UnicodeDecodeError) as e:
            raise UsageError(f"{config_path} is not valid JSON ({e}); fix it or delete it") from None
        if not isinstance(config, dict):
            raise UsageError(f"{config_path} holds {json_kind(config)}, not an object; fix it or delete it")
        eos = config.get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str) and eos in vocab:
            return eos
    return next((name for name in EOS_NAMES if name in vocab), None)


def hf_config_files(eos: str, bos: str | None = None, pad: str | None = None) -> dict[str, bytes]:
    """tokenizer_config.json and special_tokens_map.json for `AutoTokenizer`: no BOS/EOS added on encode
    (documents are delimited by prepare, not by the tokenizer) and no space clean-up on decode (exact text)."""
    special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos), ("pad_token", pad)) if v}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    return {"tokenizer_config.json": _json_bytes(config), "special_tokens_map.json": _json_bytes(special)}


def train_tokenizer(
    inputs: list[str | Path],
    vocab_size: int,
    out_dir: str | Path,
    *,
    format: str = "auto",
    text_field: str = "text",
    split_blank_lines: bool = False,
    min_frequency: int = 2,
    progress: bool = False,
) -> dict:
    """Train a byte-level BPE on the documents of `inputs` and save it to `out_dir`; returns a summary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < MIN_VOCAB:
        raise UsageError(
            f"--vocab-size {vocab_size} is too small: a byte-level BPE needs at least {MIN_VOCAB} "
            "(256 bytes + <eos>, <bos>, <pad>)"
        )
    if min_frequency < 0:
        raise UsageError(f"--min-frequency {min_frequency} is negative; give a count >= 0 (default 2)")
    out_dir = check_output_dir(out_dir, "--out")
    corpus = Corpus(find_files(inputs), ReadOptions(format, text_field, split_blank_lines))
    stats = {"num_docs": 0, "text_bytes": 0, "skipped": {}}

    def documents():
        for record in corpus:
            if record.skip or record.text is None:  # a skipped record has no text
                stats["skipped"][record.skip] = stats["skipped"].get(record.skip, 0) + 1
                continue
            stats["num_docs"] += 1
            stats["text_bytes"] += len(record.text.encode("utf-8"))
            yield record.text

    tokenizer = Tokenizer(models.BPE())
    # No normaliser and no prefix space: byte-level BPE then reproduces any text byte for byte.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    start = time.perf_counter()
    tokenizer.train_from_iterator(documents(), trainer)
    if not stats["num_docs"]:
        raise UsageError(f"no documents in {corpus.describe()}; check --format, --text-field and --split-blank-lines")
    files = {"tokenizer.json": tokenizer.to_str().encode("utf-8"), **hf_config_files(*SPECIAL_TOKENS)}
    _write_all(out_dir, files)
    return {
        "path": display_path(out_dir),
        "vocab_size": tokenizer.get_vocab_size(),
        **stats,
        "seconds": time.perf_counter() - start,
    }


def _write_all(out_dir: Path, files: dict[str, bytes]) -> None:
    """All of `files` into out_dir, or none of them: each is written under a temporary name first and the
    renames come last, so a full disk never leaves a new tokenizer.json beside old config files."""
    created = not out_dir.exists()
    temporary = {name: out_dir / f".{name}.{os.getpid()}.tmp" for name in files}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, content in files.items():
            temporary[name].write_bytes(content)
        for name, tmp in temporary.items():
            os.replace(tmp, out_dir / name)
    except OSError as e:
        for tmp in temporary.values():
            tmp.unlink(missing_ok=True)
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        error = write_error(e, f"--out {display_path(out_dir)}", "the tokenizer")
        if error is None:
            raise
        raise error from None


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def data_tokenizer(data: DataConfig) -> Path | None:
    """The tokenizer copy inside the prepared data directory of a config's data section, if it is there."""
    data_dir = data.dir or (data.mixture[0]["dir"] if data.mixture else None)  # a mixture's sources share one
    path = Path(data_dir) / "tokenizer" if data_dir else None
    return path if path is not None and path.exists() else None
