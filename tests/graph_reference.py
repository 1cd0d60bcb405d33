"""A hand-written float64 attribution graph, for the tests of ``hooks.types.graph``: the model's forward written
out (GPT-2 and Llama) with its attention patterns and norm scales taken from a normal float64 forward and held
fixed, each MLP replaced by its transcoder's reconstruction plus the error term, the features' activations held
at their values. That model is affine in every node's vector at its write point, so a direct effect is exactly
the change of the target's pre-activation when the source's vector is taken out: no gradient is taken."""
from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from test_transcoder import hand_features, hand_transcoder


def frozen_parts(model: nn.Module, ids: torch.Tensor, folder: Path) -> dict:
    """From a normal float64 forward: each norm's scale, each block's attention pattern, MLP input and output,
    and each block's transcoder tensors (float64) and features."""
    model = copy.deepcopy(model).double()
    model.set_attn_implementation("eager")
    norm_inputs: dict[str, torch.Tensor] = {}
    mlp: dict[int, tuple] = {}
    handles = []
    for name, module in model.named_modules():
        if "norm" in type(module).__name__.lower() and hasattr(module, "weight"):
            handles.append(module.register_forward_pre_hook(
                lambda m, a, name=name: norm_inputs.__setitem__(name, a[0][0].detach())))
    blocks = blocks_of(model)
    for i, block in enumerate(blocks):
        handles.append(block.mlp.register_forward_hook(
            lambda m, a, out, i=i: mlp.__setitem__(i, (a[0][0].detach(), out[0].detach()))))
    with torch.no_grad():
        out = model(ids[None], output_attentions=True)
    for handle in handles:
        handle.remove()
    weights = [hand_transcoder(folder, i) for i in range(len(blocks))]
    features = [hand_features(w, mlp[i][0]) for i, w in enumerate(weights)]
    return {"model": model, "norm_inputs": norm_inputs, "patterns": [a[0] for a in out.attentions], "mlp": mlp,
            "weights": weights, "features": features, "logits": out.logits[0]}


