"""Give a run what the writer stores only when ``plots=[grad_cam]`` is asked for: the model input as
``tensors.parquet`` rows of kind ``model_input`` (and the resolved ``config.yaml`` every run has)."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from omegaconf import OmegaConf

from runner.sources.data import DataSource


def model_input(cfg, step: int = 0) -> torch.Tensor:
    """The batch the run fed the model at ``step``, from the same data pipeline and seed."""
    source = DataSource(cfg.data, cfg.model).batches(int(cfg.seed), torch.device("cpu"))
    for _ in range(step + 1):
        x = next(source).x.detach()
    return x


def store_model_input(run_dir: Path, cfg) -> Path:
    """Append step 0's model input to ``run_dir/tensors.parquet`` and save ``config.yaml``, unless present."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    path = run_dir / "tensors.parquet"
    table = pq.read_table(path)
    if "model_input" in table["kind"].to_pylist():
        return path
    x = model_input(cfg)
    values, shape = ("tensor_values", "tensor_shape") if "tensor_values" in table.column_names else ("values", "shape")
    row = {"step": [0], "call": [0], "hook": ["(input)"], "layer": [""], "phase": ["forward"], "kind": ["model_input"],
           "slot": ["0"], shape: [list(x.shape)], "dtype": ["float32"], "numel": [x.numel()],
           values: [x.flatten().tolist()]}
    if "canonical" in table.column_names:  # the row's name in a transformer family's vocabulary: none for an input
        row["canonical"] = [None]
    pq.write_table(pa.concat_tables([table, pa.table(row, schema=table.schema)]), path)
    return path
