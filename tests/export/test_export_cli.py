"""`pretrain export` and `pretrain generate` on a trained run, and continued pretraining from the export."""

import pytest

from support import run_cli, run_here, tiny

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_export_loads_in_transformers_with_the_same_logits(trained, tmp_path):
    from pretrain import load_model

    out = tmp_path / "hf"
    r = run_here("export", trained, "--to", "hf", out)
    assert r.returncode == 0, r.stderr
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ours = load_model(trained)
    tokens = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (hf(tokens).logits - ours(tokens)).abs().max().item()
    assert diff < 1e-4
    tok = transformers.AutoTokenizer.from_pretrained(out)
    generated = hf.generate(tok("The", return_tensors="pt").input_ids, max_new_tokens=5, do_sample=False)
    assert generated.shape[1] > 1
    assert run_here("export", trained, "--to", "hf", out).returncode == 2  # exists: refused, one line
    assert run_here("export", trained, "--to", "hf", out, "--overwrite").returncode == 0


def test_export_of_one_checkpoint(trained, tmp_path):
    r = run_here("export", trained / "checkpoints" / "step_00000003", "--to", "hf", tmp_path / "hf3")
    assert r.returncode == 0, r.stderr


def test_generate_prints_text(trained):
    r = run_here("generate", trained, "--prompt", "The for statement", "--max-new-tokens", "8", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("The for statement")


@pytest.mark.parametrize("case", ["max new tokens", "prompt bytes", "tokenizer"])
def test_generate_bad_input_is_one_line(trained, tmp_path, tokenizer_dir, case):
    import subprocess
    import sys

    from tokenizers import Tokenizer, models

    big = tmp_path / "big.json"  # a tokenizer of 1,000 ids: the debug model has 512
    tokenizer = Tokenizer(models.WordLevel({**{f"w{i}": i for i in range(999)}, "<eos>": 999}, unk_token="w0"))
    tokenizer.add_special_tokens(["<eos>"])  # an end-of-document token, as prepare requires
    tokenizer.save(str(big))
    extra = {
        "max new tokens": ["--max-new-tokens", "-5"],
        "prompt bytes": ["--prompt", b"caf\xe9"],
        "tokenizer": ["--tokenizer", big, "--prompt", "w998"],
    }[case]
    r = subprocess.run(
        [sys.executable, "-m", "pretrain", "generate", trained, "--max-new-tokens", "3", *extra], capture_output=True
    )
    lines = r.stderr.decode(errors="replace").strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, lines[-20:]
    assert {
        "max new tokens": "--max-new-tokens -5 must be >= 0",
        "prompt bytes": "--prompt is not valid UTF-8",
        "tokenizer": "ids go up to 999, beyond the model's vocabulary of 512",
    }[case] in lines[0]


def test_continued_pretraining_starts_from_the_export(prepared, trained, tmp_path):
    from pretrain import load_model

    out = tmp_path / "hf"
    assert run_here("export", trained, "--to", "hf", out).returncode == 0
    run_dir = tmp_path / "continued"
    r = run_here(
        "train", *tiny(prepared, run_dir, "train.max_steps=3", f"model.hf_config={out}", f"model.init_from={out}")
    )
    assert r.returncode == 0, r.stderr
    start = load_model(run_dir / "checkpoints" / "step_00000000")  # written before the first step
    source = load_model(trained)
    a, b = start.state_dict(), source.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # export -> import is exact
    # The run is self-contained: its saved config holds the resolved shape, so the source may go.
    import shutil

    shutil.rmtree(out)
    r = run_here("export", run_dir, "--to", "hf", tmp_path / "again")
    assert r.returncode == 0 and "no tokenizer" not in r.stdout, r.stderr


def test_a_relative_data_dir_is_saved_absolute(prepared, tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(
        "train", *tiny(prepared, run_dir, "train.max_steps=3", f"data.dir={prepared.name}"), cwd=prepared.parent
    )
    assert r.returncode == 0, r.stderr
    r = run_cli("export", run_dir, "--to", "hf", tmp_path / "hf", cwd=tmp_path)  # another directory
    assert r.returncode == 0 and "no tokenizer" not in r.stdout, r.stderr
    assert (tmp_path / "hf" / "tokenizer.json").is_file()


def test_an_unwritable_output_is_one_line(trained, tmp_path):
    (tmp_path / "afile").write_text("x")
    for out in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        r = run_here("export", trained, "--to", "hf", out)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.fixture(scope="module")
def own_run(prepared, tmp_path_factory):
    """A run trained on its own copy of the dataset: a failing overlap test may lose both, no other test."""
    import shutil

    root = tmp_path_factory.mktemp("overlap")
    shutil.copytree(prepared, root / "data")
    r = run_here(
        "train",
        *tiny(root / "data", root / "runs" / "run", "train.max_steps=3", "run.checkpoint_every=3", "train.warmup=1"),
    )
    assert r.returncode == 0, r.stderr
    return root


@pytest.mark.parametrize("target", ["run", "checkpoints", "a checkpoint", "inside the run", "parent", "data"])
def test_export_refuses_an_output_overlapping_what_it_reads(own_run, target):
    run_dir, data = own_run / "runs" / "run", own_run / "data"
    before = sorted(p for p in own_run.rglob("*") if p.is_file())
    source, out = {
        "run": (run_dir, run_dir),
        "checkpoints": (run_dir, run_dir / "checkpoints"),
        "a checkpoint": (run_dir / "checkpoints" / "step_00000003", run_dir),
        "inside the run": (run_dir, run_dir / "checkpoints" / "hf"),
        "parent": (run_dir, own_run / "runs"),
        "data": (run_dir, data),
    }[target]
    r = run_here("export", source, "--to", "hf", out, "--overwrite")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "overlaps the" in lines[0], r.stderr[-2000:]
    assert sorted(p for p in own_run.rglob("*") if p.is_file()) == before


def test_export_on_a_full_disk_is_one_line_and_keeps_the_old_export(trained, tmp_path):
    from fs_faults import small_fs

    with small_fs(tmp_path / "small", "256k") as disk:  # the debug model's weights alone are ~640 KB
        old = disk / "hf"
        old.mkdir()
        (old / "model.safetensors").write_bytes(b"an earlier export")
        r = run_cli("export", trained, "--to", "hf", old, "--overwrite")
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "No space left on device" in lines[0], r.stderr[-2000:]
        assert [p.name for p in disk.iterdir()] == ["hf"]  # no temporary directory left
        assert (old / "model.safetensors").read_bytes() == b"an earlier export"
