"""`pretrain plan` with a data.mixture: tokens available per source from each meta.json (or a sharded
dataset's shards), the tokens and epochs the run draws from each (max_epochs hands the rest to the others),
the advice line past ~4 epochs, and the `mixture` key of --json."""

import json

import pytest

from support import run_cli


def write_meta(path, train, val=100, **extra):
    path.mkdir(parents=True)
    (path / "meta.json").write_text(
        json.dumps({"num_tokens": {"train": train, "val": val}, "dtype": "uint16", **extra})
    )
    return path


@pytest.fixture
def sources(tmp_path):
    """A web source of 1M tokens and a sharded code source of 2 x 50K tokens (shards summed)."""
    web = write_meta(tmp_path / "web", 1_000_000)
    code = tmp_path / "code"
    for shard in ("shard_00000", "shard_00001"):
        write_meta(code / shard, 50_000)
    (code / "meta.json").write_text(json.dumps({"shards": ["shard_00000", "shard_00001"]}))
    return web, code


def plan(*overrides):
    r = run_cli("plan", "model.preset=debug", "train.tokens=2e6", *overrides, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_epochs_per_source_for_the_planned_tokens(sources):
    web, code = sources
    p = plan(f"data.mixture=[{{dir: {web}, weight: 0.7}}, {{dir: {code}, weight: 0.3}}]")
    web_row, code_row = p["mixture"]["sources"]
    assert (web_row["name"], code_row["name"]) == ("web", "code")
    assert web_row["tokens_available"] == 1_000_000 and code_row["tokens_available"] == 100_000
    assert web_row["storage_bytes"] == 2 * 1_000_100 and code_row["storage_bytes"] == 2 * 100_200
    assert web_row["tokens_planned"] == 1_400_000 and web_row["epochs"] == pytest.approx(1.4)
    assert code_row["tokens_planned"] == 600_000 and code_row["epochs"] == pytest.approx(6.0)
    (line,) = [a for a in p["advice"] if a.startswith("data.mixture")]
    assert "'code' is read 6 times" in line and "Muennighoff et al. 2023" in line


def test_a_capped_source_hands_its_share_to_the_others(sources):
    web, code = sources
    p = plan(f"data.mixture=[{{dir: {web}, weight: 0.7}}, {{dir: {code}, weight: 0.3, max_epochs: 2}}]")
    web_row, code_row = p["mixture"]["sources"]
    assert code_row["tokens_planned"] == 200_000 and code_row["capped"]
    assert web_row["tokens_planned"] == 1_800_000 and web_row["epochs"] == pytest.approx(1.8)
    assert p["mixture"]["tokens_short"] == 0
    assert any("'code' reaches its max_epochs 2" in a for a in p["advice"])
    spent = plan(
        f"data.mixture=[{{dir: {web}, weight: 0.7, max_epochs: 1}}, {{dir: {code}, weight: 0.3, max_epochs: 2}}]"
    )
    assert spent["mixture"]["tokens_short"] == 2_000_000 - 1_200_000
    assert any("every source reaches its max_epochs 800,000 tokens" in a for a in spent["advice"])


def test_the_table_shows_each_source_and_its_epochs(sources, tmp_path):
    web, code = sources
    r = run_cli(
        "plan",
        "model.preset=debug",
        "train.tokens=2e6",
        f"data.mixture=[{{dir: {web}, weight: 0.7}}, {{dir: {code}, weight: 0.3}}, "
        f"{{dir: {tmp_path / 'later'}, weight: 0.1, name: books}}]",
    )
    assert r.returncode == 0, r.stderr
    rows = {line.split()[1]: line for line in r.stdout.splitlines() if line.strip().startswith("Source ")}
    assert set(rows) == {"web", "code", "books"}
    assert "1,000,000" in rows["web"] and "epochs" in rows["web"]
    assert "not prepared yet" in rows["books"]


def test_a_bad_mixture_is_one_line_and_exit_2(sources):
    web, _ = sources
    r = run_cli("plan", "model.preset=debug", f"data.dir={web}", f"data.mixture=[{{dir: {web}, weight: 1}}]")
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "exclusive with data.dir" in line