def blocks_of(model: nn.Module) -> nn.ModuleList:
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def reconstruction(w: dict, f: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    out = f @ w["W_dec"] + w["b_dec"]
    return out + m @ w["W_skip"].T if "W_skip" in w else out


def frozen_norm(x: torch.Tensor, norm: nn.Module, x_seen: torch.Tensor) -> torch.Tensor:
    """The norm with the scale it had on ``x_seen`` (its input in the normal forward)."""
    if isinstance(norm, nn.LayerNorm):
        scale = (x_seen.var(-1, unbiased=False) + norm.eps).sqrt()
        return (x - x.mean(-1, keepdim=True)) / scale[:, None] * norm.weight + norm.bias
    scale = (x_seen.pow(2).mean(-1) + norm.variance_epsilon).sqrt()
    return x / scale[:, None] * norm.weight


def attention_values(block: nn.Module, a: torch.Tensor, pattern: torch.Tensor) -> torch.Tensor:
    """The attention's output with its pattern ``[heads, P, P]`` fixed: the pattern times the values, projected."""
    heads, positions = pattern.shape[0], a.shape[0]
    if hasattr(block, "attn"):  # GPT-2: fused c_attn [q | k | v], Conv1D weights [in, out]
        attn, width = block.attn, a.shape[-1]
        v = (a @ attn.c_attn.weight + attn.c_attn.bias)[:, 2 * width:]
        z = pattern @ v.reshape(positions, heads, -1).transpose(0, 1)
        return z.transpose(0, 1).reshape(positions, -1) @ attn.c_proj.weight + attn.c_proj.bias
    attn = block.self_attn
    v = (a @ attn.v_proj.weight.T + attn.v_proj.bias).reshape(positions, -1, attn.head_dim).transpose(0, 1)
    z = pattern @ v.repeat_interleave(heads // v.shape[0], 0)
    return z.transpose(0, 1).reshape(positions, -1) @ attn.o_proj.weight.T + attn.o_proj.bias


def norms_of(block: nn.Module) -> tuple[nn.Module, nn.Module]:
    if hasattr(block, "ln_1"):
        return block.ln_1, block.ln_2
    return block.input_layernorm, block.post_attention_layernorm


def frozen_forward(parts: dict, ids: torch.Tensor, taken: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The frozen model's logits ``[P, vocab]`` and each block's MLP input, with the vectors ``taken``
    (``("embed",)`` or ``("mlp", i)`` -> ``[P, d]``) taken out at their write points."""
    model = parts["model"]
    names = {module: name for name, module in model.named_modules()}
    seen = lambda norm: parts["norm_inputs"][names[norm]]  # noqa: E731
    positions = len(ids)
    if hasattr(model, "transformer"):
        h = model.transformer.wte.weight[ids] + model.transformer.wpe.weight[:positions]
        final = model.transformer.ln_f
    else:
        h = model.model.embed_tokens.weight[ids]
        final = model.model.norm
    h = h - taken.get(("embed",), 0)
    reads = []
    with torch.no_grad():
        for i, block in enumerate(blocks_of(model)):
            ln1, ln2 = norms_of(block)
            h = h + attention_values(block, frozen_norm(h, ln1, seen(ln1)), parts["patterns"][i])
            m = frozen_norm(h, ln2, seen(ln2))
            reads.append(m)
            w, f = parts["weights"][i], parts["features"][i]
            m_seen, y_seen = parts["mlp"][i]
            error = y_seen - reconstruction(w, f, m_seen)
            h = h + reconstruction(w, f, m) + error - taken.get(("mlp", i), 0)
        logits = frozen_norm(h, final, seen(final)) @ model.lm_head.weight.T
    return logits, reads


def node_vectors(parts: dict, ids: torch.Tensor, nodes) -> dict[int, tuple[tuple, torch.Tensor]]:
    """Each source node of the graph's table ``nodes`` (one prompt's) -> (write point, its ``[P, d]`` vector there)."""
    found = {}
    d = parts["mlp"][0][1].shape[-1]
    model = parts["model"]
    embed = model.transformer.wte.weight if hasattr(model, "transformer") else model.model.embed_tokens.weight
    for node in nodes.itertuples():
        vector = torch.zeros(len(ids), d, dtype=torch.float64)
        if node.kind == "feature":
            w, f = parts["weights"][node.layer], parts["features"][node.layer]
            vector[node.position] = f[node.position, node.feature] * w["W_dec"][node.feature]
            found[node.node] = (("mlp", node.layer), vector)
        elif node.kind == "error":
            if node.position != 0:  # circuit-tracer's zero position: the error node's vector is 0
                w, f = parts["weights"][node.layer], parts["features"][node.layer]
                m_seen, y_seen = parts["mlp"][node.layer]
                vector[node.position] = (y_seen - reconstruction(w, f, m_seen))[node.position]
            found[node.node] = (("mlp", node.layer), vector)
        elif node.kind == "embedding":
            vector[node.position] = embed[ids[node.position]].detach()
            found[node.node] = (("embed",), vector)
    return found


def target_values(parts: dict, nodes, logits: torch.Tensor, reads: list) -> dict[int, torch.Tensor]:
    """Each target node's pre-activation: a logit minus the mean logit (last position); a feature's MLP input
    times its encoder row."""
    values = {}
    for node in nodes.itertuples():
        if node.kind == "logit":
            values[node.node] = logits[-1, node.token_id] - logits[-1].mean()
        elif node.kind == "feature":
            encoder = parts["weights"][node.layer]["W_enc"]
            values[node.node] = reads[node.layer][node.position] @ encoder[:, node.feature]
    return values


def reference_adjacency(model: nn.Module, ids: torch.Tensor, folder: Path, nodes) -> torch.Tensor:
    """The float64 adjacency (rows targets, columns sources) over the nodes of the graph's table ``nodes``."""
    parts = frozen_parts(model, ids, folder)
    logits, reads = frozen_forward(parts, ids, {})
    assert torch.allclose(logits, parts["logits"], atol=1e-9), "the frozen model is not the model at the prompt"
    full = target_values(parts, nodes, logits, reads)
    adjacency = torch.zeros(len(nodes), len(nodes), dtype=torch.float64)
    for source, (point, vector) in node_vectors(parts, ids, nodes).items():
        without = target_values(parts, nodes, *frozen_forward(parts, ids, {point: vector}))
        for target, value in full.items():
            adjacency[target, source] = value - without[target]
    return adjacency
