# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Which units respond to which digits, in a notebook
#
# The notebook twin of [Which units respond to what across an image folder](../tutorials/units.md):
# the `units` entry keeps, for every channel of every conv layer, its statistics over a whole pass and
# the samples that excite it most; `top_units` reads them back from the run's files. One pass of a small
# CNN (random weights, seed 0) over scikit-learn's 1797 handwritten digits (shipped with scikit-learn: no
# download), a few seconds of CPU.

# %%
import torch
from sklearn.datasets import load_digits
from torch import nn

import runner
from runner.analysis.units import load_units, top_units

digits = load_digits()
images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16    # 1797 x 1 x 8 x 8, in [0, 1]

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).eval()

# %% [markdown]
# ## One pass over every digit
#
# `run.samples(ids)` gives each batch's rows their dataset index, so a top sample is a digit you can
# look up whatever order the loader gives them in; `names=` says what each index is called, by index: a
# name and a class (an `ImageFolder` passed itself names each index by its file and class folder), so that `top_units`
# names the top inputs as you know them. Without gradients, as an evaluation pass runs.

# %%
names = [(f"digits[{i}]", str(digit)) for i, digit in enumerate(digits.target)]   # (name, class) of each index
order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))   # a shuffled pass, as a loader's
with torch.no_grad(), runner.attach(model, hooks=["units"], out_dir="runs/units", overwrite=True,
                                    names=names) as run:
    for ids in order.split(256):
        run.samples(ids)
        model(images[ids])
        run.step()

# %% [markdown]
# ## The strongest units and their top digits
#
# `top_units` gives one row per unit and top sample: the unit's `max` over the dataset (a sample's
# value is its maximum over positions), its top samples (`input` and `class`: the names given, `sample`
# the dataset index) and their `value`.

# %%
top = top_units("runs/units", k=3, examples=4)
print(top[["layer", "unit", "max", "dead_fraction", "input", "class", "value"]].to_string(index=False))

# %%
units = load_units("runs/units")           # one row per layer and unit
print(units.groupby("layer", sort=False)[["mean", "max"]].describe().round(2).T)

# %%
import matplotlib.pyplot as plt

best = top[top.layer == "2"]
first = int(best.unit.iloc[0])
shown = best[best.unit == first]
fig, axes = plt.subplots(1, len(shown), figsize=(2 * len(shown), 2.2))
for ax, (_, row) in zip(axes, shown.iterrows()):
    ax.imshow(digits.images[int(row["sample"])], cmap="gray_r")
    ax.set_title(f"{row.input} (a {row['class']}): {row.value:.2f}", fontsize=8)
    ax.axis("off")
_ = fig.suptitle(f"top digits of unit {first} of layer 2")
