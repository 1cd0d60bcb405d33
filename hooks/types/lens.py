"""``logit_lens``: what each block's output would predict, read through the model's own final norm and unembedding.

For a causal language model (``gpt2_tiny``, a local Hugging Face causal LM) a forward hook on each
selected block takes its output ``h`` (``slot``, ``[batch, positions, hidden]``) and computes
``unembedding(final_norm(h))``, capped as the family caps its logits (Gemma2's ``c * tanh(x / c)``): the
logits the model would give if the blocks after it did nothing. The final norm, unembedding and cap are
the family's (``hooks.mechanism.families``: GPT-2's ``ln_f``, Llama's ``norm``, NeoX's ``final_layer_norm``). A model
without an unembedding, or of a family the vocabulary does not know, is refused in one line when the
entry is attached (first in the plan's rehearsal).

Each training pass adds to ``lens.parquet`` (``common.records.LENS_SCHEMA``) one row per block (``block``:
its place among the matched modules), sample and position: the ``top_k`` token ids and their logits,
and the target token's logit, probability and rank (0: the top token). ``target: final`` is the token
the model itself ranks first at that position (its output's argmax: where in depth its prediction
forms); ``next`` is the input's next token (the last position has none: target -1, NaN, rank -1); an
integer is that token at every position. The rows of a pass are made when the model returns (the
final target is known then). Passes run aside (the clean pass of ``patch``) and on the meta device add no rows.

The lens's own reading is invisible to every other hook: it runs the two modules' ``forward``
rather than calling the modules, so no hook on them (another entry's, a user's, PyTorch's global
module hooks) sees it, nothing changes what it reads, and their call numbers stay the model's (a
``patch`` on ``lm_head`` from a run made without the lens matches the model's own call). Submodules
of their own, which neither has in the models the lens reads (GPT-2's, Llama's), would be called as modules.
"""
from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from common.errors import ConfigError
from common.records import LENS, LENS_SCHEMA
from hooks.mechanism.families import Vocabulary, vocabulary
from hooks.mechanism.recorder import walk
from hooks.mechanism.registry import register
from hooks.types.samples import SampleOutputs
from hooks.specs.lens import FINAL, LogitLensSpec, NEXT

#: The models the lens reads, for the one-line refusal.
CAUSAL_MODELS = ("model=gpt2_tiny", "model=hf model.auto=causal_lm")


def lens_parts(model: nn.Module, key: str, reader: str = "the logit lens") -> Vocabulary:
    """The vocabulary of a causal LM's family (its final norm, unembedding and logit soft-cap), or one line
    naming the models with an unembedding, or the families known (``hooks.mechanism.families``)."""
    get = getattr(model, "get_output_embeddings", None)
    if (get() if callable(get) else None) is None:
        raise ConfigError(f"{key}: {type(model).__name__} has no unembedding (get_output_embeddings()); {reader} "
                          f"reads a causal language model; valid: {', '.join(CAUSAL_MODELS)}")
    return vocabulary(model, key)


