"""Declarative PyTorch hook experiments: ``python -m runner``, ``runner.run``, ``runner.analysis``."""


def __getattr__(name: str):
    # ``runner.analysis`` without importing pandas at CLI start-up.
    if name == "analysis":
        import importlib

        return importlib.import_module("runner.analysis")
    raise AttributeError(f"module 'runner' has no attribute {name!r}")
