"""``python -m benchmarks.loggers``: the ``stats`` preset with each live logger on, against ``stats`` alone.

One process, interleaved rounds (``benchmarks.run.interleaved``): ``bare`` (no hooks), ``stats``
(``runner.attach(hooks=["stats"])``, parquet written by the background writer), ``stats`` with
``logger=tensorboard``, ``wandb`` (offline) and ``mlflow`` (a local SQLite store), each
``every=1``, and W&B's own ``wandb.watch(log="gradients", log_freq=1)`` beside them. Ratios are
medians of the per-round ratio to ``stats`` (target <= 1.02 for resnet18 at batch 8) and to
``bare``. Numbers from a machine other processes load are noise: read the ratios of a quiet one.

    python -m benchmarks.loggers            # resnet18, batch 8, 224x224, 20 rounds
    python -m benchmarks.loggers --quick    # a small convnet, 2 rounds: the smoke test (wandb.watch too)
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import tempfile
from pathlib import Path

import torch
import torchvision

import runner
from benchmarks.compiled import print_and_write
from benchmarks.run import interleaved, paired_ratio
from benchmarks.variants import Variant, bare, wandb_installed, wandb_watch
from runner.sources.models import ConvNet

#: The issue's target: a step with a logger on over the same step with ``stats`` alone.
TARGET = 1.02


def attached(name: str, model, x, out_dir: Path, stack: contextlib.ExitStack, logger: dict) -> Variant:
    """A ``runner.attach(hooks=["stats"], logger=logger)`` step of ``model`` (open until ``stack`` closes)."""
    run = stack.enter_context(runner.attach(model, hooks=["stats"], out_dir=out_dir, logger=logger))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss = model(x).sum()
        loss.backward()
        run.step(loss)

    return Variant(name, f"`stats`, logger={list(logger) or 'none'}", model, step)


def variants(model, x, tmp: Path, stack: contextlib.ExitStack) -> list[Variant]:
    fresh = lambda: copy.deepcopy(model)  # noqa: E731
    found = [bare(fresh(), x), attached("stats", fresh(), x, tmp / "stats", stack, {}),
             attached("stats + tensorboard", fresh(), x, tmp / "tb", stack, {"tensorboard": {}}),
             attached("stats + wandb", fresh(), x, tmp / "wandb", stack, {"wandb": {}}),
             attached("stats + mlflow", fresh(), x, tmp / "mlflow", stack,
                      {"mlflow": {"tracking_uri": f"sqlite:///{tmp / 'mlflow.db'}"}})]
    if wandb_installed():
        watch = wandb_watch(fresh(), x, "gradients")
        stack.callback(watch.close)
        found.append(watch)
    return found


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loggers", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small convnet and 2 rounds (a smoke run)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None, help="write loggers.json here")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model, x = (ConvNet(), torch.randn(2, 3, 8, 8)) if args.quick else \
        (torchvision.models.resnet18(), torch.randn(8, 3, 224, 224))
    rounds, warmup = (2, 1) if args.quick else (args.rounds, 3)
    with tempfile.TemporaryDirectory(prefix="bench-loggers-") as tmp, contextlib.ExitStack() as stack:
        timed = variants(model, x, Path(tmp), stack)
        wall, cpu = interleaved(timed, rounds, warmup)
    result = {"model": "convnet" if args.quick else "resnet18", "batch": x.shape[0], "rounds": rounds,
              "target": TARGET, "variants": {}}
    for v in timed:
        result["variants"][v.name] = {
            "median_s": statistics.median(wall[v.name]),
            "over_stats": paired_ratio(wall[v.name], wall["stats"]),
            "over_bare": paired_ratio(wall[v.name], wall["bare"]),
            "cpu_over_stats": paired_ratio(cpu[v.name], cpu["stats"]),
        }
    return print_and_write(result, args.out, "loggers.json")


if __name__ == "__main__":
    main()
