"""`pretrain eval`'s scores against its two anchors, on a tiny trained model: ai2-olmo-eval's own metric
computation (its ICLMetric fed its own batches and our model's logits) and lm-evaluation-harness (lm_eval, a
local task YAML, our Hugging Face export through its HFLM)."""

import json

import pytest
import torch

from support import run_cli

pytest.importorskip("olmo_eval")


def test_acc_and_acc_norm_equal_olmo_evals_own_metric(run_and_export):
    from olmo_eval import ICLMetric
    from olmo_eval.tasks import LABEL_TO_TASK_MAP

    from pretrain import load_model
    from pretrain.data.tokenizer import find_tokenizer
    from pretrain.eval.models import OurModel
    from pretrain.eval.scoring import loglikelihoods, task_metrics
    from pretrain.eval.tasks import load_tasks, olmo_tokenizer
    from pretrain.export.command import tokenizer_of

    run_dir, _ = run_and_export
    model = load_model(run_dir)
    tokenizer = find_tokenizer(tokenizer_of(model)).load()
    name, limit, max_len = "arc_easy", 12, model.config.max_seq_len  # 3 to 5 choices of varied length
    [task] = load_tasks([name], tokenizer, max_len, limit)
    ours = task_metrics(task, loglikelihoods(OurModel(model, max_len), task.requests, batch_size=5))

    # ai2-olmo-eval end to end: its task class on the whole dataset, its batches, its metric
    theirs_task = LABEL_TO_TASK_MAP[name](olmo_tokenizer(tokenizer), model_ctx_len=max_len)
    samples = [s for s in theirs_task.samples if s["doc_id"] < limit]
    results = {}
    for metric_type in ("acc", "len_norm"):
        metric = ICLMetric(metric_type=metric_type)
        for i in range(0, len(samples), 8):
            batch = theirs_task.collate_fn(samples[i : i + 8])
            with torch.no_grad():
                metric.update(batch, model(batch["input_ids"]))
        results[metric_type] = metric.compute()
    assert ours["examples"] == limit
    assert round(ours["acc"] * limit) == round(float(results["acc"]["acc_v1"]) * limit)
    assert round(ours["acc_norm"] * limit) == round(float(results["len_norm"]["len_norm_v1"]) * limit)
    assert ours["bits_per_byte"] == pytest.approx(float(results["acc"]["bpb_v2"]), rel=1e-4)
    assert 0 < ours["chance"] < 1


def test_acc_and_acc_norm_equal_lm_evals_on_a_local_task(run_and_export, local_task, tmp_path):
    lm_eval = pytest.importorskip("lm_eval")
    pytest.importorskip("accelerate", reason="lm_eval's HFLM imports it: pip install -e '.[dev]' (lm-eval[hf])")
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    run_dir, hf_dir = run_and_export
    (tmp_path / "python_mc.yaml").write_text(f"""\
task: python_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {local_task}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
target_delimiter: ""
metric_list:
  - metric: acc
  - metric: acc_norm
""")
    out = lm_eval.simple_evaluate(
        model=HFLM(pretrained=str(hf_dir), batch_size=4, device="cpu"),
        tasks=["python_mc"],
        task_manager=TaskManager(include_path=str(tmp_path)),
    )
    anchor = out["results"]["python_mc"]
    r = run_cli("eval", run_dir, "--tasks", local_task, "--json", "--batch-size", "5")  # our model, the run's tokenizer
    assert r.returncode == 0, r.stderr
    from pretrain.eval.models import load_target
    from pretrain.eval.scoring import loglikelihoods, task_metrics
    from pretrain.eval.tasks import load_tasks

    lm, tokenizer = load_target(str(hf_dir), "cpu")  # the export, through transformers, with its own tokenizer
    [task] = load_tasks([str(local_task)], tokenizer, lm.max_len)
    for ours in (json.loads(r.stdout)["tasks"]["python_mc"], task_metrics(task, loglikelihoods(lm, task.requests, 3))):
        assert ours["examples"] == 12
        assert ours["acc"] == anchor["acc,none"] and ours["acc_norm"] == anchor["acc_norm,none"], (ours, anchor)
        assert ours["acc_stderr"] == pytest.approx(anchor["acc_stderr,none"], rel=1e-9)
        assert ours["acc_norm_stderr"] == pytest.approx(anchor["acc_norm_stderr,none"], rel=1e-9)


def test_a_hugging_face_directory_is_scored_without_transformers_or_torchaos_noise(run_and_export, local_task):
    # transformers' "Loading weights" bar and torchao's import complaints (its CUDA kernels on a CPU-only torch,
    # enum registrations torch calls deprecated) leaked between our lines; stderr holds nothing of them now.
    _, hf_dir = run_and_export
    r = run_cli("eval", hf_dir, "--tasks", local_task, "--limit", "4")
    assert r.returncode == 0, r.stderr
    assert "python_mc" in r.stdout
    for noise in ("Loading weights", "it/s]", "Failed to load", "register_constant"):
        assert noise not in r.stderr, r.stderr
