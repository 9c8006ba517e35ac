"""What the trainer assembles before step 0 ("build" in docs/architecture.md): the config this process trains,
the run's one plan, the data, the run directory claimed, the model made trainable here and the windows it reads.

Its own module so that trainer.py holds the loop and what it carries out for the callbacks. Each function
returns what it makes, named (TrainingData, ClaimedRunDir, Staged, TrainableModel), and assigns nothing:
`Trainer.__init__` calls them in order and keeps the results as its attributes, which the callbacks read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..checkpoint.choice import resume_point
from ..checkpoint.compatibility import check_resume_compatible, settings_change, stage_change, stage_length
from ..checkpoint.run_dir import RunDir
from ..config import half_residual_enabled, mixture_sources, replaced
from ..data.documents import check_document_index
from ..model.documents import documents_of_run
from ..plan import make_plan
from ..plan.length import training_length
from ..plan.params import count_params
from ..precision import half_dtype
from . import plan_check
from .attention import kernel_context, rank_kv_heads
from .prefetch import WindowSource

if TYPE_CHECKING:
    from ..config.schema import ResolvedConfig
    from ..data.loader import PreparedData
    from ..distributed.engines import Parallelized
    from ..distributed.runtime import Runtime
    from ..model.documents import Documents


def launched_config(config: ResolvedConfig, rt: Runtime, own_data: bool) -> ResolvedConfig:
    """The config this process trains: the world torchrun gives is the truth (steps, batch, the plan), and the
    data directory is saved absolute (export, generate and resume run from anywhere). A new object: the
    loaded config is never changed."""
    data_dir = str(Path(config.data.dir).resolve()) if own_data and config.data.dir else config.data.dir
    mixture = [{**s, "dir": str(Path(s["dir"]).resolve())} if own_data else s for s in config.data.mixture]
    return dataclasses.replace(
        config,
        parallel=dataclasses.replace(config.parallel, gpus=rt.world_size),
        data=dataclasses.replace(config.data, dir=data_dir, mixture=mixture),
    )


def plan_run(device_config: ResolvedConfig, rt: Runtime) -> dict:
    """The run's one plan, at the peak behind its MFU: the memory check before anything is built, the
    figures plan vs run compares, the FLOPs per token of every metrics line. On a machine the catalog does not
    time (a CPU, an unlisted GPU), planned with its own measured profile or peak (plan_check.measured_hardware);
    the plan's tokens/s is labelled with where that peak came from (the catalog, a profile, the key, or this
    machine's kept measurement), not with the key it is passed through."""
    hardware, source = plan_check.measured_hardware(device_config, rt.device)
    plan = make_plan(replaced(device_config, hardware))
    plan["hardware"]["peak_source"] = source
    return plan


@dataclass(frozen=True)
class TrainingData:
    """What a run reads: a mixture's sources (data/mixture.py), each with its opened data, or data.dir's prepared
    data; neither with a loader of its own."""

    mixture: list[dict] | None
    data: PreparedData | None

    def prepared(self) -> list[PreparedData]:
        """The prepared directories a run reads: data.dir's, or each mixture source's (none with a loader of its
        own)."""
        return [self.data] if self.data is not None else [s["data"] for s in self.mixture or []]


def open_data(c: ResolvedConfig, rt: Runtime, loader: WindowSource | None) -> TrainingData:
    """The run's data, opened and checked (each split holds a validation batch)."""
    from ..data.loader import open_training_data
    from ..data.mixture import open_mixture
    from ..data.windows import SequentialWindows

    t = c.train
    mixture = (
        open_mixture(mixture_sources(c.data), c.data.verify, c.model.vocab_size)
        if loader is None and c.data.mixture
        else None
    )
    data = None
    if loader is None and not mixture:
        assert c.data.dir is not None  # check_trainable(needs_data=True) refused a run without it
        data = open_training_data(c.data.dir, c.data.verify, c.model.vocab_size)
    opened = TrainingData(mixture, data)
    for prepared in opened.prepared():
        SequentialWindows(prepared, "val", t.seq_len, rank=rt.data_rank, world_size=rt.data_size)  # enough val?
    return opened


@dataclass(frozen=True)
class ClaimedRunDir:
    """The run directory, once this run holds it."""

    resume_from: Path | None  # the checkpoint this run resumes from
    changes: list[dict]  # the events of what the resume changes (a stage of another seq_len, other settings)
    history_aside: Path | None  # where an earlier run's history without a checkpoint was moved


