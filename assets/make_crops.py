"""Cut ``assets/house.png`` into a small image dataset (``python assets/make_crops.py crops``).

``crops/top/`` holds 64x64 crops from the upper half (sky, sun, roof), ``crops/bottom/`` from the
lower half (walls, door, lawn), each at a seeded position and randomly mirrored: a folder for
``data=imagefolder`` with two classes a linear probe can tell apart, made offline in a second.
"""
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

HOUSE = Path(__file__).resolve().parent / "house.png"


def make_crops(out: Path, per_class: int = 96, side: int = 64, seed: int = 0) -> Path:
    """``per_class`` crops of each half into ``out/top`` and ``out/bottom``; returns ``out``."""
    house = Image.open(HOUSE).convert("RGB")
    size = house.size[0]
    gen = np.random.default_rng(seed)
    for name, (low, high) in {"top": (0, size // 2 - side), "bottom": (size // 2, size - side)}.items():
        (out / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            x, y = int(gen.integers(0, size - side)), int(gen.integers(low, high + 1))
            crop = house.crop((x, y, x + side, y + side))
            (ImageOps.mirror(crop) if gen.random() < 0.5 else crop).save(out / name / f"{i:03d}.png")
    return out


if __name__ == "__main__":
    print(make_crops(Path(sys.argv[1] if len(sys.argv) > 1 else "crops")))
