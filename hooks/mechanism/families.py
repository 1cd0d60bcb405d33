"""One vocabulary for every transformer family: each architecture's parts, declared once in a registered table.

GPT-2 calls its blocks ``transformer.h``, Llama ``model.layers``, GPT-NeoX ``gpt_neox.layers``; the methods
that need a model's parts (``logit_lens``, ``dla``) and the canonical selectors (``blocks.*.mlp``,
``ln_final``, see ``hooks.mechanism.select``) ask this module instead of guessing by class names. A ``Family`` is
a table of paths and quirks; ``FAMILIES.register(name)`` adds one, found from the Hugging Face config's
``model_type``. A model whose ``model_type`` no table names is refused in one line naming the known
families and how to declare one (a module named by ``model._module_`` that registers a table).

The vocabulary (``vocabulary(model)``) maps each canonical name to the module's own qualified name:

* ``embed``, ``pos_embed`` (learned positions only), ``ln_final``, ``unembed``;
* per block ``i``: ``blocks.i``, ``blocks.i.ln1``, ``blocks.i.attn``, ``blocks.i.attn.out`` (the output
  projection), ``blocks.i.ln2``, ``blocks.i.mlp``, and where the family has them ``blocks.i.attn.q_norm``,
  ``blocks.i.attn.k_norm`` (Qwen3, Gemma3), ``blocks.i.ln_attn_out`` and ``blocks.i.ln_mlp_out`` (Gemma's
  norms on the attention's and the MLP's outputs, before they join the residual stream).

Knows PyTorch modules and a model's ``config``, nothing of the runner.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from common.errors import ConfigError
from common.registry import Registry

#: Filled by the tables below and by a user's module (``model._module_``) registering its own.
FAMILIES = Registry("model.path", "model family")
#: How a family's norms compute: ``x`` centred (LayerNorm) or not (RMSNorm), times ``weight`` or ``1 + weight`` (Gemma).
LAYERNORM, RMSNORM, RMSNORM_PLUS_ONE = "layernorm", "rmsnorm", "rmsnorm_plus_one"
HOW_TO_DECLARE = ("declare one: a module named by model._module_ that registers a hooks.mechanism.families.Family with "
                  "@FAMILIES.register (docs/how-to/model-families.md)")


@dataclass(frozen=True)
class Family:
    """One architecture's parts (paths from the model's root, or from a block / its attention) and quirks."""

    model_types: tuple[str, ...]  #: the Hugging Face ``config.model_type`` values this table reads
    embed: str
    blocks: str  #: the ``nn.ModuleList`` of blocks
    attn: str  #: in a block
    out_proj: str  #: in the attention: its output projection, whose input is the heads' outputs side by side
    mlp: str
    ln1: str
    ln2: str
    ln_final: str
    unembed: str
    norm: str  #: LAYERNORM, RMSNORM or RMSNORM_PLUS_ONE: how every norm of the family computes
    eps: str  #: the norms' epsilon attribute
    value_constant: Callable[[nn.Module, nn.Module, int, int], torch.Tensor | None]
    pos_embed: str | None = None  #: learned position embeddings (GPT-2); rotary families have none
    ln_attn_out: str | None = None  #: a norm on the attention's output before the residual (Gemma)
    ln_mlp_out: str | None = None  #: a norm on the MLP's output before the residual (Gemma)
    qk_norms: tuple[str, str] | None = None  #: in the attention: norms on queries and keys (Qwen3, Gemma3)
    gated_mlp: bool = False  #: ``down(act(gate(x)) * up(x))`` (Llama) rather than ``out(act(in(x)))``
    parallel: str | None = None  #: the config flag making attention and MLP read the same input (NeoX)
    embed_scale: bool = False  #: the embedding multiplies by sqrt(hidden) (Gemma; inside its embedding module)
    softcap: str | None = None  #: the config field capping final logits as ``c * tanh(logits / c)`` (Gemma2)
    weights_in_out: bool = False  #: linear weights held ``[in, out]`` (GPT-2's ``Conv1D``), not ``nn.Linear``'s ``[out, in]``
    heads: str = "num_attention_heads"  #: config field: the attention's query heads
    kv_heads: str | None = None  #: config field: grouped key/value heads (grouped-query attention)


def _fused_values(attn: nn.Module, ln1: nn.Module, heads: int, kv_heads: int) -> torch.Tensor | None:
    """GPT-2: what every value vector holds whatever the input: the fused ``c_attn``'s value bias plus
    ``ln_1``'s bias through the value weights (``Conv1D`` holds its weight ``[in, out]``)."""
    width = attn.c_attn.weight.shape[1] // 3
    weight, bias = attn.c_attn.weight[:, -width:], attn.c_attn.bias[-width:]
    return bias.detach() + ln1.bias.detach() @ weight.detach()