def capped(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """The family's final logit soft-cap, ``cap * tanh(logits / cap)`` (Gemma2), as the model applies it."""
    return logits if not cap else cap * torch.tanh(logits / cap)


def own_call(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module.forward(x)``: the lens's reading, which no hook on ``module`` sees (see the module doc). A
    module FSDP2 shards on its own has its parameters gathered around it (``unshard``/``reshard``), as its
    own hooks would gather them; every rank reads the same blocks, so the ranks gather together."""
    fsdp = sys.modules.get("torch.distributed.fsdp")  # imported by whoever sharded the model
    if fsdp is None or not isinstance(module, fsdp.FSDPModule):
        return module.forward(x)
    module.unshard()
    try:
        return module.forward(x)
    finally:
        module.reshard()


@register("logit_lens")
class LogitLens(SampleOutputs):
    """Forward hooks reading each block's output through the final norm and unembedding; changes nothing."""

    spec_class = LogitLensSpec
    writes = (LENS,)

    def __init__(self, name: str, spec: LogitLensSpec) -> None:
        super().__init__(name, spec)
        self._rows: dict[str, list] = {column: [] for column in LENS_SCHEMA.names}
        self._tokens: torch.Tensor | None = None
        self._pending: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # this pass's (layer, samples, logits)

    pytorch_hooks = ("register_forward_hook (block outputs) + register_forward_pre_hook and register_forward_hook "
                     "(the model's input tokens and output logits)")

    def targets(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """The selected blocks, once the model is known to be one the lens reads (its refusal comes first)."""
        lens_parts(model, self.key)
        return super().targets(model)

    def attach(self, model: nn.Module, session) -> None:
        vocab = lens_parts(model, self.key)
        self._norm, self._unembedding, self._cap = vocab.modules["ln_final"], vocab.modules["unembed"], vocab.softcap
        self._blocks = {name: i for i, (name, _) in enumerate(self.targets(model))}
        self._canonical = {name: vocab.canonical(name) for name in self._blocks}
        session.add(model.register_forward_pre_hook(self._on_input, with_kwargs=True))
        session.add(model.register_forward_hook(self._on_output))
        super().attach(model, session)

    def _on_input(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        tokens = kwargs.get("input_ids", args[0] if args else None)
        self._tokens = tokens if isinstance(tokens, torch.Tensor) and not tokens.is_floating_point() else None
        self._pending = []

    def check(self, layer: str, x: torch.Tensor) -> None:
        width = self._unembedding.weight.shape[-1]
        if x.dim() != 3 or x.shape[-1] != width:
            raise ConfigError(f"{self.key}.layers: '{layer}' outputs {list(x.shape)}; the lens reads block outputs "
                              f"[batch, positions, {width}] (the unembedding's width)")
        if self.spec.target == NEXT and self._tokens is None:
            raise ConfigError(f"{self.key}.target: '{NEXT}' needs token ids as the model's input; give a token id")
        vocab = self._unembedding.weight.shape[0]
        if self.spec.target not in (FINAL, NEXT) and self.spec.target >= vocab:
            raise ConfigError(f"{self.key}.target: {self.spec.target} is not a token of a vocabulary of {vocab}")

    def take(self, layer: str, x: torch.Tensor, samples: torch.Tensor) -> None:
        if not self.session.recorder.enabled:
            return  # a pass aside, or a step sample.every leaves out
        with torch.no_grad():
            logits = capped(own_call(self._unembedding, own_call(self._norm, x.detach())), self._cap)
            self._pending.append((layer, samples, logits.double().cpu()))

    def _on_output(self, module: nn.Module, args: tuple, output: Any) -> None:
        pending, self._pending = self._pending, []
        logits = next((t for _, t in walk(output)), None)
        if self.spec.target == FINAL and (logits is None or logits.dim() != 3):
            raise ConfigError(f"{self.key}.target: '{FINAL}' needs the model to return logits [batch, positions, "
                              f"vocab]; it returned {list(logits.shape) if logits is not None else 'no tensor'}")
        if pending:
            final = logits.detach().argmax(-1).cpu() if self.spec.target == FINAL else None
            for layer, samples, block_logits in pending:
                self._add_rows(layer, samples, block_logits, final)

    def _add_rows(self, layer: str, samples: torch.Tensor, logits: torch.Tensor, final: torch.Tensor | None) -> None:
        batch, positions, vocab = logits.shape
        target = final if final is not None else self._targets_of(batch, positions)
        have = target >= 0
        picked = logits.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        rank = (logits > picked.unsqueeze(-1)).sum(-1)
        prob = torch.softmax(logits, -1).gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        top = torch.topk(logits, min(self.spec.top_k, vocab), dim=-1)
        n = batch * positions
        rows = self._rows
        rows["hook"] += [self.name] * n
        rows["layer"] += [layer] * n
        rows["canonical"] += [self._canonical[layer]] * n
        rows["block"] += [self._blocks[layer]] * n
        rows["step"] += [self.session.step] * n
        rows["sample"] += samples.repeat_interleave(positions).tolist()
        rows["position"] += list(range(positions)) * batch
        rows["top_ids"] += top.indices.reshape(n, -1).tolist()
        rows["top_logits"] += top.values.reshape(n, -1).tolist()
        rows["target"] += target.reshape(-1).tolist()
        rows["target_logit"] += torch.where(have, picked, torch.nan).reshape(-1).tolist()
        rows["target_prob"] += torch.where(have, prob, torch.nan).reshape(-1).tolist()
        rows["target_rank"] += torch.where(have, rank, -1).reshape(-1).tolist()

    def _targets_of(self, batch: int, positions: int) -> torch.Tensor:
        """The ``next`` or fixed target token of each (sample, position), -1 where there is none."""
        if self.spec.target != NEXT:
            return torch.full((batch, positions), int(self.spec.target))
        tokens = self._tokens.cpu()
        return torch.cat([tokens[:, 1:], torch.full((batch, 1), -1, dtype=tokens.dtype)], dim=1).long()

    def tables(self) -> dict[str, dict[str, list]]:
        self.report_unseen(set(self._rows["layer"]))
        return {LENS: self._rows} if self._rows["hook"] else {}
