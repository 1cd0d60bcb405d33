"""Stop the forward pass after the last module a run needs (``stop_after``): the rest is not run.

``stop_after: layer2`` ends every forward after ``layer2`` returns; ``stop_after: auto`` finds the
stop in a model that is a sequence of modules (``nn.Sequential``): the last top-level child that
holds a module some entry selects. A forward hook on the stop module, registered after every
entry's hooks (so theirs run first), raises a private exception that the run's step catches. Only
for passes that need no model output: ``loss=none`` (so no gradients) and no ``metric``.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from common.errors import ConfigError, choice_error


class _StopForward(Exception):
    """Raised by the stop module's forward hook; never leaves ``stopping``'s callers."""


def check(stop_after: str | None, loss_name: str, metric) -> None:
    """Refuse a stop in a run that needs what comes after it (without a loss nothing computes gradients)."""
    if stop_after is None:
        return
    if loss_name != "none":
        raise ConfigError(f"stop_after: {stop_after} ends the forward early but loss={loss_name} needs the model's "
                          f"output; add loss=none")
    if metric.target is not None or metric.diff is not None:
        raise ConfigError(f"stop_after: {stop_after} ends the forward early but metric needs the model's output")


def stop_module(model: nn.Module, stop_after: str, hooks) -> tuple[str, nn.Module]:
    """The module after which the forward stops, by name or (``auto``) from the entries' selections."""
    modules = dict(model.named_modules())
    if stop_after != "auto":
        if stop_after not in modules or stop_after == "":
            raise choice_error("stop_after", stop_after, [n for n in modules if n], "module")
        return stop_after, modules[stop_after]
    if not isinstance(model, nn.Sequential):
        raise ConfigError(f"stop_after: auto needs a model that is a sequence of modules (nn.Sequential), not a "
                          f"{type(model).__name__}; name the module, e.g. stop_after=layer2")
    selected = {name for hook in hooks for name, _ in hook.targets(model)}
    children = [name for name, _ in model.named_children()]
    holding = [i for i, child in enumerate(children) if any(s == child or s.startswith(child + ".") for s in selected)]
    if not holding or "" in selected:
        raise ConfigError("stop_after: auto found no top-level module that every selected module comes before")
    name = children[max(holding)]
    return name, modules[name]


@contextlib.contextmanager
def stopping(model: nn.Module, stop_after: str | None, hooks) -> Iterator[None]:
    """Within the block, every forward of ``model`` ends after the stop module (nothing when ``None``)."""
    if stop_after is None:
        yield
        return
    _, module = stop_module(model, stop_after, hooks)

    def stop(module, args, output):
        raise _StopForward

    handle = module.register_forward_hook(stop)
    try:
        yield
    finally:
        handle.remove()


def forward_until_stop(forward, x) -> None:
    """Run ``forward(x)``; a stop ends it without an error."""
    try:
        forward(x)
    except _StopForward:
        pass
