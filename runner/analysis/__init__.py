"""Reading runs back: tidy DataFrames (``load``), pictures (``plots``, ``gradcam``), the HTML report and
the TensorBoard export. Analysis reads run directories only; it never re-runs anything."""
from runner.analysis.load import (abnormal, config_of, config_path, dead_units, failed_jobs, label_of, load_stats,
                                  load_steps, load_tensors, override_columns, overrides_of, per_layer, run_dirs,
                                  sweep_state)
from runner.analysis.units import top_units

__all__ = ["abnormal", "config_of", "config_path", "dead_units", "failed_jobs", "label_of", "load_stats",
           "load_steps", "load_tensors", "override_columns", "overrides_of", "per_layer", "run_dirs", "sweep_state",
           "top_units"]
