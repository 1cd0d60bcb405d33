"""Pictures: valid PNGs of the promised size showing the data they were given; Grad-CAM against plain PyTorch."""
from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
import torchvision
from PIL import Image

import runner.analysis as analysis
from conftest import cli, make_config, run, seeded_batch
from runner.analysis import plots
from runner.cli.execute import EXIT_CONFIG_ERROR, execute
from runner.analysis.gradcam import grad_cam, grad_cam_of_run, model_input_images
from runner.sources.models import ConvNet
from stored_input import model_input as stored_model_input, store_model_input

pytestmark = pytest.mark.statistics

ROOT = Path(__file__).resolve().parents[1]
HOUSE = str(ROOT / "assets" / "house.png")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height of a PNG, after checking it is one and decodes completely."""
    assert data.startswith(PNG_SIGNATURE)
    with Image.open(io.BytesIO(data)) as img:
        assert img.format == "PNG"
        img.load()
        return img.size


def test_feature_maps_is_the_8x8_grid_of_sample_0(run_with):
    run_dir = run_with("model=resnet18", "data.shape=[2,3,32,32]", "loss=none", "hooks=extract",
                       "hooks.extract.layers=conv1")
    conv1 = analysis.load_tensors(run_dir).tensor.iloc[0]
    fig = plots.feature_maps(conv1, title="conv1")
    assert png_size(plots.png_bytes(fig)) == (880, 840)  # 8 x 8 one-inch cells + colour bar + title band, 100 dpi
    grid_ax, bar = fig.axes
    grid = grid_ax.images[0].get_array()
    _, (cell_h, cell_w) = plots.mosaic(conv1[0], 8)
    h, w = conv1.shape[2:]
    band = cell_h - h
    for channel in (0, 5, 63):  # sample 0, channel c, in reading order
        row, col = divmod(channel, 8)
        np.testing.assert_array_equal(grid[row * cell_h + band:(row + 1) * cell_h, col * cell_w:col * cell_w + w],
                                      conv1[0, channel])
    assert int(np.isfinite(grid).sum()) == conv1[0].size  # nothing else drawn in the grid
    assert [t.get_text() for t in grid_ax.texts] == [f"ch {c}" for c in range(64)]
    assert grid_ax.images[0].get_clim() == (conv1[0].min(), conv1[0].max())  # one scale, shown by the bar
    assert bar.get_ylabel() == "activation"


def test_feature_maps_of_few_channels_uses_fewer_rows(run_with):
    run_dir = run_with("model=convnet", "loss=none", "hooks=extract", "hooks.extract.layers=conv")
    fig = plots.feature_maps(analysis.load_tensors(run_dir).tensor.iloc[0])  # [1, 10, 4, 4]
    assert png_size(plots.png_bytes(fig)) == (880, 240)
    assert len(fig.axes[0].texts) == 10


def test_gradient_flow_plots_each_kind_across_depth(run_with):
    run_dir = run_with("model=convnet", "hooks=[stats,clip]")
    stats = analysis.load_stats(run_dir)
    fig = plots.gradient_flow(stats)
    assert png_size(plots.png_bytes(fig)) == (1200, 960)  # 3 kinds x 3.2 inches
    out_mean, (grad_mean, grad_spread) = fig.axes[0], fig.axes[2:4]
    assert [t.get_text() for t in out_mean.get_xticklabels()] == ["conv", "relu", "flatten", "fc"]
    rows = analysis.per_layer(stats, "grad_output")
    np.testing.assert_array_equal(grad_mean.lines[0].get_ydata(), rows["mean"])
    np.testing.assert_array_equal(grad_spread.lines[1].get_ydata(), rows["abs_max"])
    assert grad_spread.get_yscale() == "log" and grad_mean.get_yscale() == "symlog"


def test_gradient_flow_of_a_deep_model_ticks_each_block_once(run_with):
    run_dir = run_with("model=resnet18", "data.shape=[2,3,32,32]", "hooks=stats")
    stats = analysis.load_stats(run_dir)
    fig = plots.gradient_flow(stats)
    labels = analysis.per_layer(stats, "output").label.tolist()
    assert len(labels) > 40  # too many to print one per tick
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    where = fig.axes[0].get_xticks().tolist()
    blocks = [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]
    assert ticks[0] == "conv1" and ticks[-1] in ("avgpool", "fc") and set(blocks) <= set(ticks)
    for tick, at in zip(ticks, where):  # each tick where its block starts
        assert labels[int(at)] == tick or labels[int(at)].startswith(tick + ".")
        assert int(at) == 0 or plots.block_of(labels[int(at) - 1]) != tick
    assert min(b - a for a, b in zip(where, where[1:])) >= len(labels) / 40  # never two labels on top of each other


def test_gradient_flow_of_a_run_without_statistics_says_so(run_with):
    run_dir = run_with("model=convnet", "hooks=none")
    with pytest.raises(ValueError, match="recorded no activation or gradient statistics"):
        plots.gradient_flow(analysis.load_stats(run_dir))
    figures, notes = plots.run_figures(run_dir, plots.PLOTS)
    assert figures == [] and notes == [  # nothing of the logit lens: the run had no lens entry to draw
        "gradient_flow: the run recorded no activation or gradient statistics (record some with hooks=stats)",
        "feature_maps: no kept 4-D output at step 0",
        "grad_cam: no layer with a kept 4-D output and output gradient at step 0"]


def test_compare_runs_draws_one_line_per_job_and_a_panel_per_parameter_kind(tmp_path):
    for i, bound in enumerate((1.0, 0.001)):
        overrides = ["model=convnet", "hooks=clip", f"hooks.clip.max={bound}", "hooks.clip.min=null", "steps=2"]
        run(make_config(*overrides), tmp_path / str(i), overrides)
    stats = analysis.load_stats(tmp_path)
    fig = plots.compare_runs(stats, stat="l2", kind="param_grad")
    assert png_size(plots.png_bytes(fig)) == (1200, 740)  # 1 + 2 panels x 3.2 inches
    weight, bias = fig.axes[:2]
    assert [ax.get_title(loc="left") for ax in (weight, bias)] == ["weight gradients, kernels and matrices",
                                                                   "bias gradients, vectors"]
    # lines in job order, as the values were given
    assert [line.get_label() for line in weight.lines] == ["hooks.clip.max=1.0", "hooks.clip.max=0.001"]
    for ax, slot in ((weight, "weight"), (bias, "bias")):
        assert [t.get_text() for t in ax.get_xticklabels()] == ["conv", "fc"]
        for line, directory in zip(ax.lines, ("0", "1")):
            job = analysis.per_layer(stats[stats.run_dir == str(tmp_path / directory)], "param_grad")
            np.testing.assert_array_equal(line.get_ydata(), job[job.slot == slot]["l2"])
    fig = plots.loss_curves(analysis.load_steps(tmp_path))
    assert png_size(plots.png_bytes(fig)) == (800, 400) and len(fig.axes[0].lines) == 2


def test_loss_curves_draw_train_and_eval_apart(run_with):
    run_dir = run_with("model=convnet", "data=fake", "loss=cross_entropy", "optimizer=sgd", "steps=4",
                       "eval_every=2", "hooks=none")
    steps = analysis.load_steps(run_dir)
    ax = plots.loss_curves(steps).axes[0]
    train, evals = ax.lines
    assert (train.get_linestyle(), evals.get_linestyle()) == ("-", "--")
    np.testing.assert_array_equal(train.get_ydata(), steps[steps.split == "train"].loss)
    np.testing.assert_array_equal(evals.get_xdata(), steps[steps.split == "eval"].step)


def _hand_grad_cam(shape, target_class, layer="layer3"):
    """Grad-CAM in plain PyTorch: a forward hook and a full backward hook on ``layer`` of resnet18."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18()
    seen = {}
    module = getattr(model, layer)
    module.register_forward_hook(lambda _m, _i, out: seen.__setitem__("a", out.detach().clone()))
    module.register_full_backward_hook(lambda _m, _gi, go: seen.__setitem__("g", go[0].detach().clone()))
    out = model(seeded_batch(shape))
    out[:, target_class].sum().backward()
    cam = (seen["g"].mean(dim=(2, 3))[:, :, None, None] * seen["a"]).sum(1, keepdim=True).clamp(min=0)
    cam = F.interpolate(cam, size=shape[2:], mode="bilinear", align_corners=False)[:, 0]
    flat = cam.flatten(1)
    flat = (flat - flat.min(1, keepdim=True).values) / (flat.max(1, keepdim=True).values - flat.min(1, keepdim=True).values)
    return flat.view_as(cam).numpy(), out[:, target_class].sum().item()


