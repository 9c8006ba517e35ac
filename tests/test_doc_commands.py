"""Every command README.md and docs/*.md show runs as written on the demo's outputs.

The commands: each line of a fenced block that starts with `pretrain` (or `$ pretrain`, `python -m pretrain`,
`torchrun`, `bash scripts/`; a console block's output lines left out), and each inline `pretrain ...` of three
words or more that is not a synopsis (`[...]`, `|`, `...`). They run in a directory holding a shortened demo's
outputs (`demo/data`, `demo/run`, `demo/hf`, ...), in the order the files show them, the documents' placeholders
read as the demo's (PLACEHOLDERS). A command that trains is stopped after two steps (debug.stop_after_step: the
run as written, stopped as a preemption would) on sequences of 32 tokens unless it gives its own, and
evaluation, benchmarking and sweeping commands get their quick flags (CHEAP): the test is of the command, not
of its length. What cannot run on one CPU is in SKIPPED with the reason; a command neither run nor skipped
fails, naming it.
"""

import os
import re
import shlex
import shutil
from pathlib import Path

import pytest

from support import run_here

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"^(\$ )?(\.venv/bin/|python -m )?(pretrain|torchrun|bash scripts/)\b")

# The documents' placeholders, as the demo's outputs (whole words, in this order)
PLACEHOLDERS = [
    ("DATA", "demo/data"),
    ("DIR", "demo/data"),
    ("data/owt", "demo/data"),
    ("data/code", "demo/data"),
    ("RUN_DIR", "demo/run"),
    ("RUN", "demo/run"),
    ("runs/my-run", "demo/run"),
    ("runs/gpt2-small", "runs/gpt2"),
    ("runs/lr3e-4", "runs/gpt2"),
    ("runs/lr6e-4", "demo/run"),
    ("HF_DIR", "demo/hf"),
    ("CONFIG", "demo/run/config.yaml"),
    ("configs/my.yaml", "demo/run/config.yaml"),
    ("corpus/", "demo/corpus/"),
    ("tok/", "demo/tokenizer"),
    ("FILE", "profile.json"),
    ("cloze.jsonl", "demo/cloze.jsonl"),
    ("configs/", f"{ROOT / 'configs'}/"),  # the repository's recipes, as from its root
]
SYNOPSIS = "a synopsis of the README's command table (its commands run from the documents' examples)"
FRAGMENT = "a fragment of a sentence naming a flag, not a whole command"
SKIPPED = {
    "bash scripts/setup.sh && .venv/bin/pretrain demo": "the demo itself: this test's fixture runs it (shortened), "
    "tests/test_demo.py too",
    "bash scripts/setup.sh dev && .venv/bin/python -m pytest -n 2 && ATEN_CPU_CAPABILITY=default .venv/bin/python "
    "-m pytest -n 2 -m kernels": "the test suite itself: CI runs it",
    "pretrain plan --serve": "a web server until stopped: tests/plan/test_plan_serve.py and tests/pages",
    "pretrain plan model.preset=llama3-70b parallel.gpus=512 hardware.gpu=h100-sxm --serve": "a web server until "
    "stopped: tests/plan/test_plan_serve.py and tests/pages",
    "pretrain tokenizer train --input PATHS --vocab-size N --out DIR": SYNOPSIS,
    "pretrain export RUN_DIR --to hf OUT_DIR": SYNOPSIS,
    "pretrain generate RUN_DIR --prompt TEXT": SYNOPSIS,
    "pretrain train --resume RUN_DIR": SYNOPSIS,
    "pretrain prepare --tasks N": FRAGMENT,
    "pretrain prepare --tasks N --executor ray": FRAGMENT,
    "pretrain tokenizer train --format": FRAGMENT,
    "pretrain bench --out": FRAGMENT,
    "pretrain sweep --from-fit N": FRAGMENT,
    "pretrain plan QUERY --json": FRAGMENT,
    "pretrain export --to hf": FRAGMENT,
    "pretrain eval --tasks": FRAGMENT,
    "pretrain tokenizer stats": FRAGMENT,
    "pretrain tokenizer train": FRAGMENT,
    "pretrain prepare --out DIR --tasks N": FRAGMENT,
    "pretrain train --resume RUN train.max_steps=N": FRAGMENT,
    "pretrain train --resume RUN_DIR parallel.pipeline=1": FRAGMENT,
    "torchrun --nproc-per-node k": FRAGMENT,
    "pretrain prepare --fast-path": "docs/benchmarks.md's record of a measurement: the flag, in its sentence",
    "pretrain eval --tasks hellaswag --limit 100": "docs/benchmarks.md's record of a measurement: the flags, in "
    "its sentence",
    "pretrain eval demo/hf --tasks hellaswag --limit 1000": "docs/benchmarks.md's record: HellaSwag of a 124M "
    "model, minutes on a CPU (its own `pretrain eval` runs here on cloze.jsonl)",
    "pretrain tokenizer stats --tokenizer tokenizers/a tokenizers/b --input corpus/ [--max-docs 2000] [--json]": (
        SYNOPSIS
    ),
    "pretrain bench configs/my.yaml train.micro_batch_size=8 --dtypes bf16,fp8 --json": "fp8 matmuls need a GPU of "
    "compute capability 8.9 (the bench skips them on a CPU, saying so: tests/bench)",
    "pretrain sweep configs/my.yaml train.seq_len=1024,4096 train.micro_batch_size=1,8 train.grad_accum_steps=1,8 "
    "train.activation_checkpointing=none,full --budget-seconds 600": "sequences of 1K-4K tokens on a GPU: the "
    "demo's model stops at 256 (docs/sweep.md's first example runs here)",
    "pretrain prepare --input corpus/ --tokenizer tok/ --out data/web --tasks 512 --executor slurm "
    "--slurm-partition cpu --slurm-time 4:00:00 --sbatch account=myproj": "a Slurm cluster: "
    "tests/data/test_sharded_prepare.py runs the executor's launcher against sbatch's absence",
    "pretrain prepare --input /shared/corpus/ --tokenizer /shared/tok --out /shared/data/web --tasks 2000 "
    "--executor slurm --slurm-partition cpu --slurm-time 2:00:00 --slurm-mem-gb 2 --workers 500 "
    "--sbatch account=myproj": "a Slurm cluster's shared file system",
    "pretrain prepare --input corpus/ --tokenizer tok/ --out data/web --tasks 8": "8 tasks need 8 input files or "
    "more (a task reads whole files), the demo's corpus is one: tests/data/test_sharded_prepare.py",
    "pretrain train configs/gpt2-124m.yaml run.dir=runs/mix 'data.mixture=[{dir: data/web, weight: 0.7}, "
    "{dir: data/code, weight: 0.3, max_epochs: 4}]'": "two corpora prepared with one tokenizer, the demo has one: "
    "tests/train/test_mixture_train.py trains a mixture",
    'pretrain train CONFIG "model.rope_scaling={rope_type: llama3, factor: 8, low_freq_factor: 1, '
    'high_freq_factor: 4, original_max_position_embeddings: 8192}"': "Llama 3.1's scaling of 8K positions: the "
    "demo's model has 256 (tests/model/test_rope_scaling.py trains a scaled model)",
}
TORCHRUN = "several processes a GPU node or a cluster runs (8 per node, HOST:PORT rendezvous): tests/distributed runs "
TORCHRUN += "the same layouts on 2-4 CPU ranks under a real torchrun"
TRAINS = ["debug.stop_after_step={stop}", "run.progress=false", "run.eval_batches=1", "train.compile=false"]
SMALL = {  # a command's shape made small, where its own would take minutes of a CPU (the command still its own)
    "configs/gpt2-124m.yaml": [
        "model.num_layers=2",
        "model.vocab_size=2048",  # the demo tokenizer's: GPT-2's 50,257 rows would be most of the step
        "train.micro_batch_size=1",
        "train.grad_accum_steps=1",
    ],
    "demo/run/config.yaml": ["train.micro_batch_size=1"],
}
CHEAP = {  # the quick flags of the commands that measure
    "bench": ["--quick", "--seconds", "1", "--rounds", "1"],
    "sweep": ["--steps", "1", "--warmup-steps", "2", "--rounds", "1"],
    "eval": ["--limit", "4"],
}