def _interleaved_values(attn: nn.Module, ln1: nn.Module, heads: int, kv_heads: int) -> torch.Tensor | None:
    """GPT-NeoX: ``query_key_value`` lays each head's query, key and value side by side (``[heads, 3, head_dim]``)."""
    fused = attn.query_key_value
    hidden = fused.weight.shape[1]
    weight = fused.weight.reshape(heads, 3, -1, hidden)[:, 2].reshape(-1, hidden).detach()
    bias = weight.new_zeros(weight.shape[0]) if fused.bias is None else fused.bias.reshape(heads, 3, -1)[:, 2].reshape(-1)
    return bias.detach() + ln1.bias.detach() @ weight.T


def _grouped_values(attn: nn.Module, ln1: nn.Module, heads: int, kv_heads: int) -> torch.Tensor | None:
    """Llama-like: ``v_proj``'s bias, each key/value head's shared by its ``heads // kv_heads`` query heads
    (``repeat_kv``); an RMSNorm has no bias to add."""
    bias = attn.v_proj.bias
    if bias is None:
        return None
    return bias.detach().reshape(kv_heads, -1).repeat_interleave(heads // kv_heads, 0).reshape(-1)


FAMILIES.register("gpt2")(Family(
    model_types=("gpt2",), embed="transformer.wte", pos_embed="transformer.wpe", blocks="transformer.h",
    attn="attn", out_proj="c_proj", mlp="mlp", ln1="ln_1", ln2="ln_2", ln_final="transformer.ln_f",
    unembed="lm_head", norm=LAYERNORM, eps="eps", value_constant=_fused_values, weights_in_out=True))
FAMILIES.register("gpt_neox")(Family(
    model_types=("gpt_neox",), embed="gpt_neox.embed_in", blocks="gpt_neox.layers", attn="attention",
    out_proj="dense", mlp="mlp", ln1="input_layernorm", ln2="post_attention_layernorm",
    ln_final="gpt_neox.final_layer_norm", unembed="lm_head", norm=LAYERNORM, eps="eps",
    value_constant=_interleaved_values, parallel="use_parallel_residual"))
_LLAMA = dict(embed="model.embed_tokens", blocks="model.layers", attn="self_attn", out_proj="o_proj", mlp="mlp",
              ln1="input_layernorm", ln2="post_attention_layernorm", ln_final="model.norm", unembed="lm_head",
              norm=RMSNORM, eps="variance_epsilon", value_constant=_grouped_values, gated_mlp=True,
              kv_heads="num_key_value_heads")
FAMILIES.register("llama")(Family(model_types=("llama",), **_LLAMA))
FAMILIES.register("mistral")(Family(model_types=("mistral",), **_LLAMA))
FAMILIES.register("qwen2")(Family(model_types=("qwen2",), **_LLAMA))
FAMILIES.register("qwen3")(Family(model_types=("qwen3",), **{**_LLAMA, "qk_norms": ("q_norm", "k_norm")}))
_GEMMA = {**_LLAMA, "ln2": "pre_feedforward_layernorm", "ln_attn_out": "post_attention_layernorm",
          "ln_mlp_out": "post_feedforward_layernorm", "norm": RMSNORM_PLUS_ONE, "eps": "eps", "embed_scale": True}
FAMILIES.register("gemma2")(Family(model_types=("gemma2",), **{**_GEMMA, "softcap": "final_logit_softcapping"}))
FAMILIES.register("gemma3")(Family(model_types=("gemma3_text",), **{
    **_GEMMA, "softcap": "final_logit_softcapping", "qk_norms": ("q_norm", "k_norm")}))


def model_type(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None)


def family_of(model: nn.Module, key: str) -> tuple[str, Family]:
    """The registered family reading ``model``'s ``config.model_type``, or one line naming the known ones."""
    kind = model_type(model)
    for name in FAMILIES:
        table = FAMILIES.get(name).build
        if kind in table.model_types:
            return name, table
    known = ", ".join(t for name in FAMILIES for t in FAMILIES.get(name).build.model_types)
    what = f"model_type '{kind}'" if kind else "no Hugging Face config.model_type"
    raise ConfigError(f"{key}: {type(model).__name__} ({what}) is not a family the vocabulary knows; known: "
                      f"{known}; {HOW_TO_DECLARE}")


@dataclass
class Vocabulary:
    """A model's family and each canonical name's module (``names``: canonical -> qualified name)."""

    family: str
    table: Family
    config: Any
    names: dict[str, str]
    modules: dict[str, nn.Module]  #: canonical -> module

    def setting(self, field: str | None, default: Any = None) -> Any:
        """The model config's ``field`` (a quirk's flag or size), ``default`` when the family has none."""
        return default if field is None else getattr(self.config, field, default)

    @property
    def heads(self) -> int:
        return int(self.setting(self.table.heads))

    @property
    def kv_heads(self) -> int:
        return int(self.setting(self.table.kv_heads) or self.heads)

    @property
    def softcap(self) -> float | None:
        return self.setting(self.table.softcap)

    def quirks(self) -> list[str]:
        """What this model's family does its own way, in words (``plan=true`` prints them)."""
        table = self.table
        said = [table.norm, "gated mlp" if table.gated_mlp else "mlp"]
        said += [f"grouped key/value heads {self.heads}/{self.kv_heads}"] if self.kv_heads != self.heads else []
        said += ["q/k norms"] if table.qk_norms else []
        said += ["norms on attention and mlp outputs"] if table.ln_attn_out or table.ln_mlp_out else []
        said += ["parallel attention and mlp"] if self.setting(table.parallel, False) else []
        said += ["embedding scaled by sqrt(hidden)"] if table.embed_scale else []
        said += [f"final logits capped at {self.softcap}"] if self.softcap else []
        return said

    def canonical(self, real: str) -> str:
        """The canonical name of the module named ``real`` ("" when the vocabulary has none)."""
        return next((c for c, r in self.names.items() if r == real), "")

    def blocks(self) -> list[nn.Module]:
        return list(self.modules["blocks"])


def vocabulary(model: nn.Module, key: str) -> Vocabulary:
    """Every canonical name of ``model``'s family, resolved to its modules; a path the table names that
    the model lacks is one line (the table does not fit this model)."""
    family, table = family_of(model, key)
    found = dict(model.named_modules())
    # a wrapper (torch.compile's ``_orig_mod.``, DDP's ``module.``) puts its prefix before every path
    prefix = min((n[:-len(table.blocks)] for n in found if n == table.blocks or n.endswith("." + table.blocks)),
                 key=len, default="")
    names: dict[str, str] = {"embed": prefix + table.embed}
    if table.pos_embed:
        names["pos_embed"] = prefix + table.pos_embed
    names["blocks"] = prefix + table.blocks
    blocks = found.get(names["blocks"])
    for i in range(len(blocks) if isinstance(blocks, nn.ModuleList) else 0):
        block = f"{names['blocks']}.{i}"
        attn = f"{block}.{table.attn}"
        names |= {f"blocks.{i}": block, f"blocks.{i}.ln1": f"{block}.{table.ln1}", f"blocks.{i}.attn": attn,
                  f"blocks.{i}.attn.out": f"{attn}.{table.out_proj}", f"blocks.{i}.ln2": f"{block}.{table.ln2}",
                  f"blocks.{i}.mlp": f"{block}.{table.mlp}"}
        if table.qk_norms:
            names |= {f"blocks.{i}.attn.q_norm": f"{attn}.{table.qk_norms[0]}",
                      f"blocks.{i}.attn.k_norm": f"{attn}.{table.qk_norms[1]}"}
        for canonical, path in (("ln_attn_out", table.ln_attn_out), ("ln_mlp_out", table.ln_mlp_out)):
            if path:
                names[f"blocks.{i}.{canonical}"] = f"{block}.{path}"
    names |= {"ln_final": prefix + table.ln_final, "unembed": prefix + table.unembed}
    missing = [f"{c} ({r})" for c, r in names.items() if r not in found]
    if missing or not isinstance(blocks, nn.ModuleList):
        raise ConfigError(f"{key}: {type(model).__name__} lacks what the '{family}' family names: "
                          f"{', '.join(missing[:3]) or table.blocks + ' (a ModuleList)'}; its table does not fit this model")
    return Vocabulary(family, table, model.config, names, {c: found[r] for c, r in names.items()})


def known_vocabulary(model: nn.Module) -> Vocabulary | None:
    """``model``'s vocabulary when its family is known and fits it; None otherwise (what ``plan=true`` prints)."""
    try:
        return vocabulary(model, "model")
    except ConfigError:
        return None


def norm_scale(x: torch.Tensor, norm: nn.Module, how: str, eps: str) -> torch.Tensor:
    """The norm's divisor at each position of ``x`` (float64): sqrt(var + eps) for a LayerNorm,
    sqrt(mean(x^2) + eps) for an RMSNorm; what ``dla`` freezes."""
    x = x.double()
    spread = x.var(-1, unbiased=False) if how == LAYERNORM else x.pow(2).mean(-1)
    return (spread + getattr(norm, eps)).sqrt()


def norm_linear(x: torch.Tensor, scale: torch.Tensor, how: str) -> torch.Tensor:
    """``x``'s part of the norm's output before its gain, the scale frozen: centred for a LayerNorm."""
    x = x.double()
    return (x - x.mean(-1, keepdim=True) if how == LAYERNORM else x) / scale[..., None]


def norm_gain(norm: nn.Module, how: str) -> torch.Tensor:
    """The per-feature gain a norm multiplies by: ``weight``, or ``1 + weight`` (Gemma)."""
    weight = norm.weight.detach().double()
    return 1 + weight if how == RMSNORM_PLUS_ONE else weight
