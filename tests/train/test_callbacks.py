"""The contract between the trainer and its callbacks (train/callbacks/__init__.py, train/state.py): the order
they see a step in is the documented one, the plan they compare with is the trainer's one plan, and what a
callback asks for (state.Asks) is what the trainer does."""

import dataclasses
import json
import re
from pathlib import Path

import pytest

from support import tiny

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def documented_order() -> list[str]:
    """The numbered list under docs/architecture.md's "a callback" heading that names each callback in `code`."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("# a callback\n", 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\s+\d+\. `(\w+)`", section, flags=re.M)


def test_the_callbacks_see_a_step_in_the_documented_order():
    from pretrain.config import load_config
    from pretrain.train.callbacks import ORDER, default_callbacks

    assert documented_order() == list(ORDER)
    config = load_config(None, ["model.preset=debug", "debug.fp8_check=2", "debug.step_sleep=0.01"])
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, mixture=[{"dir": "a"}]))
    built = [type(cb).__name__ for cb in default_callbacks(config, plan={})]
    # every callback but the task evaluation (it needs pretrain[eval]'s tasks), in ORDER
    assert built == [name for name in ORDER if name != "TaskEvaluation"]
    plain = [type(cb).__name__ for cb in default_callbacks(load_config(None, ["model.preset=debug"]), plan={})]
    assert plain == ["Stability", "MetricsLogger", "PlanVsRun", "Evaluation", "Checkpointing", "Preemption"]


@pytest.fixture(scope="module")
def stopped_run(prepared, tmp_path_factory):
    """A run with one more callback, which asks to stop at the end of step 2 and records what it reads."""
    from pretrain.config import load_config
    from pretrain.distributed.runtime import init_runtime
    from pretrain.train.callbacks import Callback
    from pretrain.train.callbacks.plan_vs_run import PlanVsRun
    from pretrain.train.state import Asks
    from pretrain.train.trainer import Trainer

    class StopAtStepTwo(Callback):
        def __init__(self):
            self.seen = []

        def on_step_end(self, trainer, result):
            self.seen.append((trainer.state.step, trainer.state.interval, result.loss))
            return Asks(stop="enough for a test") if trainer.state.step == 2 else None

        def on_final_step(self, trainer, stopped):
            self.final = (trainer.state.step, stopped)
            return {"asker_saw_the_end": True}

    run_dir = tmp_path_factory.mktemp("asks") / "run"
    trainer = Trainer(load_config(None, tiny(prepared, run_dir)), init_runtime("cpu"))
    shared = [cb.plan for cb in trainer.callbacks if isinstance(cb, PlanVsRun)]
    asker = StopAtStepTwo()
    trainer.callbacks.append(asker)
    return trainer, shared, asker, trainer.fit(), run_dir


def test_one_plan_is_made_and_every_callback_compares_with_it(stopped_run):
    from pretrain.train.callbacks.metrics import MetricsLogger

    trainer, shared, _, _, _ = stopped_run
    (metrics,) = [cb for cb in trainer.callbacks if isinstance(cb, MetricsLogger)]
    assert shared == [trainer.plan] and shared[0] is trainer.plan and metrics.plan is trainer.plan
    assert trainer.plan["hardware"]["peak_tflops"] == 0.05  # the run's peak, the one behind its MFU


def test_a_callback_that_asks_to_stop_stops_the_run_with_its_reason(stopped_run):
    trainer, _, asker, result, run_dir = stopped_run
    # asked after step 2: step 3's all-reduce carries the request to every rank, the run stops after it
    assert result["preempted"] and result["step"] == 3
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    (stop,) = [e for e in events if e["event"] == "preempted"]
    assert stop["signal"] == "enough for a test" and stop["step"] == 3 and stop["path"]
    # what it read: the counters, and the interval MetricsLogger timed on that same step (run.log_every=1)
    assert [(step, interval.step, interval.loss) for step, interval, _ in asker.seen] == [
        (step, step, loss) for step, _, loss in asker.seen
    ]
    assert [step for step, _, _ in asker.seen] == [1, 2, 3]
    # the final hook: after the step the stop came with; what it returns joins the run's summary
    assert asker.final == (3, True) and result["asker_saw_the_end"]


def test_the_trainer_imports_no_callback_by_name():
    """It calls the hooks of `default_callbacks`' list: what a callback does at the end (the final validation
    loss, a stop's checkpoint) or on a rollback goes through the hooks and Asks, not a name."""
    import ast

    tree = ast.parse((ROOT / "src" / "pretrain" / "train" / "trainer.py").read_text())
    named = [
        f"{node.module}: {', '.join(a.name for a in node.names)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("callbacks.")
    ]
    assert named == []


def test_a_rollback_asked_is_carried_out_by_the_trainer(prepared, tmp_path):
    """A callback of its own asks (state.Rollback) to go back from step 3 to the step-0 checkpoint with the
    learning rate halved for 2 steps: the trainer loads it, keeps the data stream going, logs it, and the run
    finishes its 4 steps; the final hook sees the schedule's end."""
    from pretrain.config import load_config
    from pretrain.distributed.runtime import init_runtime
    from pretrain.train.callbacks import Callback
    from pretrain.train.state import Asks, Rollback
    from pretrain.train.trainer import Trainer

    class RollBackOnce(Callback):
        def __init__(self):
            self.seen, self.final = [], None

        def on_step_end(self, trainer, result):
            self.seen.append((trainer.state.step, result.lr))
            if trainer.state.step == 3 and not trainer.state.rollbacks:
                return Asks(rollback=Rollback(trainer.run_dir / "checkpoints" / "step_00000000", 9.5, 0.5, 2))
            return None

        def on_final_step(self, trainer, stopped):
            self.final = stopped

    # spike detection (on by default) with checkpoints writes the step-0 one, a rollback target
    run_dir = tmp_path / "run"
    trainer = Trainer(load_config(None, tiny(prepared, run_dir, "train.max_steps=4")), init_runtime("cpu"))
    asker = RollBackOnce()
    trainer.callbacks.insert(0, asker)
    result = trainer.fit()
    steps = [step for step, _ in asker.seen]
    assert steps == [1, 2, 3, 1, 2, 3, 4] and result["step"] == 4 and asker.final is False
    lrs = [lr for _, lr in asker.seen]
    assert lrs[3:5] == [pytest.approx(0.5 * lrs[0]), pytest.approx(0.5 * lrs[1])] and lrs[5] == lrs[2]
    assert trainer.state.rollbacks == [3] and trainer.state.micro_batches == 14  # 7 steps of 2 micro-batches
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    (rollback,) = [e for e in events if e["event"] == "rollback"]
    assert (rollback["step"], rollback["to_step"], rollback["loss"]) == (3, 0, 9.5)
    assert rollback["skipped_micro_batches"] == [0, 6]  # the data stream went on past steps 1-3's


def test_the_one_plan_refuses_a_run_that_does_not_fit_before_anything_is_built(prepared, tmp_path):
    from pretrain.config import load_config
    from pretrain.distributed.runtime import init_runtime
    from pretrain.errors import ConfigError
    from pretrain.train.trainer import Trainer

    config = load_config(None, tiny(prepared, tmp_path / "run", "model.preset=llama2-70b"))  # > 1 TB in fp32
    with pytest.raises(ConfigError, match=r"the plan needs \d[\d,.]* GiB per process .* choose a smaller model"):
        Trainer(config, init_runtime("cpu"))
    assert not (tmp_path / "run").exists()  # refused before the run directory is claimed
