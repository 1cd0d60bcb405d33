"""What a saved picture shows, read back from its pixels, so that a test compares a picture with the data it
draws rather than with its file size: the regions painted in a colour map's colours, each decoded back to
the values in [0, 1] it was drawn from, and where a plain line colour is drawn."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from matplotlib import colormaps
from PIL import Image
from scipy import ndimage
from scipy.spatial import cKDTree

#: How far (RGB in [0, 1]) a pixel may be from its colour map's nearest colour and still be read as drawn in it:
#: PNG keeps 8 bits, and the colour maps' 256 colours are at most about 0.02 apart.
NEAR = 0.02


def pixels(path: Path) -> np.ndarray:
    """The picture's RGB pixels ``[H, W, 3]`` in [0, 1] (white where it is transparent)."""
    image = Image.open(path).convert("RGBA")
    white = Image.new("RGBA", image.size, "white")
    return np.asarray(Image.alpha_composite(white, image).convert("RGB"), dtype=np.float64) / 255


@dataclass
class Region:
    """A connected patch of pixels painted in a colour map: where it is and the values it shows."""

    top: int
    left: int
    values: np.ndarray  # [rows, columns] in [0, 1], NaN where a pixel inside is not the colour map's

    @property
    def shape(self) -> tuple[int, int]:
        return self.values.shape


def decoded(rgb: np.ndarray, cmap: str) -> np.ndarray:
    """Each pixel's value in [0, 1] under the colour map ``cmap`` (its nearest of 256 colours), NaN where no
    colour of the map is within ``NEAR``."""
    lut = colormaps[cmap](np.linspace(0, 1, 256))[:, :3]
    distance, index = cKDTree(lut).query(rgb.reshape(-1, 3))
    values = np.where(distance <= NEAR, index / 255, np.nan)
    return values.reshape(rgb.shape[:2])


def regions(rgb: np.ndarray, cmap: str, min_pixels: int = 20) -> list[Region]:
    """The patches painted in ``cmap`` (at least ``min_pixels``), top to bottom, then left to right."""
    values = decoded(rgb, cmap)
    labels, _ = ndimage.label(~np.isnan(values))
    found = []
    for index, box in enumerate(ndimage.find_objects(labels), start=1):
        inside = labels[box] == index
        if inside.sum() >= min_pixels:
            found.append(Region(box[0].start, box[1].start, np.where(inside, values[box], np.nan)))
    return sorted(found, key=lambda region: (region.top, region.left))


def resized(values: np.ndarray, shape: tuple[int, int], mode: str = "nearest") -> np.ndarray:
    """A ``[rows, columns]`` array resampled to ``shape`` (as a picture shows a map at its size in pixels)."""
    tensor = torch.as_tensor(np.asarray(values, dtype=np.float64))[None, None]
    kwargs = {} if mode == "nearest" else {"align_corners": False}
    return F.interpolate(tensor, size=shape, mode=mode, **kwargs)[0, 0].numpy()


def mean_gap(region: Region, expected: np.ndarray) -> float:
    """Mean absolute difference between what a region shows and ``expected`` values in [0, 1] of its shape."""
    return float(np.nanmean(np.abs(region.values - expected)))


def painted(rgb: np.ndarray, colour: str) -> np.ndarray:
    """Where the picture is painted in the matplotlib colour ``colour`` (``'tab:blue'``), as a boolean mask."""
    from matplotlib.colors import to_rgb

    return np.abs(rgb - np.array(to_rgb(colour))).max(-1) <= NEAR


def assert_feature_maps_show(path: Path, maps: np.ndarray) -> None:
    """``feature_maps``' picture shows each of ``maps`` (``[C, H, W]``, the kept output's sample 0) in viridis on
    one colour scale, left to right and top to bottom: each painted cell decodes to its channel (mean gap under
    0.02 of the scale, where a neighbour's channel is 0.04 or more away), and the colour bar is there."""
    painted_regions = regions(pixels(path), "viridis", min_pixels=100)
    bars = [r for r in painted_regions if r.shape[0] > 3 * r.shape[1]]
    cells = [r for r in painted_regions if r.shape[0] <= 3 * r.shape[1]]
    assert len(bars) == 1 and len(cells) == len(maps), (path.name, len(bars), len(cells))
    lo, hi = float(maps.min()), float(maps.max())
    gaps = [mean_gap(cell, resized((channel - lo) / (hi - lo), cell.shape)) for cell, channel in zip(cells, maps)]
    assert max(gaps) < 0.02, (path.name, int(np.argmax(gaps)), max(gaps))