def claim_run_dir(directory: RunDir, c: ResolvedConfig, rt: Runtime, quiet: bool) -> ClaimedRunDir:
    """One trainer per run directory, before any write: where it resumes from, what the resume changes, and an
    earlier run's leftovers set aside."""
    from ..distributed.runtime import barrier, first_of_ranks

    if rt.is_main and not quiet:
        directory.lock()
    if c.run.resume == "never" and not quiet:
        directory.check_new_run()
    resume_from, corrupt = None, []
    if c.run.resume == "auto":  # each rank hashes its share of each checkpoint's files, all take one verdict
        share = (rt.rank, rt.world_size)
        resume_from, corrupt = resume_point(directory.path, share, lambda problem: first_of_ranks(problem, rt))
    changes = []
    if resume_from is not None:
        check_resume_compatible(resume_from, c)
        changes = [e for e in (stage_change(resume_from, c), settings_change(resume_from, c)) if e]
    barrier(rt)  # every rank has verified before rank 0 renames anything
    history_aside = None
    if rt.is_main and not quiet:
        directory.set_aside_corrupt(corrupt)
        history_aside = directory.set_aside_history()  # an earlier run's is not this run's
    return ClaimedRunDir(resume_from, changes, history_aside)


@dataclass(frozen=True)
class Staged:
    """The config this process trains and the resume's change events, once a new stage's length is known."""

    config: ResolvedConfig
    changes: list[dict]


def staged(c: ResolvedConfig, resume_from: Path | None, changes: list[dict], saved: dict) -> Staged:
    """A new stage's length (train.stage_tokens) made the run's own (its train.max_steps), said in its
    stage_changed event, or refused in one line where the stage would train nothing or the key stands outside a
    stage (checkpoint/compatibility.stage_length)."""
    stage = next((e for e in changes if e["event"] == "stage_changed"), None)
    total_steps = training_length(c, count_params(c.model).active)["steps"]
    length = stage_length(resume_from or "", c, stage, saved, total_steps)
    if not length:
        return Staged(c, changes)
    assert stage is not None  # stage_length gives a length to a new stage only
    staged_config = replaced(c, length)
    said = {**stage, "stage_tokens": c.train.stage_tokens, "ends_at_step": staged_config.train.max_steps}
    return Staged(staged_config, [said if e is stage else e for e in changes])


@dataclass(frozen=True)
class TrainableModel:
    documents: Documents | None  # train.document_masking: the documents of a window (model/documents.py)
    attention_kernels: Callable[[], AbstractContextManager]  # entered by each step, not for good
    engine: Parallelized  # the model made trainable here, with its optimizer


def trainable_model(c: ResolvedConfig, rt: Runtime, opened: list[PreparedData]) -> TrainableModel:
    """The model built and made trainable on this process layout, with the documents of a window and the
    attention kernels its steps run."""
    from ..distributed.parallelize import parallelize
    from ..model import build_model

    t = c.train
    # The documents of a window (train.document_masking): their <eos> id, checked against each offset index.
    documents = documents_of_run(c.model, t, rt.device, opened[0].eos_id if opened else None)
    if documents is not None:
        for data in opened:
            for split in ("train", "val"):
                check_document_index(data, split)
    if rt.device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # fp32 matmuls at TF32 speed, as the plan assumes
    attention_kernels = kernel_context(rt.device, t.precision, rank_kv_heads(c))  # entered by each step, not for good

    # FSDP and tensor parallelism materialise each rank's shard only, a pipeline stage its own layers only.
    on_meta = (c.parallel.fsdp or c.parallel.tensor > 1 or c.parallel.pipeline > 1) and not c.model.init_from
    model = build_model(
        c.model,
        attention=t.attention,
        device="meta" if on_meta else rt.device,
        seed=t.seed,
        loss=t.loss,
        loss_chunk_tokens=t.loss_chunk_tokens,
        documents=documents,
    )
    if half_residual_enabled(t, rt.device.type):  # Megatron's bf16 residual stream
        model.residual_dtype = half_dtype(t.precision)
    if c.model.init_from:
        from ..model.hf import load_hf_into

        load_hf_into(model, c.model.init_from)
    engine = parallelize(model, c, rt)
    # The weights have their own generators; the global one drives dropout, whose masks must differ
    # between data-parallel ranks as they would between the micro-batches of one process.
    torch.manual_seed(t.seed + rt.data_rank)
    return TrainableModel(documents, attention_kernels, engine)


def window_source(c: ResolvedConfig, rt: Runtime, opened: TrainingData, loader: WindowSource | None) -> WindowSource:
    """What the batches are read from: a loader of its own, a mixture's windows by weight, or data.dir's."""
    from ..data.mixture import MixtureWindows
    from ..data.windows import RandomWindows

    t, mixture, data = c.train, opened.mixture, opened.data
    if mixture:
        return MixtureWindows(mixture, t.seq_len, seed=t.seed, rank=rt.data_rank, world_size=rt.data_size)
    if loader is not None:
        return loader
    assert data is not None  # open_data opened data.dir: neither a loader nor a mixture
    return RandomWindows(data, "train", t.seq_len, seed=t.seed, rank=rt.data_rank, world_size=rt.data_size)
