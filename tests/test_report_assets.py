"""The docs' pictures of what the report draws are the report's pictures: the steering tutorial's
(docs/tutorials/steering.md) is ``steering_picture`` of its two-layer sweep with a metric, as the report's
"Steering" section shows it, not an older drawing."""
from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
from PIL import Image

from runner.analysis.plots import png_bytes
from runner.analysis.steering import steering_picture

ROOT = Path(__file__).resolve().parents[1]


def test_the_steering_tutorial_s_picture_is_the_report_s_steering_picture_of_its_sweep():
    page = (ROOT / "docs" / "tutorials" / "steering.md").read_text()
    assert "(../assets/steering_gpt2_tiny.png)" in page and "`steering_picture` draws" in page
    table = pd.DataFrame({"layers": ["transformer.h.0"] * 3 + ["transformer.h.1"] * 3, "scale": [0.0, 16.0, 32.0] * 2,
                          "kl": 0.01, "top_changed": 0.5, "steered": 0.1, "unsteered": 0.1})
    table.attrs["metric"] = "logit_diff"
    drawn = Image.open(io.BytesIO(png_bytes(steering_picture(table))))
    asset = Image.open(ROOT / "assets" / "steering_gpt2_tiny.png")
    assert asset.size == drawn.size  # three panels (KL, top token changed, the metric) at the report's size