def assert_grad_cam_shows(path: Path, image: np.ndarray, cam: np.ndarray | None) -> None:
    """``grad_cam``'s picture shows the input ``image`` (``[H, W, 3]`` in [0, 1]) in its left panel (mean gap under
    0.08; flipped upside down it is 0.2 away) and, in its middle panel, a map painted in jet: ``cam``
    (``[H, W]`` in [0, 1]) when given (mean gap under 0.02)."""
    rgb = pixels(path)
    width = rgb.shape[1]
    middle = [r for r in regions(rgb, "jet", min_pixels=1000) if width / 3 <= r.left + r.shape[1] / 2 < 2 * width / 3]
    assert middle, f"{path.name}: no map painted in jet in the middle panel"
    panel = max(middle, key=lambda r: r.values.size)
    assert min(panel.shape) > 200, (path.name, panel.shape)  # the panel's most: about 290 pixels square
    if cam is not None:
        gap = mean_gap(panel, resized(cam, panel.shape, "bilinear"))
        assert gap < 0.02, (path.name, gap)
    band = rgb[panel.top:panel.top + panel.shape[0], :panel.left]
    columns = np.flatnonzero((band < 0.97).any(-1).any(0))
    assert columns.size, f"{path.name}: the input panel is blank"
    shown = band[:, columns.min():columns.max() + 1]
    expected = np.stack([resized(image[..., c], shown.shape[:2], "bilinear") for c in range(3)], -1)
    gap = float(np.abs(shown - expected).mean())
    assert gap < 0.08, (path.name, gap)


def assert_gradient_flow_shows(path: Path, kinds: int) -> None:
    """``gradient_flow``'s picture has one 320-pixel row of panels per recorded kind; in each row, the left panel
    draws the mean (a tab:blue line across most of it), the right one the std (tab:blue) and the abs max
    (tab:orange), the abs max above the std in most columns where both are drawn (it is never below it)."""
    rgb = pixels(path)
    assert rgb.shape[0] == 320 * kinds, (rgb.shape, kinds)
    half = rgb.shape[1] // 2
    for row in range(kinds):
        band = rgb[320 * row:320 * (row + 1)]
        for side, colours in ((band[:, :half], ("tab:blue",)), (band[:, half:], ("tab:blue", "tab:orange"))):
            for colour in colours:
                columns = np.flatnonzero(painted(side, colour).any(0))
                assert columns.size and columns.max() - columns.min() > 0.6 * half, (row, colour, columns.size)
        right = band[:, half:]
        blue, orange = painted(right, "tab:blue"), painted(right, "tab:orange")
        both = blue.any(0) & orange.any(0)
        rows = np.arange(right.shape[0])[:, None]
        blue_at = np.where(blue, rows, 0).sum(0)[both] / blue.sum(0)[both]
        orange_at = np.where(orange, rows, 0).sum(0)[both] / orange.sum(0)[both]
        assert (orange_at < blue_at).mean() > 0.8, (row, (orange_at < blue_at).mean())  # higher is fewer rows down


def kept_tensor(run_dir: Path, layer: str, kind: str) -> np.ndarray:
    """A tensor the run kept at step 0, read with plain pandas from ``tensors.parquet``, in float64."""
    kept = pd.read_parquet(run_dir / "tensors.parquet")
    (row,) = kept[(kept.layer == layer) & (kept.kind == kind) & (kept.step == 0) & (kept.call == 0)].itertuples()
    return np.asarray(row.tensor_values, dtype=np.float64).reshape(row.tensor_shape)


def grad_cam_by_hand(activation: np.ndarray, gradient: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Grad-CAM of sample 0 in float64 (Selvaraju et al.): channels weighted by their mean gradient, ReLU, bilinear
    to ``size``, scaled to [0, 1]."""
    weights = gradient[0].mean(axis=(1, 2))
    cam = resized(np.maximum(np.tensordot(weights, activation[0], axes=1), 0), size, "bilinear")
    return (cam - cam.min()) / (cam.max() - cam.min())


def assert_gradcam_run_pictures(run_dir: Path, image_path: Path) -> None:
    """The pictures of how-to/analysis.md's resnet18 Grad-CAM run (``conv1`` and ``layer4`` kept, ``image_path``
    its input) show its data: each feature map its channel, the layer4 map a float64 Grad-CAM by hand, both
    overlays the input, the gradient flow one row per recorded kind. ``grad_cam_conv1.png``'s map is all 0: conv1
    feeds a BatchNorm in training mode, whose input gradient sums to zero per channel on one image, so there is
    no evidence (its Grad-CAM weights are float32 rounding, which the picture once drew as a map)."""
    image = np.asarray(Image.open(image_path).convert("RGB"), dtype=np.float64) / 255
    for layer in ("conv1", "layer4"):
        output = kept_tensor(run_dir, layer, "output")
        assert_feature_maps_show(run_dir / f"feature_maps_{layer}.png", output[0, :64])
        cam = (grad_cam_by_hand(output, kept_tensor(run_dir, layer, "grad_output"), image.shape[:2])
               if layer == "layer4" else np.zeros(image.shape[:2]))
        assert_grad_cam_shows(run_dir / f"grad_cam_{layer}.png", image, cam)
    stats = pd.read_parquet(run_dir / "stats.parquet")
    kinds = set(stats[stats.phase != "eval"].kind) & {"input", "output", "grad_input", "grad_output", "param_grad"}
    assert_gradient_flow_shows(run_dir / "gradient_flow.png", len(kinds))
