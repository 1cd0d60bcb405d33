"""Hooks go on a model before ``torch.compile`` sees it, never after.

Why: compiled code does not look for hooks added after compilation (``torch._dynamo``
skips the guards on a module's hook dicts by default), so an entry attached to a model that was
compiled would match, attach, and never run: the worst kind of defect. ``compiled_problem``
finds such a model: an ``OptimizedModule`` (what ``torch.compile(model)`` returns) anywhere in
it, or a module compiled in place with ``nn.Module.compile()``. PyTorch has no public predicate
for either; the class is reached through ``torch._dynamo.eval_frame`` and the in-place case
through the attribute ``nn.Module.compile`` sets.
"""
from __future__ import annotations

from torch import nn


def compiled_problem(model: nn.Module) -> str | None:
    """One line saying which part of ``model`` is compiled and what to do, or ``None``."""
    from torch._dynamo.eval_frame import OptimizedModule

    for name, module in model.named_modules():
        if isinstance(module, OptimizedModule) or getattr(module, "_compiled_call_impl", None) is not None:
            where = f"'{name}'" if name else "the model"
            return (f"model: {where} is already compiled with torch.compile, and compiled code never runs hooks "
                    f"added after it; attach to the model first, then compile it inside the block "
                    f"(with runner.attach(model, ...): fast = torch.compile(model))")
    return None
