"""The trainer logs the losses recorded before it was reshaped (tests/train/reference_losses.json):
bit for bit with the behaviour of that time selected (the plain loss, FSDP gradients reduced once per step),
and within 1e-6 relative with today's defaults (the chunked loss, FSDP gradients reduced every micro-batch).
The same torch and Python as the recording (the file names both): floats are compared exactly."""

import json
import platform
from pathlib import Path

import pytest
from record_reference_losses import CASES, run_case

torch = pytest.importorskip("torch")

REFERENCE = json.loads((Path(__file__).parent / "reference_losses.json").read_text())
same_build = pytest.mark.skipif(
    (REFERENCE["torch"], REFERENCE["python"]) != (torch.__version__, platform.python_version()),
    reason=f"recorded on torch {REFERENCE['torch']} / Python {REFERENCE['python']}: bitwise equality needs both",
)
OLD_BEHAVIOUR = ["train.loss=plain", "parallel.grad_sync=step"]


@same_build
@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_old_behaviour_gives_the_recorded_losses_bitwise(name, prepared, tmp_path):
    # ZeRO-1 now builds the fused AdamW every other mode has: its losses equal DDP's bit for bit (its old
    # for-loop AdamW differed from DDP's in the last bits at steps 4, 6 and 10).
    want = REFERENCE["cases"]["ddp" if name == "zero1" else name]
    assert run_case(name, prepared, tmp_path, OLD_BEHAVIOUR) == want


@same_build
@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama_fp32", "llama_mha_tied", "gpt2", "zero3"])
def test_new_defaults_stay_within_1e_6_of_the_recorded_losses(name, prepared, tmp_path):
    got = run_case(name, prepared, tmp_path)
    want = REFERENCE["cases"][name]
    assert [step for step, _ in got] == [step for step, _ in want]
    for (step, loss), (_, expected) in zip(got, want):
        assert loss == pytest.approx(expected, rel=1e-6), f"step {step}"
