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
# # A clip bound's effect on gradient norms, in a notebook
#
# The notebook twin of [How a clip bound changes gradient norms](../tutorials/clip.md): `runner.attach`
# puts the `clip` entry (every element of every parameter's gradient clamped to a window) on your own
# model inside your own loop, and `runner.analysis.load_stats` reads back what it recorded. A small MLP
# on scikit-learn's handwritten digits (shipped with scikit-learn: no download), a few seconds of CPU.
# Re-running a cell writes its runs again (`overwrite=True`); interrupting one leaves no hooks on the model.

# %%
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import runner
import runner.analysis

digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16     # 1797 images of 8 x 8 pixels, in [0, 1]
y = torch.tensor(digits.target)


def fresh_model() -> nn.Module:
    """The same randomly initialised MLP every time (seed 0), so runs differ only by their bound."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


# %% [markdown]
# ## One backward pass at three bounds
#
# A symmetric bound sets `min` and `max` together; ±1000 clamps nothing. `param_grad` rows after
# backward are the gradients as they landed in `.grad`, clamped.

# %%
bounds = [1000.0, 0.01, 0.0001]
for bound in bounds:
    model = fresh_model()
    with runner.attach(model, hooks=["clip"], overrides=[f"hooks.clip.min={-bound}", f"hooks.clip.max={bound}"],
                       out_dir=f"runs/clip/bound_{bound}", overwrite=True) as run:
        loss = F.cross_entropy(model(x[:256]), y[:256])
        loss.backward()
        run.step(loss)

df = runner.analysis.load_stats("runs/clip", filters=[("kind", "=", "param_grad"), ("phase", "=", "after_backward")])
norm = df.pivot_table(index="layer", columns="hooks.clip.max", values="l2", sort=False,
                      aggfunc=lambda l2: (l2 ** 2).sum() ** 0.5)      # weight and bias together
kept = norm.div(norm[1000.0], axis=0)                                 # share of the unclipped norm kept
print(kept.round(3))

# %% [markdown]
# ## Training with and without the clip
#
# Thirty SGD steps each; `run.step(loss)` writes one `steps.parquet` row per step.

# %%
for name, hooks in [("none", []), ("clip", ["clip"])]:
    model = fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    with runner.attach(model, hooks=hooks, out_dir=f"runs/train/{name}", overwrite=True) as run:
        for step in range(30):
            batch = slice(64 * step % 1792, 64 * step % 1792 + 64)
            loss = F.cross_entropy(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            run.step(loss)

steps = runner.analysis.load_steps("runs/train")
steps["hooks"] = steps.run_dir.map(lambda path: path.rsplit("/", 1)[-1])
curves = steps.pivot(index="step", columns="hooks", values="loss")
print(curves.iloc[[0, 9, 19, 29]].round(3))

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
kept.plot.bar(ax=left, logy=True, title="share of the gradient norm kept")
curves.plot(ax=right, title="training loss")
right.set_xlabel("step")
fig.tight_layout()