def documented_commands() -> list[tuple[str, str, bool]]:
    """(document, command as written, whether the document shows it failing), in the documents' order."""
    found: list[tuple[str, str, bool]] = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S):
            lines = block.replace("\\\n", " ").splitlines()
            prompted = any(line.startswith("$ ") for line in lines)
            for i, line in enumerate(lines):
                if (prompted and not line.startswith("$ ")) or not COMMAND.match(line.strip()):
                    continue
                command = " ".join(re.sub(r"\s+#.*$", "", line.strip().removeprefix("$ ")).split())
                if re.match(r"pretrain [\w-]+( --[\w-]+)?:", command):  # an output line
                    continue
                fails = i + 1 < len(lines) and ": error: " in lines[i + 1]
                found.append((path.name, command, fails))
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for match in re.finditer(r"`([^`\n]+)`", prose):
            span = match.group(1)
            if re.match(r"(pretrain|torchrun) ", span) and len(span.split()) >= 3:
                if not any(mark in span.replace("\\|", "|") for mark in ("[", "|", "...")) or span in SKIPPED:
                    fails = "exit 2" in prose[match.end() : match.end() + 30]  # "`pretrain ...` is one line, exit 2"
                    found.append((path.name, span, fails))
    return found


def as_run(command: str) -> list[str]:
    """The command's arguments after `pretrain`, its placeholders read as the demo's outputs."""
    for word, value in PLACEHOLDERS:
        end = "" if word.endswith("/") else r"(?![\w.-])"  # a folder's prefix: the path goes on after it
        command = re.sub(rf"(?<![\w/.-]){re.escape(word)}{end}", value, command)
    command = command.replace(".venv/bin/pretrain", "pretrain").replace("python -m pretrain", "pretrain")
    return shlex.split(command)[1:]


