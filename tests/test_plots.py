"""Pictures: valid PNGs of the promised size showing the data they were given; Grad-CAM against plain PyTorch."""
from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision
from PIL import Image

import runner.analysis as analysis
from conftest import cli, make_config, run, seeded_batch
from runner.analysis import plots
from runner.cli.execute import EXIT_CONFIG_ERROR, execute
from runner.analysis.gradcam import grad_cam, grad_cam_of_run
from runner.sources.models import ConvNet

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
    assert png_size(plots.png_bytes(fig)) == (800, 840)  # 8 x 8 one-inch cells + title band, 100 dpi
    images = [ax.images[0].get_array() for ax in fig.axes if ax.images]
    assert len(images) == 64
    np.testing.assert_array_equal(images[5], conv1[0, 5])  # sample 0, channel 5, in reading order


def test_feature_maps_of_few_channels_uses_fewer_rows(run_with):
    run_dir = run_with("model=convnet", "loss=none", "hooks=extract", "hooks.extract.layers=conv")
    fig = plots.feature_maps(analysis.load_tensors(run_dir).tensor.iloc[0])  # [1, 10, 4, 4]
    assert png_size(plots.png_bytes(fig)) == (800, 240)
    assert sum(bool(ax.images) for ax in fig.axes) == 10


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
    assert grad_spread.get_yscale() == "log" and grad_mean.get_yscale() == "linear"


def test_compare_runs_draws_one_line_per_job(tmp_path):
    for i, bound in enumerate((1.0, 0.001)):
        overrides = ["model=convnet", "hooks=clip", f"hooks.clip.max={bound}", "hooks.clip.min=null", "steps=2"]
        run(make_config(*overrides), tmp_path / str(i), overrides)
    stats = analysis.load_stats(tmp_path)
    fig = plots.compare_runs(stats, stat="l2", kind="param_grad")
    assert png_size(plots.png_bytes(fig)) == (1000, 500)
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.lines] == ["hooks.clip.max=1.0", "hooks.clip.max=0.001"]
    for line, (_, job) in zip(ax.lines, stats.groupby("run_dir", sort=False)):
        np.testing.assert_array_equal(line.get_ydata(), analysis.per_layer(job, "param_grad")["l2"])
    fig = plots.loss_curves(analysis.load_steps(tmp_path))
    assert png_size(plots.png_bytes(fig)) == (800, 400) and len(fig.axes[0].lines) == 2


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


def test_plots_switch_writes_pngs_into_the_run_directory(tmp_path, capsys):
    overrides = ["model=convnet", "data=image", f"data.path={HOUSE}", "data.resize=8", "data.crop=8",
                 "loss=class_score", "hooks=[gradcam,stats]", "hooks.gradcam.layers=conv",
                 "plots=[gradient_flow,feature_maps,grad_cam]"]
    execute(make_config(*overrides), tmp_path, overrides)
    sizes = {p.name: png_size(p.read_bytes()) for p in tmp_path.glob("*.png")}
    assert sizes == {"gradient_flow.png": (1200, 640), "feature_maps_conv.png": (800, 240),
                     "grad_cam_conv.png": (900, 340)}
    assert f"wrote {tmp_path / 'grad_cam_conv.png'}" in capsys.readouterr().out


def test_display_images_undo_the_normalisation():
    cfg = make_config("model=convnet", "data=image", f"data.path={HOUSE}", "data.resize=224", "data.crop=224")
    shown = plots.display_images(cfg)
    with Image.open(HOUSE) as img:
        original = np.asarray(img.convert("RGB"), dtype=np.float32) / 255
    assert shown.shape == (1, 224, 224, 3)
    np.testing.assert_allclose(shown[0], original, atol=1e-5)


@pytest.mark.parametrize("plot_overrides, message", [
    (["hooks=stats", "plots=[gradient_flw]"],
     "plots[0]: unknown plot 'gradient_flw'; valid: feature_maps, grad_cam, gradient_flow; did you mean 'gradient_flow'?"),
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