def test_grad_cam_matches_hand_written_grad_cam(run_with):
    shape = [2, 3, 64, 64]
    run_dir = run_with("model=resnet18", "data.shape=[2,3,64,64]", "loss=class_score", "loss.target_class=7",
                       "hooks=gradcam", "hooks.gradcam.layers=layer3")
    expected, loss = _hand_grad_cam(shape, 7)
    cams = grad_cam_of_run(run_dir, "layer3", (64, 64))
    assert cams.shape == (2, 64, 64)
    np.testing.assert_allclose(cams, expected, atol=1e-5)
    assert analysis.load_steps(run_dir).loss.iloc[0] == pytest.approx(loss, rel=1e-6)


def test_class_score_without_target_explains_the_top_class(run_with):
    run_dir = run_with("model=convnet", "loss=class_score", "hooks=stats", "hooks.stats.layers=fc")
    fc = analysis.load_stats(run_dir, filters=[("layer", "=", "fc"), ("kind", "=", "grad_output")]).iloc[0]
    assert (fc["min"], fc["max"], fc["l2"]) == (0.0, 1.0, 1.0)  # d(out[argmax])/d out is one-hot
    torch.manual_seed(0)
    out = ConvNet()(seeded_batch([1, 3, 8, 8]))
    assert analysis.load_steps(run_dir).loss.iloc[0] == pytest.approx(out.max().item(), rel=1e-6)


