"""Where a run's scalars go besides metrics.jsonl (run.loggers): TensorBoard, Weights & Biases, MLflow. Each
sink takes the same {name: value} at the same optimizer step, so every chart reads alike wherever one looks.
A resumed run continues its W&B and MLflow runs: their ids live in RUN_DIR/loggers.json. Rank 0 only."""

from __future__ import annotations

import json
import netrc
import os
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse

from ..errors import UsageError
from ..files import write_atomic

IDS = "loggers.json"


def check_installed(names: Sequence[str]) -> None:
    """Before any training: a logger asked for but not installed is a one-line error naming the extra."""
    for name in names:
        if name == "tensorboard":
            continue  # a dependency; a broken install only loses the charts (TensorBoard below)
        try:
            __import__({"wandb": "wandb", "mlflow": "mlflow.tracking"}[name])
        except ImportError as e:
            raise UsageError(
                f"run.loggers: {name} is not installed ({e}); pip install 'pretrain[{name}]' "
                f"or remove {name} from run.loggers"
            ) from None


def open_sinks(names: Sequence[str], run_dir: Path, config: dict) -> list[TensorBoard | WandB | MLflow]:
    """One sink per logger, W&B and MLflow continuing the runs named in RUN_DIR/loggers.json."""
    path = run_dir / IDS
    ids = json.loads(path.read_text()) if path.exists() else {}
    kinds = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}
    sinks = [kinds[name](run_dir, ids.get(name), config) for name in names]
    now = {name: sink.run_id for name, sink in zip(names, sinks) if sink.run_id is not None}
    if {**ids, **now} != ids:
        write_atomic(path, json.dumps({**ids, **now}, indent=1) + "\n")
    return sinks


class TensorBoard:
    run_id = None

    def __init__(self, run_dir: Path, run_id: str | None, config: dict):
        quiet_write_errors_in_threads()  # before the writer: it writes the file's header from its thread at once
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(run_dir / "tensorboard"))
        except ImportError:  # tensorboard is a dependency, but a broken install must not stop training
            self._writer = None

    def scalars(self, values: dict, step: int) -> None:
        if self._writer is None:
            return
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def quiet_write_errors_in_threads() -> None:
    """TensorBoard writes its event file from a thread of its own. On a full disk that thread's traceback would
    land on stderr beside the trainer's one line about the same fault, which the writer hands to the main
    thread (at its creation, next write or close). Other threads' other errors print as before."""
    import threading

    from ..files import WRITE_ERRNOS

    previous = threading.excepthook
    if getattr(previous, "quiet_write_errors", False):
        return

    def hook(args) -> None:
        if isinstance(args.exc_value, OSError) and args.exc_value.errno in WRITE_ERRNOS:
            return
        previous(args)

    hook.quiet_write_errors = True
    threading.excepthook = hook


def wandb_mode() -> str:
    """WANDB_MODE when set; online when an API key is configured (WANDB_API_KEY, or `wandb login`'s entry in
    ~/.netrc); otherwise offline, to sync later with `wandb sync`: a run never waits on a server it cannot reach."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return "online" if netrc.netrc(os.environ.get("NETRC")).authenticators(host or "") else "offline"
    except (OSError, netrc.NetrcParseError):
        return "offline"


class WandB:
    """RUN_DIR/wandb/, project WANDB_PROJECT (default pretrain), named after the run directory."""

    def __init__(self, run_dir: Path, run_id: str | None, config: dict):
        import wandb

        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "pretrain"),
            name=run_dir.name,
            dir=str(run_dir),
            id=run_id,
            resume="allow",
            mode=wandb_mode(),  # pyright: ignore[reportArgumentType]  WANDB_MODE as set: wandb checks it
            config=config,
            settings=wandb.Settings(quiet=True),
        )
        # the optimizer step is the x-axis, not W&B's own row counter: a resume or a rollback logs a step again
        self._run.define_metric("*", step_metric="step")
        self.run_id = self._run.id

    def scalars(self, values: dict, step: int) -> None:
        self._run.log({**values, "step": step})

    def close(self) -> None:
        self._run.finish()


class MLflow:
    """MLFLOW_TRACKING_URI when set, else a file store in RUN_DIR/mlruns/ (`mlflow ui --backend-store-uri
    RUN_DIR/mlruns`); experiment MLFLOW_EXPERIMENT_NAME (default pretrain), the run named after the run
    directory."""

    def __init__(self, run_dir: Path, run_id: str | None, config: dict):
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (run_dir / "mlruns").absolute().as_uri()
            # MLflow 3 keeps the file store in maintenance mode behind this switch; a local run needs no server
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = MlflowClient(uri)
        if run_id is None or not self._exists(run_id):
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "pretrain")
            experiment = self._client.get_experiment_by_name(name)
            eid = experiment.experiment_id if experiment else self._client.create_experiment(name)
            run_id = self._client.create_run(eid, run_name=run_dir.name).info.run_id
        else:
            self._client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    def _exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self._client.get_run(run_id)
            return True
        except MlflowException:  # another tracking server than the one the run started on: a new run
            return False

    def scalars(self, values: dict, step: int) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[Metric(k, v, stamp, step) for k, v in values.items()])

    def close(self) -> None:
        self._client.set_terminated(self.run_id)
