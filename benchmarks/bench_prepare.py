"""`pretrain prepare` against raw Hugging Face `tokenizers`, on the same text and the same cores.

  python benchmarks/bench_prepare.py                 # throughput: raw encode_batch vs prepare, 30 MB
  python benchmarks/bench_prepare.py --rss --gb 1.0  # peak memory of prepare on a >= 1 GB corpus
  python benchmarks/bench_prepare.py --sharded       # prepare --tasks 1 / --tasks 2 vs today's process tree

The corpus is the two real corpora of ../shared/data (tinyshakespeare speeches + zh_classics records),
repeated with a counter prefixed to every document so no two documents are equal, written as JSONL to a
temporary directory. The tokenizer is a byte-level BPE trained on the real corpora (--vocab-size).
Raw throughput: the documents already in memory, `encode_batch` over bounded chunks (~1 M characters, as
prepare uses; one 50 MB call held 4.6 GiB) with all of `tokenizers`' threads. prepare throughput: end to
end, reading and writing included, `--workers` processes.
--sharded: the same corpus cut in 8 JSONL files, each command run as a user runs it (a subprocess, the
interpreter's start included): today's `prepare --workers W` (one process tree) against `prepare --tasks 1` and
`--tasks W` (datatrove's local executor, W tasks at once), with the peak RSS of each process, sampled, the CPU
seconds of each command's process tree (the work done, whatever else runs) and each round's time ratio to
`--workers W` (median and spread: on a shared machine the spread is the contention).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"  # --data overrides
CHUNK_CHARS = 1 << 20


def real_documents(data: Path = SHARED) -> list[str]:
    from pretrain.data.readers import Corpus, ReadOptions
    from pretrain.data.sources import find_files

    files = find_files([data / "tinyshakespeare.txt", data / "zh_classics.jsonl"])
    return [r.text for r in Corpus(files, ReadOptions(split_blank_lines=True)) if r.text]


def write_corpus(folder: Path, megabytes: float, docs: list[str]) -> tuple[Path, int]:
    """JSONL of the real documents repeated, each prefixed with its copy number: (path, text bytes)."""
    path, text_bytes, copy = folder / "corpus.jsonl", 0, 0
    with open(path, "w", encoding="utf-8") as f:
        while text_bytes < megabytes * 1e6:
            for doc in docs:
                text = f"{copy} {doc}"
                f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
                text_bytes += len(text.encode("utf-8"))
            copy += 1
    return path, text_bytes


def raw_encode(tokenizer_dir: Path, corpus: Path, fast: bool) -> dict:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
    encode = tokenizer.encode_batch_fast if fast else tokenizer.encode_batch
    chunks, chunk, size = [], [], 0
    for text in texts:
        chunk.append(text)
        size += len(text)
        if size >= CHUNK_CHARS:
            chunks.append(chunk)
            chunk, size = [], 0
    chunks.append(chunk)
    text_bytes = sum(len(t.encode("utf-8")) for t in texts)
    start = time.perf_counter()
    tokens = sum(len(e.ids) for chunk in chunks for e in encode(chunk, add_special_tokens=False))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": tokens, "tokens_s": tokens / seconds, "mb_s": text_bytes / 1e6 / seconds}


def run_prepare(tokenizer_dir: Path, corpus: Path, out: Path, workers: int, fast: bool) -> dict:
    from pretrain.data import prepare

    start = time.perf_counter()
    meta = prepare([corpus], tokenizer_dir, out, workers=workers, fast_path=fast)
    seconds = time.perf_counter() - start
    tokens = sum(meta["num_tokens"].values()) - sum(meta["num_docs"].values())  # <eos> excluded, as raw
    return {
        "seconds": seconds,
        "tokens": tokens,
        "tokens_s": tokens / seconds,
        "mb_s": meta["text_bytes"] / 1e6 / seconds,
        "encoder": meta["encoder"]["name"],
    }


def throughput(args, folder: Path, tokenizer_dir: Path) -> None:
    corpus, text_bytes = write_corpus(folder, args.mb, real_documents(args.data))
    print(
        f"corpus {text_bytes / 1e6:.1f} MB of text, {os.cpu_count()} cores, workers {args.workers}, "
        f"vocab {args.vocab_size}, best of {args.repeat} interleaved runs"
    )
    runs = {
        "raw encode_batch": lambda: raw_encode(tokenizer_dir, corpus, fast=False),
        "raw encode_batch_fast": lambda: raw_encode(tokenizer_dir, corpus, fast=True),
        "prepare": lambda: run_prepare(tokenizer_dir, corpus, folder / "a", args.workers, False),
        "prepare --fast-path": lambda: run_prepare(tokenizer_dir, corpus, folder / "b", args.workers, True),
    }
    best: dict[str, dict] = {}
    for _ in range(args.repeat):  # interleaved, so a burst of load elsewhere hits every row alike
        for name, run in runs.items():
            row = run()
            if name not in best or row["seconds"] < best[name]["seconds"]:
                best[name] = row
    assert len({row["tokens"] for row in best.values()}) == 1, "every path must produce the same tokens"
    base = best["raw encode_batch"]["tokens_s"]
    for name, row in best.items():
        print(
            f"  {name:27s} {row['seconds']:7.2f} s {row['tokens_s'] / 1e6:7.2f} M tokens/s "
            f"{row['mb_s']:7.2f} MB/s  {row['tokens_s'] / base:5.2f}x raw encode_batch"
        )


def peak_rss(args, folder: Path, tokenizer_dir: Path) -> None:
    import psutil

    corpus, text_bytes = write_corpus(folder, args.gb * 1000, real_documents(args.data))
    print(
        f"corpus {text_bytes / 1e9:.2f} GB of text ({corpus.stat().st_size / 1e9:.2f} GB JSONL), workers {args.workers}"
    )
    command = [
        sys.executable,
        "-m",
        "pretrain",
        "prepare",
        "--input",
        str(corpus),
        "--tokenizer",
        str(tokenizer_dir),
        "--out",
        str(folder / "out"),
        "--workers",
        str(args.workers),
    ]
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    peak = {"tree": 0, "main": 0}

    def sample():  # the sum over the process tree: main + workers, at the same instant
        parent = psutil.Process(process.pid)
        while process.poll() is None:
            try:
                rss = [p.memory_info().rss for p in [parent, *parent.children(recursive=True)]]
            except psutil.NoSuchProcess:
                continue
            peak["tree"], peak["main"] = max(peak["tree"], sum(rss)), max(peak["main"], rss[0])
            time.sleep(0.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    output = process.communicate()[0]
    sampler.join()
    seconds = time.perf_counter() - start
    max_child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
    print(output.rstrip())
    print(
        f"peak RSS: process tree {peak['tree'] / 2**30:.3f} GiB (sampled every 0.2 s), main process "
        f"{peak['main'] / 2**30:.3f} GiB, largest single process {max_child / 2**30:.3f} GiB (getrusage); "
        f"{seconds:.0f} s, {text_bytes / 1e6 / seconds:.1f} MB/s"
    )


def sharded(args, folder: Path, tokenizer_dir: Path) -> None:
    corpus, text_bytes = write_corpus(folder, args.mb, real_documents(args.data))
    lines = corpus.read_text(encoding="utf-8").splitlines(keepends=True)
    parts = folder / "parts"
    parts.mkdir()
    for i in range(8):  # contiguous eighths: --tasks splits by file
        (parts / f"part{i}.jsonl").write_text("".join(lines[i * len(lines) // 8 : (i + 1) * len(lines) // 8]))
    w = args.workers
    print(
        f"corpus {text_bytes / 1e6:.1f} MB of text in 8 files, {os.cpu_count()} cores, vocab {args.vocab_size}, "
        f"best of {args.repeat} interleaved runs, load average {os.getloadavg()[0]:.1f} at the start"
    )
    runs = {
        f"prepare --workers {w}": ["--workers", str(w)],
        "prepare --tasks 1": ["--tasks", "1"],
        f"prepare --tasks {w}": ["--tasks", str(w), "--workers", str(w)],
    }
    best: dict[str, dict] = {}
    ratios: dict[str, list[float]] = {name: [] for name in runs}  # per round, vs that round's --workers W
    for _ in range(args.repeat):
        seconds = {}
        for name, extra in runs.items():
            command = [
                sys.executable,
                "-m",
                "pretrain",
                "prepare",
                "--input",
                str(parts),
                "--tokenizer",
                str(tokenizer_dir),
                "--out",
                str(folder / "out"),
                *extra,
            ]
            row = _run_sampled(command)
            meta = json.loads((folder / "out" / "meta.json").read_text())
            row["tokens"] = sum(meta["num_tokens"].values()) - sum(meta["num_docs"].values())
            seconds[name] = row["seconds"]
            if name not in best or row["seconds"] < best[name]["seconds"]:
                best[name] = row
        for name in runs:
            ratios[name].append(seconds[f"prepare --workers {w}"] / seconds[name])
    assert len({row["tokens"] for row in best.values()}) == 1, "every path must produce the same tokens"
    base = best[f"prepare --workers {w}"]["seconds"]
    for name, row in best.items():
        print(
            f"  {name:22s} {row['seconds']:7.2f} s {row['tokens'] / row['seconds'] / 1e6:6.2f} M tokens/s "
            f"{text_bytes / 1e6 / row['seconds']:6.2f} MB/s  {base / row['seconds']:5.2f}x  CPU {row['cpu']:6.2f} s  "
            f"peak RSS per process {row['process'] / 2**30:.3f} GiB, tree {row['tree'] / 2**30:.3f} GiB"
        )
    # The CPU seconds (user + system, the whole process tree) are the work done whatever the load; on a shared
    # machine the per-round ratios' spread shows how much of a difference is contention.
    for name, r in ratios.items():
        print(
            f"  per round vs --workers {w}: {name:22s} median {statistics.median(r):.2f}x "
            f"(min {min(r):.2f}x, max {max(r):.2f}x)"
        )
    print(f"  load average {os.getloadavg()[0]:.1f} at the end")


def _run_sampled(command: list[str]) -> dict:
    """Wall time and CPU seconds of `command`, and the peak RSS (every 0.1 s) of its largest process and of its
    whole tree."""
    import psutil

    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)  # CPU of waited-for descendants: pool workers too
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = {"tree": 0, "process": 0}
    parent = psutil.Process(process.pid)
    while process.poll() is None:
        try:
            rss = [p.memory_info().rss for p in [parent, *parent.children(recursive=True)]]
        except psutil.NoSuchProcess:
            continue
        peak["tree"], peak["process"] = max(peak["tree"], sum(rss)), max(peak["process"], *rss)
        time.sleep(0.1)
    if process.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode})")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"seconds": time.perf_counter() - start, "cpu": cpu, **peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=30, help="throughput corpus size, MB of text (default 30)")
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs of each kind; the best counts")
    parser.add_argument("--rss", action="store_true", help="measure peak memory instead of throughput")
    parser.add_argument("--sharded", action="store_true", help="prepare --tasks 1 and --tasks W vs --workers W")
    parser.add_argument("--data", type=Path, default=SHARED, help=f"the shared corpora (default {SHARED})")
    parser.add_argument("--gb", type=float, default=1.0, help="--rss corpus size, GB of text (default 1.0)")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--vocab-size", type=int, default=8192)
    args = parser.parse_args()
    if not args.data.exists():
        sys.exit(f"{args.data} not found: the benchmark uses the shared corpora (--data)")
    from pretrain.data import train_tokenizer

    with tempfile.TemporaryDirectory(prefix="bench_prepare_") as tmp:
        folder = Path(tmp)
        tokenizer_dir = folder / "tokenizer"
        train_tokenizer([args.data], args.vocab_size, tokenizer_dir, split_blank_lines=True)
        (sharded if args.sharded else peak_rss if args.rss else throughput)(args, folder, tokenizer_dir)


if __name__ == "__main__":
    main()
