"""``dla``: direct logit attribution, each part of the residual stream's share of a logit difference.

A GPT-2-like causal LM's final residual stream ``r`` (the input of its final ``LayerNorm``) is the sum of
the token and position embeddings and of each block's attention and MLP outputs; an attention output is
its heads' outputs (each head's slice of the output projection's input times its rows of the weight)
plus the projection's bias. The logits are ``unembedding(norm(r))``, so with the norm's scale ``s``
frozen (computed on the full ``r``, as TransformerLens's ``cache.apply_ln_to_stack`` does) the logit
difference ``logit[a] - logit[b]`` (``diff: [a, b]``, as ``metric.diff``) splits exactly into

    contribution(c) = ((c - mean(c)) / s) · (gamma ⊙ (W_U[a] - W_U[b]))

per part ``c``, plus a constant ``bias`` = ``beta · (W_U[a] - W_U[b]) + b_U[a] - b_U[b]``.

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
from hooks.lens import lens_parts
from hooks.recorder import walk
from hooks.registry import register
from hooks.samples import SampleOutputs
from hooks.specs.dla import DlaSpec

READER = "direct logit attribution"
#: The children naming a block's attention, its MLP and the attention's output projection, as GPT-2-like models name them.
ATTENTION, MLP, OUT_PROJ = ("attn", "self_attn", "attention"), ("mlp",), ("c_proj", "o_proj", "out_proj")


@dataclass
class Block:
    """One selected block's parts: its attention, MLP and the attention's output projection (``heads`` heads)."""

    module: nn.Module
    attn: nn.Module
    mlp: nn.Module
    out_proj: nn.Module
    heads: int


def child(module: nn.Module, names: tuple[str, ...]) -> nn.Module | None:
    return next((getattr(module, name) for name in names if isinstance(getattr(module, name, None), nn.Module)), None)


def block_parts(layer: str, block: nn.Module, key: str) -> Block:
    """A GPT-2-like block's parts, or one line saying what it lacks."""
    attn, mlp = child(block, ATTENTION), child(block, MLP)
    out_proj = child(attn, OUT_PROJ) if attn is not None else None
    heads = getattr(attn, "num_heads", None) or getattr(attn, "num_attention_heads", None)
    if mlp is None or out_proj is None or not heads:
        raise ConfigError(f"{key}.layers: '{layer}' ({type(block).__name__}) is not a transformer block with an "
                          f"attention ({'/'.join(ATTENTION)} with {'/'.join(OUT_PROJ)} and num_heads) and an "
                          f"mlp; select the blocks, e.g. {key}.layers=transformer.h.*")
    return Block(block, attn, mlp, out_proj, int(heads))


def head_weights(out_proj: nn.Module, heads: int) -> torch.Tensor:
    """The output projection's weight as ``[heads, head_dim, hidden]`` (GPT-2's ``Conv1D`` holds it ``[in, out]``,
    ``nn.Linear`` ``[out, in]``)."""
    weight = out_proj.weight if type(out_proj).__name__ == "Conv1D" else out_proj.weight.T
    return weight.reshape(heads, weight.shape[0] // heads, weight.shape[1])


def value_constant(block: nn.Module, attn: nn.Module, width: int) -> torch.Tensor | None:
    """The part of every value vector that no input changes (``[width]``, the output projection's input width): the
    values' bias plus the attention's input norm's bias through the value weights (GPT-2's fused ``c_attn``'s last
    third, or ``v_proj``); ``None`` when the attention's values are found in neither."""
    fused, values = getattr(attn, "c_attn", None), getattr(attn, "v_proj", None)
    if fused is not None:
        weight, bias = fused.weight[:, -width:], None if fused.bias is None else fused.bias[-width:]
    elif values is not None:
        weight, bias = values.weight.T, values.bias
    else:
        return None
    constant = weight.new_zeros(width) if bias is None else bias.detach()
    norm = child(block, ("ln_1", "input_layernorm"))
    norm_bias = getattr(norm, "bias", None)
    return constant + norm_bias.detach() @ weight.detach() if norm_bias is not None else constant


def first(output: Any) -> torch.Tensor:
    return next(t for _, t in walk(output))


@register("dla")
class DirectLogitAttribution(SampleOutputs):
    """Forward hooks reading the residual stream's parts; at the model's output, each part's share of the logit difference."""

    spec_class = DlaSpec
    writes = (DLA,)

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
        self._norm, self._unembedding = lens_parts(model, self.key, READER)
        if not isinstance(self._norm, nn.LayerNorm) or self._norm.weight is None or self._norm.bias is None:
            raise ConfigError(f"{self.key}: the final norm is a {type(self._norm).__name__}; direct logit attribution "
                              f"reads a LayerNorm with weight and bias (GPT-2's ln_f): model=gpt2_tiny, model=hf")
        if model.training and any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
            raise ConfigError(f"{self.key}: the model's dropout is on in training mode, and dropped parts do not add "
                              f"up to the logit difference; run mode=eval")
        base = model.base_model
        stack = next((m for m in base.children() if isinstance(m, nn.ModuleList)), nn.ModuleList())
        self._order = {}
        for name, module in self.targets(model):
            place = next((i for i, block in enumerate(stack) if block is module), None)
            if place is None:
                raise ConfigError(f"{self.key}.layers: '{name}' is not one of the model's blocks; select blocks, "
                                  f"e.g. {self.key}.layers=transformer.h.*")
            self._order[name] = place
        self._every_block = len(self._order) == len(stack)
        self._blocks = {name: block_parts(name, module, self.key) for name, module in self.targets(model)}
        embed, pos = base.get_input_embeddings(), getattr(base, "wpe", None)
        reads = [(embed, "embed"), *([(pos, "pos_embed")] if isinstance(pos, nn.Embedding) else [])]
        for layer, block in self._blocks.items():
            reads += [(block.attn, ("attn", layer)), (block.mlp, ("mlp", layer))]
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
            weights = head_weights(block.out_proj, block.heads).double()
            values = value_constant(block.module, block.attn, z.shape[-1])
            bias = weights.new_zeros(weights.shape[-1]) if block.out_proj.bias is None else block.out_proj.bias.double()
            if values is not None:  # the same at every position (a pattern's row sums to 1): attn_bias's, as TL folds it
                values = values.double().reshape(block.heads, 1, -1)
                z, bias = z - values.reshape(-1), bias + (values @ weights).sum(0).squeeze(0)
            heads = torch.einsum("bphd,hdo->bpho", z.reshape(*z.shape[:2], block.heads, -1), weights)
            parts += [("attn", layer, -1, at(seen[("attn", layer)])),
                      *[("head", layer, h, heads[:, :, h]) for h in range(block.heads)],
                      ("attn_bias", layer, -1, bias.expand(*heads.shape[:2], -1)),
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
        direction = self._norm.weight.double() * (weight[a] - weight[b])
        scale = (resid.var(-1, unbiased=False) + self._norm.eps).sqrt()  # the final norm's, frozen
        contributions = {(component, layer, head): ((x - x.mean(-1, keepdim=True)) / scale[..., None]) @ direction
                         for component, layer, head, x in parts}
        bias = self._norm.bias.double() @ (weight[a] - weight[b])
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
