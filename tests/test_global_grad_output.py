"""A ``stats`` entry's ``grad_output`` row describes the gradient of the very tensor its ``output`` row
describes, also when hooks outside the runner change the output after a ``scope: global`` entry saw it
(PyTorch runs global hooks before a module's own): the oracle is PyTorch's own hook on that tensor."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.modules import module as nn_module

import runner
import runner.analysis as analysis
from conftest import hook_count

pytestmark = pytest.mark.statistics


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(torch.tanh(self.fc(x)))


def outside_hooks(model):
    """A later global forward hook doubling ``fc``'s output and ``fc``'s own hook adding 1."""
    double = nn_module.register_module_forward_hook(lambda m, a, out: out * 2 if m is model.fc else None)
    add_one = model.fc.register_forward_hook(lambda m, a, out: out + 1)
    return double, add_one


@pytest.mark.parametrize("layers", ["fc", "**"])
def test_a_global_entrys_grad_output_is_the_gradient_of_the_output_it_recorded(tmp_path, layers):
    torch.manual_seed(0)
    model, plain = Net(), Net()
    plain.load_state_dict(model.state_dict())
    x = torch.randn(3, 4)

    seen = {}
    def oracle(m, a, out):
        if m is plain.fc:
            seen["output"] = out.detach().clone()
            out.register_hook(lambda g: seen.__setitem__("grad", g.detach().clone()))
    first = nn_module.register_module_forward_hook(oracle)
    handles = outside_hooks(plain)
    plain(x).sum().backward()
    for h in (first, *handles):
        h.remove()

    entry = {"g": {"type": "stats", "scope": "global", "layers": layers, "kinds": ["output", "grad_output"]}}
    with runner.attach(model, hooks=entry, out_dir=str(tmp_path / "run")) as run:
        handles = outside_hooks(model)
        model(x).sum().backward()
        run.step()
        for h in handles:
            h.remove()
    df = analysis.load_stats(tmp_path / "run")
    fc = df[df.layer == "fc"].set_index("kind")
    assert fc.loc["output", "l2"] == pytest.approx(seen["output"].double().norm().item(), rel=1e-6)
    assert fc.loc["grad_output", "l2"] == pytest.approx(seen["grad"].double().norm().item(), rel=1e-6)
    assert fc.loc["grad_output", "mean"] == pytest.approx(seen["grad"].double().mean().item(), rel=1e-6)
    assert hook_count(model) == 0
