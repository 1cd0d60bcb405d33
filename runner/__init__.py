"""Declarative PyTorch hook experiments: ``python -m runner``, ``runner.attach``, ``runner.analysis``."""


def __getattr__(name: str):
    # ``runner.analysis`` without importing pandas, ``runner.attach`` without torch, at CLI start-up.
    import importlib

    if name == "analysis":
        return importlib.import_module("runner.analysis")
    if name == "attach":
        return importlib.import_module("runner.engine.attach").attach
    raise AttributeError(f"module 'runner' has no attribute {name!r}")
