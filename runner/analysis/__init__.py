"""Reading runs back: tidy DataFrames (``load``), pictures (``plots``, ``gradcam``), the HTML report and
the TensorBoard export. Analysis reads run directories only; it never re-runs anything.

``runner.analysis.load_stats`` and the other names below are imported when first used, so that
importing one module of the package (the summary a run prints when it ends) imports no pandas.
"""
import importlib

#: The module holding each name ``runner.analysis`` gives.
_HELD_BY = {**dict.fromkeys(["abnormal", "config_of", "config_path", "dead_units", "failed_jobs", "label_of",
                             "load_stats", "load_steps", "load_tensors", "override_columns", "overrides_of",
                             "per_layer", "run_dirs", "sweep_state"], "runner.analysis.load"),
            "top_units": "runner.analysis.units"}
__all__ = sorted(_HELD_BY)


def __getattr__(name: str):
    if name not in _HELD_BY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HELD_BY[name]), name)
