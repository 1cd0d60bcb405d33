"""Pictures that say what they show: the run's model and entries, each line's override, one axis per model."""
from __future__ import annotations

from pathlib import Path

import torch

import runner.analysis as analysis
from conftest import make_config, run
from runner.analysis import plots

ROOT = Path(__file__).resolve().parents[1]


def test_a_run_s_gradient_flow_title_names_the_model_and_entries(tmp_path):
    overrides = ["model=convnet", "hooks=[clip,stats]"]
    run_dir = run(make_config(*overrides), tmp_path / "run", overrides)
    (name, figure), = plots.run_figures(run_dir, ["gradient_flow"])[0]
    assert figure.get_suptitle() == "convnet, hooks clip (clamp), stats: per-layer statistics across depth"


def _sweep(tmp_path, jobs):
    for num, overrides in enumerate(jobs):
        run(make_config(*overrides), tmp_path / "sweep" / str(num), overrides)
    return tmp_path / "sweep"


def test_a_sweep_legend_names_each_line_s_override_even_when_the_frame_lost_its_columns(tmp_path):
    sweep = _sweep(tmp_path, [["model=convnet", "hooks=stats", f"seed={seed}"] for seed in (0, 1)])
    stats = analysis.load_stats(sweep)
    bare = stats.drop(columns=["seed"])
    bare.attrs = {}
    for frame, title in ((stats, "seed"), (bare, "overrides")):
        figure = plots.compare_runs(frame, kind="grad_output")
        legend = figure.legends[0]
        assert legend.get_title().get_text() == title
        labels = [t.get_text() for t in legend.get_texts()]
        assert labels == (["seed=0", "seed=1"] if title == "seed" else
                          ["model=convnet hooks=stats seed=0", "model=convnet hooks=stats seed=1"])


def test_layers_of_different_models_get_their_own_panels(tmp_path):
    sweep = _sweep(tmp_path, [["model=convnet", "hooks=stats"], ["model=mlp", "hooks=stats"]])
    figure = plots.compare_runs(analysis.load_stats(sweep), kind="grad_output")
    panels = {ax.get_title(loc="left"): [t.get_text() for t in ax.get_xticklabels()] for ax in figure.axes}
    assert set(panels) == {"model=convnet: grad_output", "model=mlp: grad_output"}
    assert panels["model=convnet: grad_output"] == ["conv", "relu", "flatten", "fc"]
    assert panels["model=mlp: grad_output"] == ["fc1", "relu", "fc2"]


def test_a_grad_cam_title_names_the_class_the_loss_chose_when_none_was_given(tmp_path):
    overrides = ["model=convnet", "data=image", f"data.path={ROOT / 'assets' / 'house.png'}", "data.resize=8",
                 "data.crop=8", "loss=class_score", "hooks=gradcam", "hooks.gradcam.layers=[conv,fc]"]
    run_dir = run(make_config(*overrides), tmp_path / "run", overrides)
    tensors = analysis.load_tensors(run_dir)
    logits = tensors[(tensors.layer == "fc") & (tensors.kind == "output") & (tensors.step == 0)].tensor.iloc[0]
    top = int(torch.from_numpy(logits).argmax(dim=1)[0])  # sample 0's top-scoring class, by hand
    (name, figure), = plots.run_figures(run_dir, ["grad_cam"])[0]
    assert name == "grad_cam_conv.png"
    assert figure.get_suptitle() == f"Grad-CAM of conv for class {top} (sample 0, step 0)"
