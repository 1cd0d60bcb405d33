"""Every hook type's printed answer is what a hand-written PyTorch run of the same model and batches records.

The types with an answerer of their own are checked where their README commands run:
``clamp`` and ``stats`` (the clip line, the largest and smallest norm), ``store`` (shards, bytes),
``patch`` (a sweep and one job), ``attribution``, ``steer``, ``logit_lens`` in
``tests/test_answers_methods.py``; ``units`` in ``tests/test_units_answer.py`` (against a float64 forward)
and ``tests/test_answers_attach_names.py``. Every other type is answered by what it recorded
(``answers.statistics.recorded_answer``): the l2 norm of each tensor of the first kind it recorded (of
grad_output, param_grad, grad_input, output, input), averaged over the steps, its largest and smallest, and
the layers whose tensors are all zero. Here each runs once in-process (its preset, the smallest model it
fits), and the oracle is the same model built from the run's seed, fed the run's batches, with plain PyTorch
hooks doing what the type does (``RECORDING``'s stand-ins: the edit, then the tensor kept), the norms taken in float64.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Callable

import pytest
import torch
from torch import nn

from conftest import cli, make_config
from hooks.mechanism.registry import HOOK_TYPES
from runner.analysis.answers import answer_of, declared_answers
from runner.engine.plan import compile_plan
from runner.sources.models import build_model
from test_sae import hand_splice

ROOT = Path(__file__).resolve().parents[1]
CONVNET = ("model=convnet", "steps=2", "progress=false")


class Kept:
    """What hand-written hooks keep in one run: each tensor by its label, one per step."""

    def __init__(self) -> None:
        self.tensors: dict[str, list[torch.Tensor]] = defaultdict(list)
        self.saved = 0  # tensors autograd saved for backward

    def keep(self, label: str, tensor: torch.Tensor) -> None:
        self.tensors[label].append(tensor.detach().double().clone())


#: A hand-written stand-in for a type: given the model and what to keep, registers plain PyTorch hooks doing
#: what its preset does and keeping the tensors of the first kind it records.
Hand = Callable[[nn.Module, Kept], None]
LEAVES = ("conv", "relu", "flatten", "fc")


def keep_outputs(names=LEAVES, edit=lambda args, out: out) -> Hand:
    """Forward hooks on ``names``: the output ``edit`` makes of it, kept under the module's name."""
    def hand(model, kept):
        for name in names:
            def hook(module, args, out, name=name):
                out = edit(args, out)
                kept.keep(name, out)
                return out
            model.get_submodule(name).register_forward_hook(hook)
    return hand


def keep_grad_outputs(suffix: str = "", scale: float = 1.0, names=LEAVES) -> Hand:
    """Tensor hooks on each module's output: its gradient, times ``scale``, kept under ``name + suffix``."""
    def hand(model, kept):
        for name in names:
            def on_output(module, args, out, name=name):
                def on_grad(grad):
                    kept.keep(name + suffix, grad * scale)
                    return grad * scale if scale != 1.0 else None
                out.register_hook(on_grad)
            model.get_submodule(name).register_forward_hook(on_output)
    return hand


def keep_param_grads(zeroed: tuple[str, ...] = ()) -> Hand:
    """Each parameter's gradient (``zeroed`` ones replaced by zeros first), kept under its name."""
    def hand(model, kept):
        for name, parameter in model.named_parameters():
            if name in zeroed:
                parameter.register_hook(torch.zeros_like)
            if not zeroed or name in zeroed:
                parameter.register_post_accumulate_grad_hook(lambda p, name=name: kept.keep(name, p.grad))
    return hand


def shifted_input(model, kept):
    """The model's input plus 1 (``shift``'s default), kept as ``(model)``'s."""
    def hook(module, args):
        kept.keep("(model)", args[0] + 1.0)
        return (args[0] + 1.0, *args[1:])
    model.register_forward_pre_hook(hook)