def cheaply(args: list[str]) -> list[str]:
    """The quick flags of a measuring command; a training command stopped after two steps, small."""
    extra = list(CHEAP.get(args[0], []))
    if args[0] == "train":
        run = Path(args[args.index("--resume") + 1]) if "--resume" in args else None
        start = _last_step(run) if run else 0
        given = {a.split("=", 1)[0] for a in args if "=" in a}
        extra += [a.format(stop=start + 2) for a in TRAINS]
        extra += [] if "train.seq_len" in given or run else ["train.seq_len=32"]
        for config, small in SMALL.items():
            if any(a.endswith(config) for a in args) and not run:
                extra += [a for a in small if a.split("=", 1)[0] not in given]
    return args + extra


def _last_step(run: Path) -> int:
    steps = [int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*")]
    return max(steps, default=0)


@pytest.fixture(scope="module")
def demo_outputs(tmp_path_factory):
    """A directory holding a shortened demo's outputs (2 steps of a 2 x 128 model), the documents' cwd."""
    where = tmp_path_factory.mktemp("docs")
    small = ["model.hidden_size=128", "model.intermediate_size=344", "model.num_layers=2", "model.num_heads=4"]
    quick = ["train.max_steps=2", "run.eval_every=2", "run.checkpoint_every=2", "train.warmup=1", "run.progress=false"]
    before = os.getcwd()
    os.chdir(where)
    try:
        r = run_here("demo", "--out", "demo", *small, "model.num_kv_heads=2", *quick, "run.eval_batches=1")
        assert r.returncode in (0, 1) and "6/6 export" in r.stdout, r.stderr[-3000:]  # 1: loss above the unigram
        yield where
    finally:
        os.chdir(before)


def test_every_documented_command_runs_as_written_on_the_demos_outputs(demo_outputs):
    ran, failed = 0, []
    for document, command, fails in documented_commands():
        if command in SKIPPED or command.startswith("torchrun "):  # SKIPPED's reason, or TORCHRUN's
            continue
        args = cheaply(as_run(command))
        new_run = [a.split("=", 1)[1] for a in args if a.startswith("run.dir=")] if args[0] == "train" else []
        for run in new_run:  # the documents' examples stand alone: one's run.dir is not another's to continue
            shutil.rmtree(run, ignore_errors=True)
        r = run_here(*args)
        ran += 1
        if r.returncode != (2 if fails else 0):
            failed.append(f"{document}: `{command}` -> exit {r.returncode}: {(r.stderr or r.stdout).strip()[-600:]}")
    assert not failed, "\n".join(failed)
    assert ran >= 30
