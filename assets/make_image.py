"""Draw ``assets/house.png``, the project's own test image (``python assets/make_image.py``).

A house under a sun on a lawn: edges, flat colour regions and a round blob, enough structure
for feature maps and Grad-CAM to show something, and no download needed.
"""
from pathlib import Path

from PIL import Image, ImageDraw


def make_image(size: int = 224) -> Image.Image:
    """The picture at ``size`` x ``size`` pixels, deterministic."""
    img = Image.new("RGB", (size, size))
    draw = ImageDraw.Draw(img)
    s = size / 224
    for y in range(size):  # sky fading to pale blue
        draw.line([(0, y), (size, y)], fill=(90 + y * 100 // size, 150 + y * 60 // size, 235))
    draw.rectangle([0, 165 * s, size, size], fill=(70, 150, 60))                  # lawn
    draw.ellipse([160 * s, 18 * s, 205 * s, 63 * s], fill=(250, 210, 40))         # sun
    draw.rectangle([45 * s, 95 * s, 135 * s, 170 * s], fill=(200, 60, 50))        # walls
    draw.polygon([(35 * s, 98 * s), (90 * s, 50 * s), (145 * s, 98 * s)], fill=(110, 60, 40))  # roof
    draw.rectangle([80 * s, 125 * s, 100 * s, 170 * s], fill=(80, 45, 25))        # door
    draw.rectangle([55 * s, 108 * s, 72 * s, 124 * s], fill=(220, 235, 250))      # window
    draw.rectangle([108 * s, 108 * s, 125 * s, 124 * s], fill=(220, 235, 250))    # window
    return img


if __name__ == "__main__":
    out = Path(__file__).with_name("house.png")
    make_image().save(out, optimize=True)
    print(f"wrote {out}")
