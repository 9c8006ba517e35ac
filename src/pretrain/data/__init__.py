"""The data stage: raw corpus -> tokenizer -> flat token files -> training windows.

`train_tokenizer` and `prepare` are what `pretrain tokenizer train` and `pretrain prepare` run;
`open_training_data` (a checked `PreparedData`), `RandomWindows` and `SequentialWindows` are what the
trainer reads. Imported lazily, so
`import pretrain.data` costs nothing (torch is imported by the windows only).
"""

_EXPORTS = {
    "train_tokenizer": ".tokenizer",
    "find_tokenizer": ".tokenizer",
    "prepare": ".preparation",
    "PreparedData": ".loader",
    "open_training_data": ".loader",
    "RandomWindows": ".windows",
    "SequentialWindows": ".windows",
    "write_sample_corpus": ".sample",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module 'pretrain.data' has no attribute {name!r}")
