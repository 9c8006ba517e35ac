"""Export a run (its newest checkpoint, or a given one, sharded or not) as a Hugging Face model directory.

  pretrain export RUN_DIR --to hf OUT_DIR [--dtype fp32|bf16] [--overwrite]

OUT_DIR holds model.safetensors, config.json, generation_config.json and the tokenizer of the run's data
directory; `transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)` loads it (LlamaForCausalLM,
Qwen2ForCausalLM when the q/k/v projections have biases, or GPT2LMHeadModel).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from ..model.transformer import Transformer

HELP = "export a checkpoint as a Hugging Face model directory (safetensors, config, tokenizer)"


def add_arguments(p):
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (newest checkpoint) or one checkpoint")
    p.add_argument("--to", choices=["hf"], default="hf", help="format (hf: Hugging Face transformers)")
    p.add_argument("out_dir", metavar="OUT_DIR", help="directory to write (refused if it exists, unless --overwrite)")
    p.add_argument(
        "--dtype",
        choices=["fp32", "bf16"],
        default=None,
        help="dtype of the written weights (default fp32; bf16 for a train.precision=fp8 run)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")


def tokenizer_of(model):
    """The tokenizer copy inside the run's prepared data directory, if it is still there."""
    from ..data.tokenizer import data_tokenizer

    return data_tokenizer(model.training_config.data)


def run_dir_of(source) -> Path:
    """The run directory of RUN_DIR, or of one checkpoint (RUN/checkpoints/step_N) given instead."""
    source = Path(source)
    return source.parent.parent if source.parent.name == "checkpoints" else source


def check_no_overlap(out_dir, sources: dict) -> None:
    """Refuse an OUT_DIR that is, contains or lies inside one of `sources` (what -> path): writing it, and with
    --overwrite replacing it, would delete what the export reads (the run, its checkpoints, its dataset)."""
    from ..errors import UsageError

    out = Path(out_dir).resolve()
    for what, source in sources.items():
        source = Path(source).resolve()
        if out == source or source in out.parents or out in source.parents:
            raise UsageError(
                f"OUT_DIR {out_dir} overlaps the {what} {source}, which the export reads; choose a directory outside it"
            )


def _os_error(e: Exception) -> OSError:
    """The OSError inside an error: safetensors reports a failed write as "I/O error: ... (os error 28)"."""
    import os
    import re

    if isinstance(e, OSError):
        return e
    found = re.search(r"\(os error (\d+)\)", str(e))
    number = int(found.group(1)) if found else 0
    return OSError(number, os.strerror(number) if number else str(e))


def run(args) -> int:
    from safetensors import SafetensorError

    from ..checkpoint.contents import load_model
    from ..files import display_path, write_error
    from ..precision import TORCH_DTYPES
    from .hf import export_hf

    check_no_overlap(args.out_dir, {"run directory": run_dir_of(args.run_dir)})
    model = cast("Transformer", load_model(args.run_dir))  # load_model says nn.Module
    data = model.training_config.data
    check_no_overlap(
        args.out_dir,
        {
            **({"data directory": data.dir} if data.dir else {}),
            **{f"data.mixture source {e['dir']}": e["dir"] for e in data.mixture},
        },
    )
    tokenizer = tokenizer_of(model)
    # float8 is how an fp8 run multiplied, not a format to ship: its model goes out in bf16, as it was
    # autocast outside the float8 linears.
    default = "bf16" if model.training_config.train.precision == "fp8" else "fp32"
    dtype = TORCH_DTYPES[args.dtype or default]
    try:
        out = export_hf(model, args.out_dir, tokenizer_dir=tokenizer, dtype=dtype, overwrite=args.overwrite)
    except (OSError, SafetensorError) as e:  # export_hf removed its temporary directory; an old OUT_DIR is as it was
        error = write_error(_os_error(e), f"OUT_DIR {display_path(args.out_dir)}", "the export")
        if error is None:
            raise
        raise error from None
    print(f"wrote {out}" + ("" if tokenizer else " (no tokenizer: the run's data directory is gone)"))
    return 0
