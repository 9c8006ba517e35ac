"""The whole workflow on a laptop CPU, on text every Python installation has (its own documentation):
plan -> tokenizer -> prepare -> train (a few minutes, scoring a downstream task in the loop) -> report ->
export to Hugging Face -> generate.

  pretrain demo [--out DIR] [section.key=value ...]     overrides apply to the demo's config
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import ResolvedConfig

HELP = "run plan, tokenizer, prepare, train, report and export end to end on a bundled sample corpus"

VOCAB_SIZE = 2048
# The demo's own mark in --out: the directories it created (to replace on its next run). Any other existing
# directory is refused, never replaced: `run.dir=` or `data.dir=` pointing at a user's run or dataset, or an
# --out holding someone else's files.
MARKER = ".pretrain-demo.json"
CLOZE = "cloze.jsonl"  # the demo's in-loop task (run.eval_tasks), written into --out by cloze_task
CLOZE_EXAMPLES = 100  # ~1 s to score with the demo's model, and a standard error of ~0.045 on its accuracy


def add_arguments(p):
    p.add_argument(
        "items", nargs="*", metavar="KEY=VALUE", help="overrides of the demo config (e.g. train.max_steps=50)"
    )
    p.add_argument("--out", default="demo", help="directory for everything the demo writes (default: ./demo)")


def demo_config(out: Path, overrides: list[str]) -> ResolvedConfig:
    from importlib.resources import files

    from .config import load_config
    from .config_args import split_items

    path, extra = split_items(overrides)
    base = path or str(files("pretrain") / "configs" / "demo.yaml")
    return load_config(
        base, [f"data.dir={out / 'data'}", f"run.dir={out / 'run'}", f"run.eval_tasks=[{out / CLOZE}]", *extra]
    )


def claim_directories(out: Path, dirs: dict[str, str]) -> None:
    """Refuse (UsageError) any of --out and `dirs` (key -> path) that holds something the demo did not create;
    then record them all in out/MARKER as the demo's own, before anything is written."""
    from .errors import UsageError
    from .files import check_output_dir, read_owned, record_owned

    marker = out / MARKER
    owned = read_owned(marker, f"delete it if {out} holds only an earlier demo's output, or give another --out")
    if out.is_dir() and any(out.iterdir()) and not marker.is_file():
        raise UsageError(f"--out {out} already holds files the demo did not write; give a new or empty directory")
    for key, path in dirs.items():
        check_output_dir(path, key)
        folder = Path(path)
        if folder.is_dir() and any(folder.iterdir()) and str(folder.resolve()) not in owned:
            raise UsageError(
                f"{key} {folder} already exists and the demo did not create it: the demo would replace "
                f"it; leave {key} to --out or give a new directory"
            )
    out.mkdir(parents=True, exist_ok=True)
    record_owned(marker, owned | {str(Path(p).resolve()) for p in (out, *dirs.values())})


def unigram_entropy(data_dir: Path) -> float:
    """Entropy of the token frequencies of train.bin, in nats per token: what a model that ignores context
    achieves at best. A trained model must go well below it."""
    import numpy as np

    from .data import PreparedData

    tokens = PreparedData(data_dir).tokens("train")
    counts = np.bincount(np.asarray(tokens), minlength=1).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def cloze_task(data_dir: Path, path: Path, examples: int = CLOZE_EXAMPLES, seed: int = 0) -> int:
    """A multiple-choice task made from the held-out split of the prepared corpus (val.bin: text the model never
    trains on), in `pretrain eval`'s local task format: each example is a sentence without its last three words;
    its choices are its own ending and the endings of three other sentences (chance 0.25). All four are endings
    of real sentences, so a model beats chance only by reading the context. Returns the number of examples."""
    import json
    import random
    import re

    import numpy as np
    from tokenizers import Tokenizer

    from .data import PreparedData
    from .files import write_atomic

    data = PreparedData(data_dir)
    tokenizer = Tokenizer.from_file(str(Path(data_dir) / "tokenizer" / "tokenizer.json"))
    ids = np.asarray(data.tokens("val"))
    documents = np.split(ids, np.flatnonzero(ids == data.meta["eos_id"]) + 1)
    sentences = []
    for doc in documents:
        text = " ".join(tokenizer.decode(doc.tolist()).split())
        sentences += [s.split() for s in re.split(r"(?<=\.)\s+", text) if s.isascii() and s.endswith(".")]
    sentences = list(dict.fromkeys(tuple(s) for s in sentences if 8 <= len(s) <= 30))
    rng = random.Random(seed)
    rng.shuffle(sentences)
    questions, pool = sentences[:examples], list(dict.fromkeys(" " + " ".join(s[-3:]) for s in sentences))
    lines = []
    for words in questions:
        ending = " " + " ".join(words[-3:])
        choices = [ending] + rng.sample([e for e in pool if e != ending], 3)
        rng.shuffle(choices)
        lines.append(json.dumps({"context": " ".join(words[:-3]), "choices": choices, "gold": choices.index(ending)}))
    write_atomic(path, "".join(line + "\n" for line in lines))
    return len(lines)