def counted_saves(model, kept):
    """How many tensors autograd saves in the model's forward (``saved_tensors`` records one row each)."""
    def pack(tensor):
        kept.saved += 1
        return tensor
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)
    model.register_forward_pre_hook(lambda module, args: hooks.__enter__())
    model.register_forward_hook(lambda module, args, out: hooks.__exit__(None, None, None))


def spliced_block(model, kept):
    """The standard SAE spliced at ``transformer.h.0`` by hand (``test_sae.hand_splice``), its output kept."""
    block = model.get_submodule("transformer.h.0")
    block.register_forward_hook(hand_splice())
    block.register_forward_hook(lambda module, args, out: kept.keep("transformer.h.0", out))


def spliced_mlps(model, kept):
    """The fixture's circuit-tracer skip JumpReLU transcoders spliced by hand at both MLPs of gpt2_tiny, each
    ``decode(f) + skip(a)`` plus the error term (no gradient), the outputs kept."""
    from safetensors.torch import load_file

    for block in (0, 1):
        w = load_file(ROOT / "tests/fixtures/transcoders_gpt2_tiny" / f"layer_{block}.safetensors")

        def splice(module, args, out, w=w):
            pre = args[0] @ w["W_enc"].T + w["b_enc"]
            recon = (pre * (pre > w["activation_function.threshold"])) @ w["W_dec"] + w["b_dec"] + args[0] @ w["W_skip"].T
            return recon + (out - recon).detach()
        name = f"transformer.h.{block}.mlp"
        model.get_submodule(name).register_forward_hook(splice)
        model.get_submodule(name).register_forward_hook(lambda module, args, out, name=name: kept.keep(name, out))


#: Per type answered by its records: (entry name, command-line overrides, hand-written stand-in, first kind).
RECORDING = {
    "ablate": ("ablate", (*CONVNET, "hooks=ablate", "hooks.ablate.layers=conv"),
               keep_outputs(["conv"], lambda args, out: torch.zeros_like(out)), "output"),
    "backward_pre": ("backward_pre", (*CONVNET, "hooks=backward_pre"), keep_grad_outputs(), "grad_output"),
    "capture": ("extract", (*CONVNET, "hooks=extract", "hooks.extract.layers=[conv,fc]"), keep_outputs(["conv", "fc"]),
                "output"),
    "custom": ("custom", (*CONVNET, "hooks=custom"), keep_outputs(), "output"),
    "edit_output": ("residual", (*CONVNET, "hooks=residual", "hooks.residual.layers=relu"),
                    keep_outputs(["relu"], lambda args, out: out + args[0]), "output"),
    "full_backward": ("full_backward", (*CONVNET, "hooks=full_backward"), keep_grad_outputs(), "grad_output"),
    "node": ("node", (*CONVNET, "hooks=node"), keep_grad_outputs("[0.0]"), "grad_output"),
    "post_accumulate": ("post_accumulate", (*CONVNET, "hooks=post_accumulate"), keep_param_grads(), "param_grad"),
    "print": ("print", (*CONVNET, "hooks=print"), keep_outputs(), "output"),
    "replace": ("zero_bias", (*CONVNET, "hooks=zero_bias"), keep_param_grads(("fc.bias",)), "param_grad"),
    "sae": ("sae", ("model=gpt2_tiny", "data=tokens", "loss=none", "mode=eval", "steps=2", "progress=false",
                    "hooks=sae", f"hooks.sae.path={ROOT / 'tests/fixtures/sae_standard'}"), spliced_block, "output"),
    "transcoder": ("transcoder", ("model=gpt2_tiny", "data=tokens", "loss=none", "mode=eval", "steps=2", "progress=false",
                                  "hooks=transcoder", f"hooks.transcoder.path={ROOT / 'tests/fixtures/transcoders_gpt2_tiny'}"),
                   spliced_mlps, "output"),
    "saved_tensors": ("offload", (*CONVNET, "hooks=offload"), counted_saves, "saved"),
    "scale": ("double_grad", (*CONVNET, "hooks=double_grad"), keep_grad_outputs(scale=2.0, names=["fc"]),
              "grad_output"),
    "shift": ("shift", (*CONVNET, "hooks=shift"), shifted_input, "input"),
}
#: Types answered elsewhere (the module's doc), by the test that checks them.
ANSWERED_ELSEWHERE = {"clamp", "stats", "store", "patch", "attribution", "steer", "logit_lens", "units",
                      "dla",  # tests/test_dla.py: the printed parts and heads against dla.parquet
                      "graph"}  # tests/test_graph_cli.py: the printed paths against every path enumerated
