import base64
import json
import re

from matplotlib.figure import Figure

from pretrain.report import make_report, plots
from pretrain.report.runs import read_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_one_run_writes_png_and_self_contained_html(run_dir):
    result = make_report([run_dir])
    out = run_dir / "report"
    assert result["out_dir"] == str(out)
    assert result["files"] == [str(out / "report.png"), str(out / "report.html")]
    png = (out / "report.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE)
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # the figure is inlined, plotly.js too (one script, no src), and nothing is fetched from elsewhere
    scripts = re.findall(r"<script\b([^>]*)>", page)
    assert sum("plotly" in s for s in re.findall(r"<script\b[^>]*>(.*?)</script>", page, re.S)) >= 1
    assert not any("src=" in attrs for attrs in scripts)
    html = re.sub(r"<script\b[^>]*>.*?</script>", "", page, flags=re.S)  # plotly.js holds its own data URIs
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert [base64.b64decode(i) for i in images] == [png]
    assert not re.search(r'(src|href)="(?!data:)', html)
    # plan vs measured, in GiB / MiB with the error; the 15.7 % miss is shaded
    assert "Plan vs measured on NVIDIA H100 80GB HBM3" in page
    assert '<td>12.10 GiB</td><td>14.00 GiB</td><td class="off">+15.7 %</td>' in page
    assert "<td>474.7 MiB</td>" in page and "<td>-5.5 %</td>" in page
    assert "to_step=180" in page  # the rollback, in the events table
    assert "<td>nonfinite_skip</td><td>100</td><td>8.44M</td><td>nan</td><td>grad_norm=inf</td>" in page
    assert [p.name for p in out.glob(".*")] == [".pretrain-report.json"]  # its mark; no temp file left behind
    assert result["runs"][0]["last_step"] == 300


def test_two_runs_on_the_same_axes(tmp_path, run_dir, make_run):
    make_run(tmp_path / "cpu-run", steps=120, gpu=False, seed=1)
    result = make_report([run_dir, tmp_path / "cpu-run"], out_dir=tmp_path / "cmp", per_panel=True)
    names = ["report.png", "report.html"] + [f"{p.name}.png" for p in plots.PANELS]
    assert result["files"] == [str(tmp_path / "cmp" / n) for n in names]
    assert all((tmp_path / "cmp" / n).read_bytes()[:8] == PNG_SIGNATURE for n in names if n.endswith(".png"))
    assert [s["name"] for s in result["runs"]] == ["gpt2-small", "cpu-run"]
    page = (tmp_path / "cmp" / "report.html").read_text()
    assert "<h2>gpt2-small: " in page and "<h2>cpu-run: " in page  # with what each trained


def test_same_dir_names_are_told_apart_by_path(tmp_path, make_run):
    make_run(tmp_path / "a" / "seed1", steps=60)
    make_run(tmp_path / "b" / "seed1", steps=60)
    result = make_report([tmp_path / "a" / "seed1", tmp_path / "b" / "seed1"], out_dir=tmp_path / "out")
    assert [s["name"] for s in result["runs"]] == [str(tmp_path / "a" / "seed1"), str(tmp_path / "b" / "seed1")]


def test_live_run_with_a_few_lines_and_null_metrics(tmp_path):
    lines = [
        {
            "step": s,
            "tokens": 4096 * s,
            "loss": 10.8 - 0.1 * s,
            "lr": 1e-5 * s,
            "batch_tokens": 4096,
            "grad_norm": 1.0,
            "tokens_per_s": 900.0,
            "mfu": None,
            "peak_mem_bytes": None,
            "time": s,
        }
        for s in (1, 2)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 3, "lo')
    result = make_report(tmp_path)
    assert (tmp_path / "report" / "report.png").read_bytes().startswith(PNG_SIGNATURE)
    assert "No plan_vs_run.json yet." in (tmp_path / "report" / "report.html").read_text()
    assert result["runs"][0]["last_step"] == 2


def test_panel_without_data_says_so(tmp_path, run_dir, make_run):
    make_run(tmp_path / "cpu-run", steps=60, gpu=False)
    cpu, gpu = read_run(tmp_path / "cpu-run"), read_run(run_dir)
    mfu = next(p for p in plots.PANELS if p.key == "mfu")
    ax = Figure().subplots()
    plots.draw(ax, mfu, [cpu])
    assert [t.get_text() for t in ax.texts] == ["no data"]
    ax = Figure().subplots()
    plots.draw(ax, mfu, [cpu, gpu])  # one run with MFU is enough for a curve
    assert len(ax.texts) == 0 and len(ax.lines) > 0


def test_loss_panel_marks_events_and_uses_log_scale(run_dir):
    run = read_run(run_dir)
    ax = Figure().subplots()
    plots.draw(ax, plots.PANELS[0], [run])
    # train + validation curves, 4 vertical event lines (nonfinite_skip, spike, rollback, resumed), 1 marker
    # (the spike's loss; the non-finite one is "nan"); the checkpoints and the preemption are not drawn
    assert len(ax.lines) == 2 + 4 + 1
    assert ax.get_yscale() == "log"  # 10.8 -> 3.3 spans more than a factor 3
    assert ax.get_xaxis().get_major_formatter()(2_000_000, 0) == "2M"


def test_a_mixtures_validation_per_source_is_drawn_and_the_title_says_what_trained(tmp_path):
    import yaml

    from pretrain.config import load_config

    run_dir = tmp_path / "mix"
    run_dir.mkdir()
    lines = [{"step": s, "tokens": 256 * s, "loss": 6.0 - 0.1 * s} for s in range(1, 7)]
    lines += [
        {
            "step": s,
            "tokens": 256 * s,
            "val_loss": 5.5 - 0.1 * s,
            "val_loss/shakespeare": 5.0 - 0.1 * s,
            "val_loss/zh": 6.0 - 0.1 * s,
        }
        for s in (3, 6)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    config = load_config(
        overrides=[
            "model.preset=debug",
            "train.seq_len=32",
            "train.micro_batch_size=4",
            "train.grad_accum_steps=2",
            "train.precision=fp32",
            "train.lr=3e-3",
        ]
    )
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict()))
    run = read_run(run_dir)
    ax = Figure().subplots()
    plots.draw(ax, plots.PANELS[0], [run])
    assert len(ax.lines) == 2 + 2  # train, validation, and one dotted curve per source
    labels = [h.get_label() for h in plots._legend([run])]
    assert labels == ["mix", "val_loss: shakespeare", "val_loss: zh"]
    from pretrain.report.runs import title_line

    assert title_line(run) == "mix: debug 158K (2 x 64), seq 32, 256 tokens/step, lr 0.003 cosine, fp32"


def test_interactive_curves_hold_every_series_and_event(tmp_path, run_dir, make_run):
    from pretrain.report.interactive import curves_figure

    make_run(tmp_path / "cpu-run", steps=120, gpu=False, seed=1)
    with (tmp_path / "cpu-run" / "metrics.jsonl").open("a") as f:  # after the half-written line: a new line
        f.write(
            "\n"
            + "".join(
                json.dumps(
                    {
                        "step": s,
                        "tokens": 40_000 * s,
                        "eval/hellaswag": 0.25 + s / 1000,
                        "moe/load_imbalance": 1.5 - s / 100,
                    }
                )
                + "\n"
                for s in (30, 60)
            )
        )
    gpu, cpu = read_run(run_dir), read_run(tmp_path / "cpu-run")
    fig = curves_figure([gpu, cpu])
    titles = [a.text for a in fig.layout.annotations]
    assert titles == [p.title for p in plots.PANELS] + ["eval/hellaswag", "moe/load_imbalance"]
    loss = [t for t in fig.data if t.legendgroup == "gpt2-small" and t.xaxis == "x" and t.line.dash == "solid"]
    assert list(loss[0].y) == gpu.series("loss")[1] and list(loss[0].customdata) == gpu.steps("loss")
    memory = next(
        t
        for t in fig.data
        if t.legendgroup == "gpt2-small" and t.hovertemplate.startswith("gpt2-small<br>peak_mem_bytes")
    )
    assert abs(memory.y[0] - 21.4) < 1e-6  # GiB, as report.png
    hellaswag = next(t for t in fig.data if "eval/hellaswag" in t.hovertemplate)
    assert (list(hellaswag.x), list(hellaswag.y)) == ([1_200_000, 2_400_000], [0.28, 0.31])
    # one legend entry per run, which toggles it on every panel
    assert [t.name for t in fig.data if t.showlegend] == ["gpt2-small", "cpu-run"]
    # spike, rollback, nonfinite_skip and resumed of both runs on all 9 panels; the spike marked on the loss
    assert len(fig.layout.shapes) == 2 * 4 * 9
    assert sum(t.name.endswith(": spike") for t in fig.data) == 2


def test_a_moe_runs_report_draws_its_load_per_layer_and_balancing_losses(tmp_path):
    # The lines pretrain.model.moe logs: the worst layer's load, each MoE layer's (blocks 1 and 2 after one
    # dense block), the balancing losses. The per-layer list drew an empty panel of its own; report.png had none.
    from pretrain.report.interactive import curves_figure

    run = tmp_path / "moe"
    run.mkdir()
    lines = [
        {
            "step": s,
            "tokens": 64 * s,
            "loss": 7.0 - s / 10,
            "moe/aux_loss": 1.02 - s / 1000,
            "moe/z_loss": 4.4 - s / 100,
            "moe/load_max_over_mean": 1.6 - s / 100,
            "moe/load_max_over_mean_per_layer": [1.6 - s / 100, 1.3 - s / 200],
        }
        for s in range(1, 6)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run / "config.yaml").write_text("model:\n  num_layers: 3\n  num_experts: 8\n  first_dense_layers: 1\n")
    moe = read_run(run)
    titles = [p.title for p in plots.panels([moe])]
    assert titles == [p.title for p in plots.PANELS] + [p.title for p in plots.MOE_PANELS]  # report.png's too
    fig = curves_figure([moe])
    shown = [a.text for a in fig.layout.annotations]
    assert shown == titles and "moe/load_max_over_mean_per_layer" not in shown  # no empty panel of lists
    layers = {t.name: list(t.y) for t in fig.data if " block " in t.name}
    assert layers == {
        "moe block 1": [x["moe/load_max_over_mean_per_layer"][0] for x in lines],
        "moe block 2": [x["moe/load_max_over_mean_per_layer"][1] for x in lines],
    }
    result = make_report([run], per_panel=True)
    assert str(run / "report" / "moe_load.png") in result["files"]
