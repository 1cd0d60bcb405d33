"""The local replacement model's freezes, as forward hooks that act only while a graph's pass runs.

An attribution graph's edges are gradients through the model with its attention patterns and norm scales held
at their values on the prompt (Ameisen et al. 2025; circuit-tracer detaches ``hook_pattern`` and every
``hook_scale``). Here the values a pass computes are left exactly as they are and only their gradients change:

* attention: the queries and keys are detached where they are made (GPT-2's fused ``c_attn``: its first two
  thirds; the ``q_proj`` and ``k_proj`` of Llama-like families), so no gradient reaches the pattern and the
  attention is linear in its values;
* norms: each norm's output ``y`` becomes ``y.detach() + (l - l.detach())`` with ``l`` the norm's output with its
  scale frozen (``hooks.mechanism.families.norm_linear``): the same value, the gradient of the frozen norm.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from common.errors import ConfigError
from hooks.mechanism.families import Vocabulary, norm_gain, norm_linear, norm_scale

#: The norms a graph freezes, by canonical name after ``blocks.i.`` (each block's) or at the root.
BLOCK_NORMS = ("ln1", "ln2", "ln_attn_out", "ln_mlp_out")


def _fused_qk(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
    """GPT-2's ``c_attn`` makes ``[q | k | v]`` side by side: q and k detached."""
    width = out.shape[-1] // 3
    return torch.cat([out[..., :2 * width].detach(), out[..., 2 * width:]], dim=-1)


def _detached(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
    return out.detach()


def pattern_makers(vocab: Vocabulary, key: str) -> list[tuple[nn.Module, Callable]]:
    """Per block, the modules making the attention's queries and keys and the hook detaching them; one line for
    an attention made otherwise (a family whose queries and keys this module does not know)."""
    found = []
    for i in range(len(vocab.blocks())):
        attn = vocab.modules[f"blocks.{i}.attn"]
        children = dict(attn.named_children())
        if "c_attn" in children:
            found.append((children["c_attn"], _fused_qk))
        elif "q_proj" in children and "k_proj" in children:
            found += [(children["q_proj"], _detached), (children["k_proj"], _detached)]
        else:
            raise ConfigError(f"{key}: the {vocab.family} family's attention ({type(attn).__name__}) makes its "
                              f"queries and keys in neither a fused c_attn (gpt2) nor q_proj and k_proj (llama, "
                              f"mistral, qwen2, qwen3, gemma2, gemma3), so its patterns cannot be frozen")
    return found


def frozen_norm(vocab: Vocabulary) -> Callable:
    """The hook giving a norm's output the gradient of the norm with its scale frozen, its value unchanged."""
    how, eps = vocab.table.norm, vocab.table.eps

    def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        x = args[0]
        scale = norm_scale(x.detach(), module, how, eps)
        linear = (norm_linear(x, scale, how) * norm_gain(module, how)).to(out.dtype)
        return out.detach() + (linear - linear.detach())
    return hook


def norms(vocab: Vocabulary) -> list[nn.Module]:
    """Every norm of the residual stream's paths: each block's (``BLOCK_NORMS`` it has) and the final one."""
    found = [vocab.modules[f"blocks.{i}.{name}"] for i in range(len(vocab.blocks())) for name in BLOCK_NORMS
             if f"blocks.{i}.{name}" in vocab.modules]
    return [*found, vocab.modules["ln_final"]]


def freezing_hooks(vocab: Vocabulary, key: str, active: Callable[[], bool]) -> list[tuple[nn.Module, Callable]]:
    """(module, forward hook) pairs freezing every attention pattern and norm scale while ``active()``."""
    def when(hook: Callable) -> Callable:
        def gated(module: nn.Module, args: tuple, out: Any) -> Any:
            return hook(module, args, out) if active() else None
        return gated
    norm_hook = frozen_norm(vocab)
    return [(m, when(h)) for m, h in pattern_makers(vocab, key)] + [(m, when(norm_hook)) for m in norms(vocab)]