def run(args) -> int:
    import time

    from .config import replaced
    from .data import prepare, train_tokenizer, write_sample_corpus
    from .data.prepare_command import summary
    from .files import check_output_dir
    from .plan import make_plan
    from .plan.length import storage_bytes
    from .plan.table import render
    from .train import train

    out = check_output_dir(args.out, "--out")
    config = demo_config(out, args.items)
    data_dir = config.data.dir
    assert data_dir is not None  # demo_config set it: data.dir={out}/data
    claim_directories(out, {"data.dir": data_dir, "run.dir": config.run.dir})
    corpus = write_sample_corpus(out / "corpus", docstrings=True)
    # The plan shown is the run's: at this CPU's own measured profile (its matmul peak, the cost of one eager op,
    # its memory bandwidth), kept per machine; the run reads the same profile and says where it came from.
    planned = config
    if not (config.hardware.peak_tflops or config.hardware.profile):  # a CPU has no data-sheet peak
        import torch

        from .train.plan_check import measured_hardware

        planned = replaced(config, measured_hardware(config, torch.device("cpu"))[0])

    print(f"== 1/6 plan ({config.run.dir}), with this CPU's measured profile")
    print(render(planned, make_plan(planned)))

    print(f"\n== 2/6 tokenizer: byte-level BPE, {VOCAB_SIZE} tokens, trained on {corpus}")
    tokenizer_dir = out / "tokenizer"
    train_tokenizer([str(corpus)], VOCAB_SIZE, tokenizer_dir)

    print(f"\n== 3/6 prepare: {corpus} -> {data_dir}")
    start = time.perf_counter()
    meta = prepare([str(corpus)], str(tokenizer_dir), data_dir, val_fraction=0.1, workers=1)
    tokens = sum(meta["num_tokens"].values())
    print(summary(meta, data_dir, time.perf_counter() - start, storage_bytes(tokens, meta["vocab_size"])))
    if out / CLOZE in map(Path, config.run.eval_tasks):
        n = cloze_task(Path(data_dir), out / CLOZE)
        print(
            f"  in-loop task (run.eval_tasks): {out / CLOZE}, {n} sentences of the validation split to end, "
            "4 choices each"
        )

    if Path(config.run.dir).exists():  # the demo's own scratch run from an earlier `pretrain demo`
        import shutil

        print(f"\n(replacing the previous demo run in {config.run.dir})")
        shutil.rmtree(config.run.dir)
    print(
        f"\n== 4/6 train: {config.model.num_layers} layers x {config.model.hidden_size}, "
        f"{config.train.max_steps} steps on {meta['num_tokens']['train']:,} tokens"
    )
    result = train(config)

    print("\n== 5/6 report")
    from .report import make_report

    report = make_report([config.run.dir])
    for f in report["files"]:
        print(f"  {f}")

    print("\n== 6/6 export to Hugging Face and generate")
    _export_and_generate(config, out)
    return _final_lines(config, result["val_loss"])


def _export_and_generate(config, out: Path) -> None:
    """The run exported for transformers, which writes the same greedy text as our own model."""
    from .checkpoint.contents import load_model
    from .export.generate import generate_text
    from .export.hf import export_hf

    model = load_model(config.run.dir)
    hf_dir = export_hf(model, out / "hf", tokenizer_dir=Path(config.data.dir) / "tokenizer", overwrite=True)
    sample = _hf_sample(hf_dir, "The for statement")
    print(f"  {hf_dir} loads with transformers.AutoModelForCausalLM; it writes:\n  {sample!r}")
    ours = generate_text(
        model, Path(config.data.dir) / "tokenizer", "The for statement", max_new_tokens=40, temperature=0.0
    )
    print(f"  and pretrain.load_model gives the same greedy text: {ours == sample}")


def _final_lines(config, val: float) -> int:
    """The validation loss against the corpus's unigram entropy, and the in-loop task against chance; the exit
    code: 0 when the model beats counting tokens."""
    from .report.runs import read_run

    entropy = unigram_entropy(Path(config.data.dir))
    print(
        f"\nfinal validation loss {val:.3f} nats/token (perplexity {math.exp(val):.1f}) against the corpus's "
        f"unigram entropy {entropy:.3f} nats/token: {entropy - val:.3f} nats better than counting tokens."
    )
    tasks = read_run(Path(config.run.dir)).tasks
    name = Path(CLOZE).stem
    if tasks and f"eval/{name}/acc_norm" in tasks[-1]:  # unless run.eval_tasks was overridden
        last = tasks[-1]
        print(
            f"{name} (in the loop, report panel {name}): acc_norm {last[f'eval/{name}/acc_norm']:.2f} +- "
            f"{last[f'eval/{name}/acc_norm_stderr']:.2f} against chance {last[f'eval/{name}/chance']:.2f}."
        )
    return 0 if val < entropy else 1


def _hf_sample(hf_dir: Path, prompt: str) -> str:
    import torch

    from .progress import quiet_transformers

    with quiet_transformers() as transformers:
        tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
        model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    ids = tok(prompt, return_tensors="pt").input_ids
    # transformers declares generate's `self` as a Protocol that its own AutoModel return type does not meet
    out = model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=tok.pad_token_id)  # pyright: ignore[reportAttributeAccessIssue]
    return tok.decode(out[0], skip_special_tokens=True)
