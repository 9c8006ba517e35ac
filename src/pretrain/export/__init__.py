"""Leaving the workbench: Hugging Face export (`pretrain.export.hf`; the import is `pretrain.model.hf`), text generation
(`pretrain.export.generate`).

Import from the submodules. This file stays empty so that the CLI's command modules in this package import
no torch, and so that `generate` names one thing (the module), not a module and a function by turns.
"""