def test_grad_cam_of_a_constant_map_is_zero():
    a = np.ones((1, 2, 3, 3), np.float32)
    assert not grad_cam(a, -a, (6, 6)).any()  # only negative evidence: relu leaves nothing


def test_grad_cam_before_a_training_batchnorm_is_zero_not_rounding_noise():
    """A conv feeding a training-mode BatchNorm, one image (as ``data=image``): its output gradient sums to
    zero per channel (every channel's mean gradient below 1e-6 of the gradient's mean size: float32 rounding),
    so Grad-CAM has no evidence and the map is all 0. Those float32 means, scaled to [0, 1], drew a map."""
    torch.manual_seed(0)
    conv, bn = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)
    head = torch.nn.Linear(8 * 14 * 14, 4)
    x = torch.randn(1, 3, 16, 16)
    a = conv(x)
    a.retain_grad()
    head(bn(a).flatten(1))[:, 2].sum().backward()
    g64 = a.grad.double()
    assert (g64.mean(dim=(2, 3)).abs() < 1e-6 * g64.abs().mean()).all()
    assert not grad_cam(a.detach().numpy(), a.grad.numpy(), (16, 16)).any()


def test_plots_switch_writes_pngs_into_the_run_directory(tmp_path, capsys):
    overrides = ["model=convnet", "data=image", f"data.path={HOUSE}", "data.resize=8", "data.crop=8",
                 "loss=class_score", "hooks=[gradcam,stats]", "hooks.gradcam.layers=conv",
                 "plots=[gradient_flow,feature_maps,grad_cam]"]
    execute(make_config(*overrides), tmp_path, overrides)
    sizes = {p.name: png_size(p.read_bytes()) for p in tmp_path.glob("*.png")}
    assert sizes == {"gradient_flow.png": (1200, 640), "feature_maps_conv.png": (880, 240),
                     "grad_cam_conv.png": (1000, 360)}
    assert f"wrote {tmp_path / 'grad_cam_conv.png'}" in capsys.readouterr().out


def _grad_cam_run(run_with, *extra):
    overrides = ["model=convnet", "data=image", f"data.path={HOUSE}", "data.resize=8", "data.crop=8",
                 "loss=class_score", "hooks=gradcam", "hooks.gradcam.layers=conv", *extra]
    return run_with(*overrides), make_config(*overrides)


def test_grad_cam_reads_the_stored_input_and_undoes_the_normalisation(run_with, tmp_path):
    run_dir, cfg = _grad_cam_run(run_with, "loss.target_class=3")
    store_model_input(run_dir, cfg)
    moved = tmp_path / "moved"
    shutil.copytree(run_dir, moved)  # the image file and the data pipeline are not needed any more
    tensors = analysis.load_tensors(moved)
    shown = model_input_images(tensors, plots.run_config(moved))
    mean, std = torch.tensor(cfg.data.mean).view(1, 3, 1, 1), torch.tensor(cfg.data.std).view(1, 3, 1, 1)
    expected = (stored_model_input(cfg) * std + mean).clamp(0, 1).permute(0, 2, 3, 1).numpy()
    assert shown.shape == (1, 8, 8, 3)
    np.testing.assert_allclose(shown, expected, atol=1e-6)
    figures, notes = plots.run_figures(moved, ["grad_cam"])
    (name, fig), = figures
    assert name == "grad_cam_conv.png" and notes == []
    assert fig.get_suptitle() == "Grad-CAM of conv for class 3 (sample 0, step 0)"
    np.testing.assert_allclose(fig.axes[0].images[0].get_array(), expected[0], atol=1e-6)
    assert any(ax.get_ylabel() == "relevance (scaled to [0, 1])" for ax in fig.axes)  # the colour bar


