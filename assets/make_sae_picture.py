"""The picture of the docs' SAE tutorial (docs/tutorials/sae.md), drawn from two runs' files alone.

``python assets/make_sae_picture.py UNITS_RUN SWEEP FEATURE OUT.png``: above, feature ``FEATURE``'s
activation at every token of its top prompts (``top_units`` of ``UNITS_RUN``, the values from its ``extract``
entry's ``tensors.parquet``, the tokens named by the run's ``data.tokenizer``); below, the text
``SWEEP`` generated from each prompt at each steering value (``generations.parquet``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from runner.analysis import load_tensors, top_units  # noqa: E402
from runner.analysis.load import load_table  # noqa: E402
from common.run_config import saved_config_path  # noqa: E402
from runner.analysis.units import load_unit_inputs  # noqa: E402
from common.tokenizers import load_tokenizer  # noqa: E402


def feature_tokens(run: Path, feature: int) -> tuple[list[str], list[list[str]], np.ndarray]:
    """The feature's top prompts (best first), each one's tokens, and the feature's value at each token
    ``[prompts, positions]`` (the padded batch's positions: a pad is scored like any token)."""
    top = top_units(run, k=10**6)
    top = top[top.unit == feature]
    (layer,) = set(top.layer)
    captured = load_tensors(run, filters=[("layer", "=", layer), ("kind", "=", "output")]).sort_values("step")
    features = np.concatenate(list(captured.tensor))[..., feature]  # [samples, positions]; one batch per step
    ids = load_unit_inputs(run)
    tokenizer = load_tokenizer(OmegaConf.load(saved_config_path(run)).data.tokenizer)
    tokens = [tokenizer.convert_ids_to_tokens(ids[("units", int(s))].tolist()) for s in top["sample"]]
    return list(top["input"]), tokens, features[top["sample"].to_numpy()]


def draw(run: Path, sweep: Path, feature: int, out: Path) -> None:
    prompts, tokens, values = feature_tokens(run, feature)
    texts = load_table(sweep, "generations.parquet")
    swept = [c for c in texts.columns if c.startswith("hooks.") and texts[c].nunique() > 1]
    (by,) = swept
    scales = sorted(texts[by].unique(), key=float)
    fig, (left, right) = plt.subplots(2, 1, figsize=(9, 5.4), gridspec_kw={"height_ratios": [1.6, 1]})
    image = left.imshow(values, cmap="viridis", aspect="auto")
    for row, words in enumerate(tokens):
        for col, word in enumerate(words):
            left.text(col, row, "pad" if word == "<|endoftext|>" else word, ha="center", va="center", fontsize=7,
                      color="white" if values[row, col] < values.mean() else "black")
    left.set_yticks(range(len(prompts)), [f"{i}: {p}" for i, p in enumerate(prompts)], fontsize=7)
    left.set_xticks(range(values.shape[1]))
    left.set_xlabel("position")
    left.set_title(f"feature {feature}: its top prompts, its activation per token", fontsize=9)
    fig.colorbar(image, ax=left, fraction=0.04)
    cells = [[texts[(texts.prompt == p) & (texts[by] == s)].generated_text.item() for s in scales]
             for p in texts.prompt.unique()]
    right.axis("off")
    table = right.table(cellText=cells, rowLabels=list(texts.prompt.unique()),
                        colLabels=[f"{by.split('.')[-1]}={s}" for s in scales], loc="center", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    table.scale(1, 1.5)
    right.set_title(f"generated text, feature {feature} steered ({by})", fontsize=9)
    cfg = OmegaConf.load(saved_config_path(run))
    model = load_tensors(run, columns=["model"]).model.iloc[0]
    fig.suptitle(f"{model}, sae {Path(cfg.hooks.sae.path).name} at {cfg.hooks.sae.layers}", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    draw(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
