"""``python -m benchmarks.compiled``: the ``stats`` preset on a ``torch.compile``d model against the same
compiled model without hooks, and the graph breaks the entry costs.

Each variant is compiled and timed in a process of its own (see ``main``); the result is the
ratio of their median step times, target <= 1.10 for resnet18 at batch 8. Graph breaks are read
from ``torch._dynamo.utils.counters`` (``"graph_break"``: one count per break met while
compiling; ``"stats"`` ``"unique_graphs"``: the graphs made), cleared before the compilation;
``torch._dynamo.explain`` gives the same numbers but traces the model again. The breaks of each
entry of ``ENTRIES`` on its own (``graph_breaks_per_entry``) cost one compiled step each, untimed.

    python -m benchmarks.compiled                 # resnet18, batch 8
    python -m benchmarks.compiled --quick         # a small convnet, a few steps (a smoke run)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision

import runner
from runner.sources.models import ConvNet

TARGET = 1.10
ROOT = Path(__file__).resolve().parents[1]
#: The entries whose graph breaks are counted one by one: the issue's observation and edit on module
#: outputs. ``compile=true`` refuses the presets' output gradients (tensor hooks break the graph): outputs only.
ENTRIES = {"stats": ["hooks.stats.kinds=[output]"], "extract": [], "ablate": []}
#: The presets' layers are resnet18's; the small convnet's (``--quick``) instead.
QUICK_LAYERS = {"stats": [], "extract": ["hooks.extract.layers=[conv,fc]"], "ablate": ["hooks.ablate.layers=relu"]}


def model_and_batch(quick: bool, batch: int) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if quick:
        return ConvNet(), torch.randn(batch, 3, 8, 8)
    return torchvision.models.resnet18(), torch.randn(batch, 3, 224, 224)


def compiled_variant(hooks: list[str], quick: bool, batch: int, out_dir: Path, stack: contextlib.ExitStack):
    """A compiled model's step function (the entries attached first, until ``stack`` closes) and its
    graph breaks and graphs."""
    from torch._dynamo.utils import counters

    model, x = model_and_batch(quick, batch)
    overrides = [o for h in hooks for o in ENTRIES[h] + (QUICK_LAYERS[h] if quick else [])]
    run = stack.enter_context(runner.attach(model, hooks=hooks, overrides=overrides, out_dir=out_dir))
    fast = torch.compile(model)
    counters.clear()

    def step() -> None:
        loss = F.log_softmax(fast(x), dim=1).mean()
        run.backward(loss)
        run.step(loss)
        model.zero_grad(set_to_none=True)

    step()  # compiles
    return step, {"graph_breaks": sum(counters["graph_break"].values()), "graphs": counters["stats"]["unique_graphs"]}


def measure(variant: str, quick: bool, batch: int, rounds: int) -> dict:
    """This process's ``variant`` (``bare`` or an entry of ``ENTRIES``): its graph breaks, graphs and step times."""
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        step, info = compiled_variant([] if variant == "bare" else [variant], quick, batch, Path(tmp), stack)
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    return {**info, "step_s": times}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small convnet and few rounds (a smoke run)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=None, help="timed steps after the compiled one (20; --quick: 2)")
    parser.add_argument("--variant", choices=("bare", *ENTRIES), help="measure one variant in this process (JSON out)")
    parser.add_argument("--out", type=Path, default=None, help="write compiled.json here")
    args = parser.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else 2 if args.quick else 20
    if args.variant:
        print(json.dumps(measure(args.variant, args.quick, args.batch, rounds)))
        return {}
    # One process per variant: compiled code is cached per class, and a model compiled without hooks
    # earlier in the process lends its code (no hook calls in it) to a hooked instance of its class.
    found = {variant: variant_process(variant, args.quick, args.batch, rounds if variant in ("bare", "stats") else 0)
             for variant in ("bare", *ENTRIES)}
    result = {"model": "convnet" if args.quick else "resnet18", "batch": args.batch, "rounds": rounds,
              "stats_over_bare": statistics.median(found["stats"]["step_s"]) / statistics.median(found["bare"]["step_s"]),
              "target": TARGET,
              **{f"{name}_{key}": found[name][key] for name in ("bare", "stats") for key in ("graph_breaks", "graphs")},
              "graph_breaks_per_entry": {name: found[name]["graph_breaks"] for name in ENTRIES}}
    return print_and_write(result, args.out, "compiled.json")


def variant_process(variant: str, quick: bool, batch: int, rounds: int) -> dict:
    """``measure(variant, ...)`` in a process of its own (``rounds=0``: its compiled step only, for the breaks)."""
    command = [sys.executable, "-m", "benchmarks.compiled", "--variant", variant, "--batch", str(batch),
               "--rounds", str(rounds), *(["--quick"] if quick else [])]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_and_write(result: dict, out: Path | None, name: str) -> dict:
    """Print ``result`` as JSON and write it to ``out/name`` when ``out`` is given; return it."""
    print(json.dumps(result, indent=1))
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