def test_grad_cam_without_a_stored_input_says_so_in_the_picture(run_with):
    run_dir, cfg = _grad_cam_run(run_with)
    store_model_input(run_dir, cfg)  # then take the input out again: a run that did not store it
    keep = pq.read_table(run_dir / "tensors.parquet").filter(pc.field("kind") != "model_input")
    pq.write_table(keep, run_dir / "tensors.parquet")
    (name, fig), = plots.run_figures(run_dir, ["grad_cam"])[0]
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert texts == ["the run stored\nno model input"] * 2
    assert re.fullmatch(r"Grad-CAM of conv for class [0-4] \(sample 0, step 0\)", fig.get_suptitle())


@pytest.mark.parametrize("plot_overrides, message", [
    (["hooks=stats", "plots=[gradient_flw]"],
     "plots[0]: unknown plot 'gradient_flw'; valid: attribution_graph, feature_maps, grad_cam, gradient_flow, "
     "logit_lens; did you mean 'gradient_flow'?"),
    (["hooks=stats", "plots=[feature_maps]"], "plots: 'feature_maps' needs a kept conv output"),
    (["hooks=extract", "loss=none", "plots=[grad_cam]"], "plots: 'grad_cam' needs a conv layer's kept output"),
])
def test_plots_mistakes_fail_before_the_run(tmp_path, capsys, plot_overrides, message):
    overrides = ["model=convnet", *plot_overrides]
    with pytest.raises(SystemExit) as exit_info:
        cli(overrides, tmp_path / "run")
    assert exit_info.value.code == EXIT_CONFIG_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {message}")
    assert not (tmp_path / "run").exists()


def test_running_does_not_import_the_picture_packages():
    code = ("import sys, runner.__main__, runner.analysis; "
            "print(sorted(m for m in ('matplotlib', 'tensorboard') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("target, message", [
    ("-1", "loss.target_class: -1 must be a class index >= 0 or null"),
    ("5", "loss.target_class: 5 is out of range for 5 classes"),
])
def test_class_score_target_mistakes_are_one_line(tmp_path, capsys, target, message):
    overrides = ["model=convnet", "loss=class_score", f"loss.target_class={target}", "hooks=stats"]
    with pytest.raises(SystemExit) as exit_info:
        execute(make_config(*overrides), tmp_path, overrides)
    assert exit_info.value.code == EXIT_CONFIG_ERROR
    assert capsys.readouterr().err.strip() == f"error: {message}"
    assert not list(tmp_path.glob("*.parquet")) and not list(tmp_path.glob(".*tmp*"))


def test_grad_cam_title_names_the_class_as_the_weights_do():
    from omegaconf import OmegaConf

    from runner.analysis.gradcam import explained_class

    categories = torchvision.models.ResNet18_Weights.DEFAULT.meta["categories"]  # read, nothing downloaded
    trained = OmegaConf.create({"loss": {"name": "class_score", "target_class": 3},
                                "model": {"name": "resnet18", "weights": "DEFAULT"}})
    assert explained_class(trained) == f"class 3 ({categories[3]})"
    trained.model.weights = None
    assert explained_class(trained) == "class 3"
    trained.loss.target_class = None
    assert explained_class(trained) == "each sample's top-scoring class"


def test_loss_curves_draw_a_panel_per_metric_of_the_splits_asked_for(run_with, tmp_path):
    for hooks in ("none", "clip"):
        run_with("model=digits_cnn", "data=digits", "loss=cross_entropy", "optimizer=sgd", "steps=4", "eval_every=2",
                 f"hooks={hooks}")
    steps = analysis.load_steps(tmp_path)
    fig = plots.loss_curves(steps, by=["hooks"], metrics=("loss", "accuracy"), splits=("eval",))
    assert png_size(plots.png_bytes(fig)) == (1100, 400)
    for ax, metric in zip(fig.axes, ("loss", "accuracy")):
        assert ax.get_ylabel() == f"{metric} (held out)"
        assert [line.get_label() for line in ax.lines] == ["hooks=none", "hooks=clip"]  # the order they ran in
        for line, hooks in zip(ax.lines, ("none", "clip")):
            held = steps[(steps.hooks == hooks) & (steps.split == "eval")]
            np.testing.assert_array_equal(line.get_xdata(), held.step)
            np.testing.assert_array_equal(line.get_ydata(), held[metric])
