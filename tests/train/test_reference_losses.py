"""The trainer logs the losses recorded before it was reshaped (tests/train/reference_losses.json): with the
behaviour of that time selected (the plain loss, FSDP gradients reduced once per step), bit for bit on a
machine that made a recording, within the kernels' allowance elsewhere (record_reference_losses.py says why);
and within 1e-6 relative (plus that allowance) with today's defaults (the chunked loss, FSDP gradients reduced
every micro-batch). A torch or Python without a recording has nothing to compare against and skips."""

import pytest
from record_reference_losses import BEHAVIOUR, CASES, assert_losses, fingerprint, reference, run_case

torch = pytest.importorskip("torch")


def recorded(name):
    found = reference(name)
    if found is None:
        here = fingerprint()
        pytest.skip(f"no recording on torch {here['torch']} / Python {here['python']}")
    return found


# The cases the README's second pass (ATEN_CPU_CAPABILITY=default) runs again: fp32, bf16 and two processes.
AGAIN = {"llama_fp32", "llama_bf16_mixed", "ddp"}


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.kernels] if n in AGAIN else []) for n in CASES])
def test_old_behaviour_gives_the_recorded_losses_bitwise(name, prepared, tmp_path):
    # ZeRO-1 now builds the fused AdamW every other mode has: its losses equal DDP's bit for bit (its old
    # for-loop AdamW differed from DDP's in the last bits at steps 4, 6 and 10).
    want, allowance = recorded(name)
    assert_losses(run_case(name, prepared, tmp_path, BEHAVIOUR), want, allowance)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama_fp32", "llama_mha_tied", "gpt2", "zero3"])
def test_new_defaults_stay_within_1e_6_of_the_recorded_losses(name, prepared, tmp_path):
    want, allowance = recorded(name)
    assert_losses(run_case(name, prepared, tmp_path), want, 1e-6 + allowance)


def test_only_a_machine_that_recorded_is_held_bitwise(monkeypatch):
    import record_reference_losses as rec

    here = fingerprint()
    monkeypatch.setattr(rec, "fingerprint", lambda: {**here, "cpu": "x86_64 GenuineIntel another"})
    assert reference("llama_bf16")[1] == rec.ALLOWANCE["bf16"]
    assert reference("gpt2")[1] == rec.ALLOWANCE["fp32"]
    monkeypatch.setattr(rec, "fingerprint", lambda: {**here, "torch": "0.0"})
    assert reference("gpt2") is None
