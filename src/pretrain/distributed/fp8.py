"""train.precision=fp8: the blocks' linears multiply in float8 through torchao's `convert_to_float8_training`
(pretrain[fp8]); everything else is bf16-mixed (fp32 master weights, autocast to bf16).

Which linears (pretrain.plan.fp8.converts, the rule the planner counts with):
  - only those inside the blocks: the output layer stays bf16 (its matmul feeds the softmax, where float8's
    3 significant bits cost the most, and torchtitan leaves it out too);
  - both dimensions multiples of 16 (float8 tensor cores need it);
  - in and out features >= train.fp8_min_features (small GEMMs gain less than the casts cost).

Recipes (torchao's names): tensorwise scales each tensor by one number (amax / e4m3's 448); under FSDP2 the
weights are all-gathered already in float8, half the bytes of bf16, their scales computed for all of them at
once after each optimizer step (`precompute_scales`: one all-reduce, where each converted linear would
all-reduce its own amax in every forward), and on GPUs so are tensor parallelism's
(pretrain.plan.fp8.float8_tensor_parallel, the rule the planner counts with). rowwise scales each row of each
operand: closer to bf16, slower casts, and its collectives stay bf16.

The weights stay plain fp32 nn.Parameters under their names (Float8Linear subclasses nn.Linear), so
checkpoints, resume and export are those of a bf16-mixed run: an exported model is bf16 and loads anywhere.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..plan.fp8 import converts, float8_tensor_parallel

if TYPE_CHECKING:
    from torch import nn

    from ..config.schema import ResolvedConfig

FIX = "pip install 'pretrain[fp8]' (torchao) or use train.precision=bf16-mixed"


def check_installed(precision: str) -> None:
    """Before any heavy work: fp8 without torchao is one line naming the extra."""
    if precision == "fp8":
        _float8()


def _float8():
    """torchao.float8, imported quietly: torchao's wheel also carries CUDA kernels (mxfp8, cutlass) that fail to
    load on a CPU-only torch, and registers an enum torch 2.13 calls deprecated; both say so on every import,
    and float8 training needs neither."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        from torchao import float8
    except ImportError as e:
        raise UsageError(f"train.precision: fp8 needs torchao, which is not installed ({e}); {FIX}") from None
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)
    return float8


def convert(model: nn.Module, config: ResolvedConfig, device_type: str) -> dict:
    """Swap the chosen linears of `model` (plain, before any wrapping or sharding) for torchao's Float8Linear;
    returns what plan_vs_run.json records: {"recipe", "linears": converted, "skipped": linears left bf16},
    "fsdp_float8_all_gather" where FSDP gathers the weights in float8, and under tensor parallelism
    "tensor_parallel": what its collectives carry, "float8" or "bf16"."""
    import torch

    float8, train = _float8(), config.train
    gather = False
    if train.fp8_recipe == "tensorwise":
        # debug.fp8_check's bf16 shadow needs each weight before its float8 cast: the all-gather stays bf16
        gather = config.parallel.fsdp and not config.debug.fp8_check
        fp8_config = float8.Float8LinearConfig(enable_fsdp_float8_all_gather=gather)
    else:
        fp8_config = float8.Float8LinearConfig.from_recipe_name(train.fp8_recipe)
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    chosen = {
        name for name, m in linears.items() if converts(name, m.in_features, m.out_features, train.fp8_min_features)
    }
    float8.convert_to_float8_training(model, config=fp8_config, module_filter_fn=lambda m, name: name in chosen)
    report = {"recipe": train.fp8_recipe, "linears": len(chosen), "skipped": len(linears) - len(chosen)}
    if train.fp8_recipe == "tensorwise" and gather:
        report["fsdp_float8_all_gather"] = True  # and its scales precomputed after each step (FSDP's engine)
    if config.parallel.tensor > 1:
        report["tensor_parallel"] = "float8" if float8_tensor_parallel(config, device_type) else "bf16"
    return report


def precompute_scales(module: nn.Module) -> None:
    """The float8 all-gather's weight scales, all in one all-reduce, after an optimizer step (torchao's
    precompute_float8_dynamic_scale_for_fsdp, as torchtitan calls it): the next forward's gathers use them."""
    _float8().precompute_float8_dynamic_scale_for_fsdp(module)
