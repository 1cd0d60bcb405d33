"""``dla``: direct logit attribution, each part of the residual stream's share of a logit difference.

A causal LM's final residual stream ``r`` (the input of its final norm) is the sum of the token (and, GPT-2,
position) embeddings and of each block's attention and MLP outputs (NeoX's parallel ones alike; Gemma's
after their output norms); an attention output is its heads' outputs (each head's slice of the output
projection's input times its rows of the weight) plus the projection's bias. The logits are
``unembedding(norm(r))``, so with the norm's scale ``s`` frozen (computed on the full ``r``, as
TransformerLens's ``cache.apply_ln_to_stack`` does) the logit difference ``logit[a] - logit[b]``
(``diff: [a, b]``, as ``metric.diff``) splits exactly into

    contribution(c) = (centred(c) / s) · (gain ⊙ (W_U[a] - W_U[b]))

per part ``c`` (centred for a LayerNorm, as is for an RMSNorm; ``gain`` the norm's weight, Gemma's
``1 + weight``), plus a constant ``bias`` = ``beta · (W_U[a] - W_U[b]) + b_U[a] - b_U[b]``. Gemma's output
norms are frozen the same way, at their scale on the whole attention output. The parts are the family's
(``hooks.mechanism.families``); a model whose logits are soft-capped (Gemma2) is refused: a capped difference does
not split.

Each pass adds to ``dla.parquet`` (``common.records.DLA_SCHEMA``), per sample at ``position`` (-1: the
last, which ``metric.diff`` reads; null: every position), one row per part: ``embed``, ``pos_embed``,
each selected block's ``attn`` and ``mlp``, ``rest`` (the blocks ``layers`` does not select) and
``bias``, which sum to the model's own logit difference (``logit_diff``, beside each row); and, finer,
each selected block's ``head`` rows and ``attn_bias``, which sum to its ``attn``. As TransformerLens
folds it into ``b_O``, what every value vector holds whatever the input (the values' bias and the
attention's input norm's bias through the value weights) is ``attn_bias``'s, not the heads'. Passes
aside and on the meta device add no rows. The parts are read by forward hooks that change nothing; a
pass whose parts do not add up (another entry edits between them) is refused in one line rather than
written, and a model whose dropout is on (training mode) before the run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from common.errors import ConfigError
from common.records import DLA, DLA_SCHEMA, DLA_WHOLE
from hooks.mechanism.families import Vocabulary, norm_gain, norm_linear, norm_scale
from hooks.types.lens import lens_parts
from hooks.mechanism.recorder import walk
from hooks.mechanism.registry import register
from hooks.types.samples import SampleOutputs
from hooks.specs.dla import DlaSpec

READER = "direct logit attribution"


@dataclass
class Block:
    """One selected block's parts: its attention, the attention's output projection (``heads`` heads), MLP,
    the constant every value vector holds, and the norms on the attention's and MLP's outputs (Gemma)."""

    attn: nn.Module
    out_proj: nn.Module
    mlp: nn.Module
    heads: int
    values: torch.Tensor | None
    attn_out_norm: nn.Module | None
    mlp_out_norm: nn.Module | None


def block_parts(vocab: Vocabulary, i: int) -> Block:
    """Block ``i``'s parts, as its family's table names them."""
    table, modules = vocab.table, vocab.modules
    attn = modules[f"blocks.{i}.attn"]
    values = table.value_constant(attn, modules[f"blocks.{i}.ln1"], vocab.heads, vocab.kv_heads)
    return Block(attn, modules[f"blocks.{i}.attn.out"], modules[f"blocks.{i}.mlp"], vocab.heads, values,
                 modules.get(f"blocks.{i}.ln_attn_out"), modules.get(f"blocks.{i}.ln_mlp_out"))


def head_weights(out_proj: nn.Module, heads: int, in_out: bool) -> torch.Tensor:
    """The output projection's weight as ``[heads, head_dim, hidden]`` (``in_out``: held ``[in, out]``, as
    GPT-2's ``Conv1D``; else ``nn.Linear``'s ``[out, in]``)."""
    weight = out_proj.weight if in_out else out_proj.weight.T
    return weight.reshape(heads, weight.shape[0] // heads, weight.shape[1])


def first(output: Any) -> torch.Tensor:
    return next(t for _, t in walk(output))


@register("dla")
class DirectLogitAttribution(SampleOutputs):
    """Forward hooks reading the residual stream's parts; at the model's output, each part's share of the logit difference."""

    spec_class = DlaSpec
    writes = (DLA,)
    _outside = ("embed", "pos_embed")  #: the parts read outside the blocks, named as the vocabulary names them

    pytorch_hooks = ("register_forward_hook (embeddings, attention and mlp outputs, block outputs, the model's "
                     "logits) + register_forward_pre_hook (output projections' inputs, the final norm's input)")

    def __init__(self, name: str, spec: DlaSpec) -> None:
        super().__init__(name, spec)
        self._rows: dict[str, list] = {column: [] for column in DLA_SCHEMA.names}
        self._read: dict[tuple, torch.Tensor] = {}  # this pass's parts, by (component, layer)
        self._samples: torch.Tensor | None = None

    def targets(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """The selected blocks, once the model is known to have a final norm and unembedding (its refusal comes first)."""
        lens_parts(model, self.key, READER)
        return super().targets(model)

    def attach(self, model: nn.Module, session) -> None:
        vocab = lens_parts(model, self.key, READER)
        self._norm, self._unembedding, self._how = vocab.modules["ln_final"], vocab.modules["unembed"], vocab.table.norm
        self._eps = vocab.table.eps
        if vocab.softcap:
            raise ConfigError(f"{self.key}: this {vocab.family} model caps its logits (c * tanh(logits / c), "
                              f"{vocab.table.softcap}={vocab.softcap}), and a capped logit difference does not split "
                              f"into parts that add up; direct logit attribution reads a model without the cap")
        if model.training and any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
            raise ConfigError(f"{self.key}: the model's dropout is on in training mode, and dropped parts do not add "
                              f"up to the logit difference; run mode=eval")
        stack = vocab.blocks()
        self._order, self._blocks, self._canonical = {}, {}, {}
        for name, module in self.targets(model):
            place = next((i for i, block in enumerate(stack) if block is module), None)
            if place is None:
                raise ConfigError(f"{self.key}.layers: '{name}' is not one of the model's blocks; select blocks, "
                                  f"e.g. {self.key}.layers=blocks.*")
            self._order[name], self._canonical[name] = place, f"blocks.{place}"
            self._blocks[name] = block_parts(vocab, place)
        self._every_block = len(self._order) == len(stack)
        self._in_out = vocab.table.weights_in_out
        reads = [(vocab.modules[what], what) for what in ("embed", "pos_embed") if what in vocab.modules]
        for layer, block in self._blocks.items():
            reads += [(block.attn_out_norm or block.attn, ("attn", layer)), (block.mlp_out_norm or block.mlp, ("mlp", layer)),
                      (block.out_proj, ("o", layer))]
            session.add(block.out_proj.register_forward_pre_hook(self._keep_input(("z", layer))))
        for module, what in reads:
            session.add(module.register_forward_hook(lambda m, a, out, what=what: self._keep(what, first(out))))
        session.add(self._norm.register_forward_pre_hook(self._keep_input("resid")))
        session.add(model.register_forward_pre_hook(self._on_input))
        session.add(model.register_forward_hook(self._on_output))
        super().attach(model, session)

    def _on_input(self, module: nn.Module, args: tuple) -> None:
        self._read, self._samples = {}, None

    def _keep(self, what, x: torch.Tensor) -> None:
        self._read[what] = x.detach()

    def _keep_input(self, what):
        return lambda module, args: self._keep(what, args[0])

    def check(self, layer: str, x: torch.Tensor) -> None:
        vocab = self._unembedding.weight.shape[0]
        if max(self.spec.diff) >= vocab:
            raise ConfigError(f"{self.key}.diff: {list(self.spec.diff)} are not tokens of a vocabulary of {vocab}")
        positions, where = x.shape[1], self.spec.position
        if where is not None and not -positions <= where < positions:
            raise ConfigError(f"{self.key}.position: {where} is not a position of '{layer}' output's {positions} "
                              f"(-1: the last; null: every position)")

    def take(self, layer: str, x: torch.Tensor, samples: torch.Tensor) -> None:
        self._samples = samples

    def _on_output(self, module: nn.Module, args: tuple, output: Any) -> None:
        seen, self._read = dict(self._read), {}
        resid = seen.get("resid")
        if resid is None or resid.is_meta or not self.session.recorder.enabled or self._samples is None:
            return  # the rehearsal, a pass aside, a step ``sample.every`` leaves out
        logits = first(output).detach()
        positions = range(resid.shape[1]) if self.spec.position is None else [self.spec.position % resid.shape[1]]
        with torch.no_grad():
            self._add_rows(seen, logits[:, positions].double(), list(positions))

    def parts(self, seen: dict, positions: list[int]) -> list[tuple[str, str, int, torch.Tensor]]:
        """(component, layer, head, ``[batch, positions, hidden]`` float64) of every part of the residual stream read."""
        at = lambda x: x[:, positions].double()  # noqa: E731
        parts = [(what, "", -1, at(seen[what])) for what in ("embed", "pos_embed") if what in seen]
        for layer, block in self._blocks.items():
            z = at(seen[("z", layer)])
            weights = head_weights(block.out_proj, block.heads, self._in_out).double()
            bias = weights.new_zeros(weights.shape[-1]) if block.out_proj.bias is None else block.out_proj.bias.double()
            if block.values is not None:  # the same at every position (a pattern's row sums to 1): attn_bias's, as TL folds it
                values = block.values.double().reshape(block.heads, 1, -1)
                z, bias = z - values.reshape(-1), bias + (values @ weights).sum(0).squeeze(0)
            heads = torch.einsum("bphd,hdo->bpho", z.reshape(*z.shape[:2], block.heads, -1), weights)
            bias = bias.expand(*heads.shape[:2], -1)
            if block.attn_out_norm is not None:  # Gemma: the attention's output normed before the residual, scale frozen
                scale = norm_scale(at(seen[("o", layer)]), block.attn_out_norm, self._how, self._eps)
                gain = norm_gain(block.attn_out_norm, self._how)
                heads = heads / scale[..., None, None] * gain
                bias = bias / scale[..., None] * gain
            parts += [("attn", layer, -1, at(seen[("attn", layer)])),
                      *[("head", layer, h, heads[:, :, h]) for h in range(block.heads)],
                      ("attn_bias", layer, -1, bias),
                      ("mlp", layer, -1, at(seen[("mlp", layer)]))]
        return parts

    def _add_rows(self, seen: dict, logits: torch.Tensor, positions: list[int]) -> None:
        resid = seen["resid"][:, positions].double()
        parts = self.parts(seen, positions)
        self._check_sums(resid, parts)
        whole = sum(x for component, _, _, x in parts if component in DLA_WHOLE)
        parts.append(("rest", "", -1, resid - whole))
        a, b = self.spec.diff
        weight = self._unembedding.weight.double()
        direction = norm_gain(self._norm, self._how) * (weight[a] - weight[b])
        scale = norm_scale(resid, self._norm, self._how, self._eps)  # the final norm's, frozen
        contributions = {(component, layer, head): norm_linear(x, scale, self._how) @ direction
                         for component, layer, head, x in parts}
        norm_bias = getattr(self._norm, "bias", None)
        bias = scale.new_zeros(()) if norm_bias is None else norm_bias.double() @ (weight[a] - weight[b])
        lm_bias = getattr(self._unembedding, "bias", None)
        if lm_bias is not None:
            bias = bias + lm_bias[a].double() - lm_bias[b].double()
        contributions[("bias", "", -1)] = bias.expand_as(scale)
        self._write(contributions, logits[..., a] - logits[..., b], scale, positions)

    def _check_sums(self, resid: torch.Tensor, parts: list) -> None:
        """Refuse a pass whose heads do not add up to their attention output, or whose parts (every block
        selected) do not add up to the residual stream: the attribution would not be of this model's pass."""
        def far(x: torch.Tensor, y: torch.Tensor) -> bool:
            return bool((x - y).abs().max() > 1e-4 * (1 + y.abs().max()))
        for layer in self._blocks:
            own = {(c, h): x for c, name, h, x in parts if name == layer}
            heads = sum(x for (c, _), x in own.items() if c in ("head", "attn_bias"))
            if far(heads, own[("attn", -1)]):
                raise ConfigError(f"{self.key}: '{layer}' attention output is not its heads' outputs plus the "
                                  f"output projection's bias: an entry edits between them; read the model unedited")
        if self._every_block and far(
                sum(x for c, _, _, x in parts if c in DLA_WHOLE), resid):
            raise ConfigError(f"{self.key}: the final norm's input is not the embeddings plus every block's attention "
                              f"and mlp outputs: an entry edits between them; read the model unedited")

    def _write(self, contributions: dict, logit_diff: torch.Tensor, scale: torch.Tensor, positions: list[int]) -> None:
        batch = logit_diff.shape[0]
        n = batch * len(positions)
        samples = self._samples.repeat_interleave(len(positions)).tolist()
        a, b = self.spec.diff
        rows = self._rows
        for (component, layer, head), value in contributions.items():
            rows["hook"] += [self.name] * n
            rows["step"] += [self.session.step] * n
            rows["sample"] += samples
            rows["position"] += positions * batch
            rows["component"] += [component] * n
            rows["layer"] += [layer] * n
            rows["canonical"] += [self._canonical.get(layer) or (component if component in self._outside else "")] * n
            rows["block"] += [self._order.get(layer, -1)] * n
            rows["head"] += [head] * n
            rows["target"] += [a] * n
            rows["other"] += [b] * n
            rows["contribution"] += value.reshape(-1).tolist()
            rows["logit_diff"] += logit_diff.reshape(-1).tolist()
            rows["scale"] += scale.reshape(-1).tolist()

    def tables(self) -> dict[str, dict[str, list]]:
        self.report_unseen(set(self._rows["layer"]))
        return {DLA: self._rows} if self._rows["hook"] else {}
