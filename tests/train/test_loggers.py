"""run.loggers: W&B (offline) and MLflow (a file store in the run directory) get the scalars TensorBoard gets,
with the same names and steps; a resume continues their runs; a logger not installed stops the run at once."""

from __future__ import annotations

import json
import math
import os
import signal
import struct
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pretrain.config import ConfigError, load_config
from support import run_cli, tiny, wait_for_steps

pytest.importorskip("wandb")
pytest.importorskip("mlflow")


def offline_env(tmp_path) -> dict:
    """W&B offline and nothing written outside tmp_path: no network, no ~/.config/wandb of the user's."""
    home = tmp_path / "home"
    env = {
        "HOME": str(home),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(home / "wandb"),
        "WANDB_CONFIG_DIR": str(home / "config"),
        "WANDB_CACHE_DIR": str(home / "cache"),
        "WANDB_DATA_DIR": str(home / "data"),
        "MLFLOW_TRACKING_URI": "",
    }
    return env


def expected_scalars(run_dir) -> dict:
    """{(name, step): value} of every number metrics.jsonl holds, as TrainingLog flattens it."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key, value in record.items():
            items = {f"{key}/{k}": v for k, v in value.items()} if isinstance(value, dict) else {key: value}
            for name, v in items.items():
                if name not in ("step", "time") and isinstance(v, (int, float)) and math.isfinite(v):
                    out[(name, record["step"])] = v
    return out


def wandb_records(path) -> list:
    """The records of an offline run's .wandb file: a LevelDB-style log (7-byte file header, 32 KiB blocks of
    records each with a 7-byte header: CRC, length, type) of protobuf Records."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw, pos, block, part, records = path.read_bytes(), 7, 32768, b"", []
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if n == 0 and kind == 0:
            break
        part, pos = part + raw[pos + 7 : pos + 7 + n], pos + 7 + n
        if kind in (1, 4):  # FULL or LAST: a whole record
            records.append(pb.Record())
            records[-1].ParseFromString(part)
            part = b""
    return records


@pytest.mark.slow
def test_wandb_and_mlflow_get_tensorboards_scalars_and_continue_their_runs_after_sigterm(
    prepared, tmp_path, monkeypatch
):
    run_dir, env = tmp_path / "run", offline_env(tmp_path)
    args = tiny(prepared, run_dir, "train.max_steps=8", "run.loggers=[tensorboard,wandb,mlflow]")
    # SIGTERM to the whole process group, as a scheduler sends it: W&B's service process gets it too
    first = subprocess.Popen(
        [sys.executable, "-m", "pretrain", "train", *args, "debug.step_sleep=0.3"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wait_for_steps(run_dir, 2, first)
    service = subprocess.run(["pgrep", "-P", str(first.pid)], capture_output=True, text=True).stdout.split()
    os.killpg(first.pid, signal.SIGTERM)
    assert first.wait(timeout=120) == 0, first.stderr.read()
    assert service and not any(os.path.exists(f"/proc/{pid}") for pid in service)  # W&B's service ended
    ids = json.loads((run_dir / "loggers.json").read_text())
    assert set(ids) == {"wandb", "mlflow"}
    second = run_cli("train", "--resume", run_dir, env=env)
    assert second.returncode == 0, second.stderr
    assert json.loads((run_dir / "loggers.json").read_text()) == ids  # the same W&B and MLflow runs
    # W&B says where its data goes in a few lines at the start, not its ~25-line history and summary at the end
    said = [line for line in second.stderr.splitlines() if line.startswith("wandb:")]
    assert len(said) <= 4 and not any("Run summary" in line for line in said), said

    expected = expected_scalars(run_dir)
    assert {step for _, step in expected} == set(range(1, 9))  # both halves of the run
    board = EventAccumulator(str(run_dir / "tensorboard")).Reload()
    assert set(board.Tags()["scalars"]) == {name for name, _ in expected}

    # W&B: every offline session of the run (one per process) carries the one id
    sessions = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(sessions) == 2 and all(s.name.endswith(ids["wandb"]) for s in sessions)
    logged = {}
    for session in sessions:
        records = wandb_records(session / f"run-{ids['wandb']}.wandb")
        assert records[-1].WhichOneof("record_type") == "exit"  # finished, the SIGTERMed session included
        for r in records:
            if r.WhichOneof("record_type") == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                logged.update({(k, row["step"]): v for k, v in row.items() if not k.startswith("_") and k != "step"})
    assert logged == pytest.approx(expected, rel=1e-12)

    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 wants it for a file store, as the trainer

    client = MlflowClient((run_dir / "mlruns").as_uri())
    run = client.get_run(ids["mlflow"])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    stored = {
        (name, m.step): m.value for name in run.data.metrics for m in client.get_metric_history(ids["mlflow"], name)
    }
    assert stored == pytest.approx(expected, rel=1e-12)


def test_a_logger_not_installed_stops_the_run_before_training_naming_the_extra(prepared, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "wandb.py").write_text("raise ImportError('no module named wandb (this test)')\n")
    env = {**offline_env(tmp_path), "PYTHONPATH": os.pathsep.join([str(broken), os.environ.get("PYTHONPATH", "")])}
    run_dir = tmp_path / "run"
    r = run_cli("train", *tiny(prepared, run_dir, "run.loggers=[tensorboard,wandb]"), env=env)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "pip install 'pretrain[wandb]'" in r.stderr
    assert not (run_dir / "metrics.jsonl").exists()


def test_an_unknown_logger_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match="run.loggers: 'tensorbord' is not allowed; choose one of tensorboard"):
        load_config(None, ["run.loggers=[tensorbord]"])


def test_wandb_is_offline_unless_told_or_logged_in(tmp_path, monkeypatch):
    from pretrain.train.loggers import wandb_mode

    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert wandb_mode() == "offline"  # no key, no ~/.netrc
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password 0123456789abcdef\n")
    assert wandb_mode() == "online"  # `wandb login`'s entry
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"
