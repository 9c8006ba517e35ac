"""`pretrain plan` as a user runs it: instant, no torch, JSON contract, explain, one-line errors."""

import json
import subprocess
import sys

import pytest

from support import run_cli

JSON_KEYS = {
    "params",
    "flops",
    "tokens",
    "storage_bytes",
    "checkpoint_bytes",
    "steps",
    "time",
    "memory_bytes",
    "model_states",
    "fits",
    "max_micro_batch_size",
    "parallel",
    "hardware",
    "model",
}


def test_importing_the_planner_does_not_import_torch():
    code = (
        "import sys, pretrain.plan, pretrain.config, pretrain.cli; "
        "print('torch' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False False"


def test_plan_json_contract():
    r = run_cli("plan", "model.preset=llama-7b", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert JSON_KEYS <= set(p)
    assert p["params"]["total"] == 6_738_415_616
    assert {"total", "embedding", "non_embedding"} <= set(p["params"])
    assert {
        "per_token",
        "per_token_6n",
        "total",
        "total_6n",
        "attention_per_token",
        "per_token_hardware",
        "convention",
    } <= set(p["flops"])
    mem = p["memory_bytes"]
    assert set(mem) == {
        "weights",
        "gradients",
        "optimizer",
        "activations",
        "buffers",
        "cuda_context",
        "total",
        "peak_phase",
        "phases",
        "compiled",
        "compiled_basis",
        "host",
    }
    # Issue 13's contract: the total is the peak over the phases of a step, and peak_phase names it.
    assert list(mem["phases"]) == ["forward", "loss_backward", "backward", "optimizer_step"]
    assert mem["total"] == mem["phases"][mem["peak_phase"]] == max(mem["phases"].values())
    # Issue 31: train.compile (auto: on for a GPU) gives the compiled step's peak, below the eager one, and how.
    assert isinstance(mem["compiled"], int) and mem["compiled"] < mem["total"]
    assert "inductor's partitioner" in mem["compiled_basis"]
    assert {"total", "chinchilla"} <= set(p["tokens"])
    assert {"tokens_per_step", "total"} <= set(p["steps"])
    assert {"seconds", "days", "gpu_hours", "cost"} <= set(p["time"])


def test_measured_section_gives_mfu_and_hfu():
    r = run_cli(
        "plan",
        "model.preset=gpt2",
        "measured.tokens_per_second=57000",
        "hardware.gpu=a100-80gb",
        "train.activation_checkpointing=full",
        "--json",
    )
    p = json.loads(r.stdout)
    assert p["mfu"] > 0
    assert p["hfu"] == pytest.approx(p["mfu"] * p["flops"]["per_token_hardware"] / p["flops"]["per_token"])


def test_table_and_explain():
    r = run_cli("plan", "model.preset=llama3.2-1b", "parallel.gpus=8", "hardware.gpu=h100-sxm", "--explain")
    assert r.returncode == 0, r.stderr
    assert "Parameters" in r.stdout and "1,235,814,400" in r.stdout and "GiB" in r.stdout
    assert "[memory]" in r.stdout and "= " in r.stdout  # formulas with numbers substituted


def test_yaml_file_and_overrides(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model:\n  preset: gpt2\ntrain:\n  tokens: 1.4e12\n  seq_len: 1024\nparallel:\n  gpus: 8\n")
    p = json.loads(run_cli("plan", cfg, "train.micro_batch_size=4", "--json").stdout)
    assert p["tokens"]["total"] == 1_400_000_000_000
    assert p["steps"]["tokens_per_step"] == 1024 * 4 * 8 * 8


@pytest.mark.parametrize(
    "args, words",
    [
        (["train.lrr=1"], "train.lrr"),
        (["model.preset=llama-8b"], "model.preset"),
        (["model.hidden_size=100", "model.num_heads=3"], "model.num_heads"),
        (["parallel.gpus=6", "parallel.tensor=4"], "parallel.gpus"),
        (["train.micro_batch_size=-2"], "train.micro_batch_size"),
        (["train.tokens=-5"], "train.tokens"),
        (["train.precision=fp8"], "train.precision"),
        (["hardware.gpu=tpu"], "hardware.gpu"),
        (["nosection=1"], "section"),
        (["missing.yaml"], "missing.yaml"),
        (["train.seq_len=99999", "model.preset=gpt2"], "train.seq_len"),
        (["model.preset=llama-7b", "hardware.gpu=v100-32gb"], "train.precision"),
        # NaN passes every range check and infinity overflows int(GB x 1e9): both refused for every numeric key.
        (["hardware.cuda_context_gb=inf"], "hardware.cuda_context_gb: must be a finite number"),
        (["hardware.cuda_context_gb=nan"], "hardware.cuda_context_gb: must be a finite number"),
        (["hardware.memory_gb=inf"], "hardware.memory_gb: must be a finite number"),
        (["hardware.memory_gb=nan"], "hardware.memory_gb: must be a finite number"),
        (["hardware.peak_tflops=nan"], "hardware.peak_tflops: must be a finite number"),
        (["hardware.peak_tflops=inf"], "hardware.peak_tflops: must be a finite number"),
        (["train.lr=nan"], "train.lr: must be a finite number"),
        (["train.betas=[0.9,nan]"], "train.betas: must be a finite number"),
        (["model.preset=debug", "model.vocab_size=1e300"], "model.vocab_size: 1e+300 is too large"),
        (["hardware.memory_gb=1e300"], "hardware.memory_gb: 1e+300 is too large"),
        # Parameter offload exists only with ZeRO-3 (DeepSpeed ZeRO-Infinity); without it "weights 0.00" fitted.
        (["parallel.offload=optimizer+params", "parallel.gpus=8"], "parallel.offload"),
        (["parallel.offload=optimizer+params", "parallel.gpus=8", "parallel.zero_stage=2"], "parallel.offload"),
        # Megatron: the key/value groups must divide by the tensor-parallel size (TinyLlama: 4 kv heads).
        (["model.preset=tinyllama-1.1b", "parallel.gpus=8", "parallel.tensor=8"], "model.num_kv_heads 4"),
        # RoPE's base: -1 was a TypeError (complex angles), 0 trained to NaN
        (["model.rope_theta=-1"], "model.rope_theta: must be > 0"),
        (["model.rope_theta=0"], "model.rope_theta: must be > 0"),
        # The MoE keys (moe-debug: 2 layers, 8 experts): each was planned or trained as something else, or crashed
        (["model.preset=moe-debug", "model.first_dense_layers=2"], "model.first_dense_layers: 2 is not below"),
        (["model.preset=moe-debug", "model.first_dense_layers=100"], "model.first_dense_layers: 100 is not below"),
        (["model.preset=moe-debug", "model.moe_intermediate_size=0"], "model.moe_intermediate_size: must be > 0"),
        (["model.preset=moe-debug", "model.router_aux_loss_coef=-0.01"], "model.router_aux_loss_coef: must be >= 0"),
        (["model.preset=moe-debug", "model.router_bias_update_rate=-1e-3"], "model.router_bias_update_rate"),
        (["model.preset=moe-debug", "model.num_shared_experts=-1"], "model.num_shared_experts: must be >= 0"),
        (["model.preset=moe-debug", "model.num_experts=0", "model.num_shared_experts=1"], "model.num_shared_experts"),
        (["model.preset=moe-debug", "model.num_experts=-8"], "model.num_experts: must be >= 0"),
        # group-limited routing: equal groups, at most all of them a token, room for its k experts
        (["model.preset=moe-debug", "model.expert_groups=3"], "model.expert_groups: 3 does not split"),
        (["model.preset=moe-debug", "model.expert_groups=2", "model.expert_groups_per_token=3"], "not between 1"),
        (["model.preset=moe-debug", "model.expert_groups=8"], "model.expert_groups_per_token: 1 groups of 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, words):
    r = run_cli("plan", *args)
    assert r.returncode == 2, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.stderr


def test_parameter_offload_with_zero3_and_kv_divisible_tensor_are_accepted():
    assert (
        run_cli("plan", "parallel.offload=optimizer+params", "parallel.gpus=8", "parallel.zero_stage=3").returncode == 0
    )
    assert run_cli("plan", "model.preset=tinyllama-1.1b", "parallel.gpus=8", "parallel.tensor=4").returncode == 0


LLAMA_JSON = {
    "model_type": "llama",
    "vocab_size": 1000,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


@pytest.mark.parametrize(
    "key, content, words",
    [
        ("hardware.profile", "[1, 2]", "has no 'peak_tflops' mapping"),
        ("hardware.profile", b"\xff\xfe bad", "not UTF-8"),
        ("hardware.profile", {"peak_tflops": {"bf16": "abc"}}, "peak_tflops.bf16 is 'abc'"),
        ("hardware.profile", {"peak_tflops": {"bf16": -5}}, "peak_tflops.bf16 is -5"),  # printed negative minutes
        ("hardware.profile", {"peak_tflops": {"bf16": 0}}, "peak_tflops.bf16 is 0"),
        ("hardware.profile", {"peak_tflops": {"bf16": True}}, "peak_tflops.bf16 is True"),
        ("hardware.profile", None, "is a directory"),
        ("model.hf_config", {k: v for k, v in LLAMA_JSON.items() if k != "hidden_size"}, "no 'hidden_size'"),
        ("model.hf_config", {"model_type": "gpt2", "vocab_size": 100}, "no 'n_embd'"),
        ("model.hf_config", "[1, 2]", "holds an array, not a mapping"),
        ("model.hf_config", {**LLAMA_JSON, "rope_theta": "abc"}, "rope_theta 'abc' is not a number"),
        ("model.hf_config", b"\xff\xfe bad", "not UTF-8"),
        ("model.hf_config", {**LLAMA_JSON, "attention_bias": True}, "attention_bias"),
        ("model.hf_config", {**LLAMA_JSON, "mlp_bias": True}, "mlp_bias"),
        ("config", b"model:\n  preset: gpt2 \xff\n", "not UTF-8"),
    ],
)
def test_bad_files_are_one_line_naming_the_file(tmp_path, key, content, words):
    path = tmp_path / ("bad.yaml" if key == "config" else "bad.json")
    if content is None:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    model = "train.seq_len=64" if key == "model.hf_config" else "model.preset=debug"
    r = run_cli("plan", path if key == "config" else f"{key}={path}", model)
    assert r.returncode == 2, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and str(path) in lines[0] and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "text, words",
    [
        ("1: 2\n", "unknown config section '1'"),  # a YAML key need not be a string
        ("true: 1\n", "unknown config section 'True'"),
        ("[]\n", "the top level must be a mapping"),  # an empty list is not an empty config
        ("0\n", "the top level must be a mapping"),
    ],
)
def test_odd_yaml_shapes_are_one_line(tmp_path, text, words):
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    r = run_cli("plan", path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr


def test_an_empty_section_takes_overrides_and_integers_stay_exact(tmp_path):
    from pretrain.config import load_config

    path = tmp_path / "run.yaml"
    path.write_text("train:\nmodel:\n  preset: debug\n")
    assert load_config(path, ["train.lr=1e-4"]).train.lr == 1e-4
    assert load_config(path, ["train.seed=9007199254740993"]).train.seed == 2**53 + 1  # not rounded by a float
    assert load_config(path, ["train.tokens=1.4e12", "train.max_steps=2_000"]).train.max_steps == 2000


def test_unknown_flag_is_one_line():
    r = run_cli("plan", "--bogus")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("pretrain plan: error: unrecognized arguments: --bogus")  # the command's own
    r = run_cli("plan", "")
    assert r.returncode == 2 and "config file name is empty" in r.stderr


def test_python_dash_m_matches_the_script():
    import shutil
    from pathlib import Path

    beside = Path(sys.executable).parent / "pretrain"  # the venv's script, also when the venv is not activated
    script = str(beside) if beside.exists() else shutil.which("pretrain")
    if script is None:
        pytest.skip("the pretrain console script is not installed")
    a = subprocess.run([script, "plan", "model.preset=gpt2", "--json"], capture_output=True, text=True).stdout
    assert a == run_cli("plan", "model.preset=gpt2", "--json").stdout


@pytest.mark.parametrize("layers", ["1000000000000", "1001"])
def test_a_depth_beyond_the_planner_is_one_line_at_once(layers):
    r = run_cli("plan", f"model.num_layers={layers}", timeout=60)  # it ran for minutes, growing to gigabytes
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "model.num_layers" in lines[0] and "at most 1,000" in lines[0]


def test_the_deepest_planned_model_plans():
    assert run_cli("plan", "model.num_layers=1000", "model.preset=gpt2").returncode == 0