GRADIENTS = ("grad_output", "param_grad", "grad_input")


def test_every_hook_type_is_checked_here_or_named_where_it_is():
    missing = set(HOOK_TYPES) - set(RECORDING) - ANSWERED_ELSEWHERE
    assert not missing, f"hook types whose printed answer no test checks against a hand-written run: {sorted(missing)}"
    assert all(declared_answers(kind).run is None for kind in RECORDING)  # these have no answerer of their own: their records answer


def hand_run(words: tuple[str, ...], hand: Hand) -> Kept:
    """The run's model (built from its seed) on the run's batches, ``steps`` of them, with ``hand``'s hooks
    registered; a training run backpropagates its loss (``loss=sum``: the output's sum), gradients zeroed
    each step as there is no optimizer."""
    plan = compile_plan(make_config(*(w for w in words if not w.startswith("hooks"))))
    torch.manual_seed(plan.settings.seed)
    model = build_model(plan.model).train(plan.settings.mode.value == "train")
    kept = Kept()
    hand(model, kept)
    batches = plan.data.batches(plan.settings.seed, torch.device("cpu"))
    for _ in range(plan.settings.steps):
        model.zero_grad(set_to_none=True)
        out = model(next(batches).x)
        if model.training:
            out.sum().backward()
        else:
            assert plan.settings.mode.value == "eval"
    return kept


def expected_lines(kept: Kept, kind: str) -> tuple[list[str], dict[str, float]]:
    """The answer of what the hand-written run kept: each tensor's l2 averaged over the steps (float64)."""
    if kind == "saved":
        return [f"{kept.saved} rows of kinds saved"], {}
    means = {label: float(torch.stack([t.norm() for t in steps]).mean()) for label, steps in kept.tensors.items()}
    what = "gradient" if kind in GRADIENTS else "activation"
    largest, smallest = max(means, key=means.get), min(means, key=means.get)
    first = (f"{what} l2 ({kind}) of {largest}: {means[largest]:.3g}" if len(means) == 1 else
             f"{what} l2 ({kind}, {len(means)} tensors): largest {largest} {means[largest]:.3g}, "
             f"smallest {smallest} {means[smallest]:.3g}")
    dead = [label for label, steps in kept.tensors.items() if all(not t.any() for t in steps)]
    problem = "zero gradient" if kind in GRADIENTS else "all zero"
    return [first, f"{problem}: {', '.join(dead)}" if dead else "no dead or non-finite layer"], means


@pytest.mark.parametrize("kind", sorted(RECORDING))
def test_the_printed_answer_is_what_a_hand_written_run_records(tmp_path, capsys, kind):
    """Catches an answer whose number, tensor names, largest or smallest, or dead-layer line is not the run's:
    the printed lines and the answer's table equal those of ``hand_run`` (float64 norms, rel 1e-5)."""
    entry, words, hand, first_kind = RECORDING[kind]
    cli(list(words), tmp_path / "run")
    printed = capsys.readouterr().out.splitlines()
    lines, means = expected_lines(hand_run(words, hand), first_kind)
    named = entry if entry == kind else f"{entry} ({kind})"
    start = printed.index(next(line for line in printed if line.startswith(f"  {named}: ")))
    assert printed[start:start + len(lines)] == [f"  {named}: {lines[0]}", *(f"    {line}" for line in lines[1:])]
    table = answer_of(tmp_path / "run", entry, kind).table
    assert dict(zip(table.get("label", []), table.get("l2", []))) == pytest.approx(means, rel=1e-5)
