"""`pretrain report` on a mixture run: achieved vs target share and epochs per source, as a figure, a table
and terminal lines; a run without a mixture gets none of it."""

import json
import re

import pytest

from support import run_here, tiny

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def mixture_run(two_corpora, tmp_path_factory):
    """200 steps of the tiny run's 8 windows on shakespeare / zh at 70 / 30."""
    run_dir = tmp_path_factory.mktemp("mixture") / "run"
    args = [a for a in tiny("unused", run_dir) if not a.startswith("data.dir=")]
    r = run_here(
        "train",
        *args,
        f"data.mixture=[{{dir: {two_corpora['shakespeare']}, weight: 0.7}}, {{dir: {two_corpora['zh']}, weight: 0.3}}]",
        "train.max_steps=200",
        "run.eval_every=0",
        "run.checkpoint_every=0",
    )
    assert r.returncode == 0, r.stderr
    return run_dir


def test_the_report_shows_achieved_vs_target_within_one_percent(mixture_run, two_corpora):
    r = run_here("report", mixture_run)
    assert r.returncode == 0, r.stderr
    shares = dict(re.findall(r"mixture (\w+): target [\d.]+ %, achieved ([\d.]+) %", r.stdout))
    assert abs(float(shares["shakespeare"]) - 70) < 1 and abs(float(shares["zh"]) - 30) < 1, r.stdout
    last = [json.loads(x) for x in (mixture_run / "metrics.jsonl").read_text().splitlines() if '"loss"' in x][-1]
    meta = json.loads((two_corpora["shakespeare"] / "meta.json").read_text())
    windows = (meta["num_tokens"]["train"] - 1) // 32
    epochs = last["source_tokens"]["shakespeare"] / 32 / windows  # ~1.17: past one epoch
    assert f"{epochs:.3g} epochs" in [line for line in r.stdout.splitlines() if "shakespeare" in line][0]
    out = mixture_run / "report"
    assert (out / "mixture.png").read_bytes().startswith(b"\x89PNG")
    page = (out / "report.html").read_text()
    assert "Mixture: achieved vs target" in page and "<td>70.0 %</td>" in page
    html = re.sub(r"<script\b[^>]*>.*?</script>", "", page, flags=re.S)  # plotly.js holds its own data URIs
    assert html.count('src="data:image/png;base64,') == 2  # the curves and the mixture figure


def test_a_run_without_a_mixture_has_no_mixture_section(run_dir):
    r = run_here("report", run_dir)
    assert r.returncode == 0, r.stderr
    assert "  mixture " not in r.stdout
    assert not (run_dir / "report" / "mixture.png").exists()
    assert "Mixture" not in (run_dir / "report" / "report.html").read_text()
