"""pretrain: plan, prepare, train and measure LLM pretraining runs.

The package root stays light (no torch import): heavy entry points are imported on first use.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what __getattr__ hands out, named for the type checker without importing torch at runtime
    from .checkpoint.contents import load_model
    from .config import load_config
    from .plan import make_plan

__version__ = "0.1.0"

__all__ = ["__version__", "load_config", "make_plan", "load_model"]


def __getattr__(name: str) -> object:
    if name == "load_config":
        from .config import load_config

        return load_config
    if name == "make_plan":
        from .plan import make_plan

        return make_plan
    if name == "load_model":
        from .checkpoint.contents import load_model

        return load_model
    raise AttributeError(f"module 'pretrain' has no attribute {name!r}")
