"""circuit-tracer 0.5 as the attribution graphs' oracle, offline, on small random models saved as transformers saves
them (GPT-2 and Llama) with random circuit-tracer per-layer skip JumpReLU transcoders (``tests/graph_oracle.py``
runs ``tests/circuit_tracer_graph.py`` in circuit-tracer's venv, ``HOOK_RUNNER_CIRCUIT_TRACER_PYTHON``).

What circuit-tracer computes, checked here against plain float64 PyTorch on the folder's own model: its model is
the folder's (logits to 1e-5); its features are the transcoders' on each MLP's input (the point after the norm
before the MLP), none at position 0 (the special token it wants first); its logit targets are the most probable
tokens of the last position until their probability reaches 0.95 (at most 10); and a feature's edge to a logit
is the feature's activation times its decoder row through the final norm with its scale frozen, against the
logit's unembedding row minus the mean row (demeaned logits)."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from graph_oracle import circuit_tracer_graph, graph_run, model_folder, tables_of, transcoder_folder

transformers = pytest.importorskip("transformers")

IDS = [0, 5, 9, 3, 17, 2, 40, 11]


def parts(model, family: str):
    """The blocks, the final norm and how it scales (GPT-2's centres first), and the unembedding ``[vocab, d]``."""
    if family == "gpt2":
        return list(model.transformer.h), model.transformer.ln_f, True, model.lm_head.weight
    return list(model.model.layers), model.model.norm, False, model.lm_head.weight


def float64_pass(folder, family: str, ids: list[int]):
    """The folder's model in float64: its logits, each block's MLP input, and the final norm's input."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    blocks, norm, _, _ = parts(model, family)
    seen = {}
    handles = [block.mlp.register_forward_pre_hook(lambda m, args, i=i: seen.__setitem__(i, args[0][0]))
               for i, block in enumerate(blocks)]
    handles.append(norm.register_forward_pre_hook(lambda m, args: seen.__setitem__("final", args[0][0])))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    for handle in handles:
        handle.remove()
    return model, logits, seen


def jumprelu(x: torch.Tensor, weights: dict[str, torch.Tensor]) -> torch.Tensor:
    pre = x @ weights["W_enc"].double().T + weights["b_enc"].double()
    return pre * (pre > weights["activation_function.threshold"].double())


@pytest.mark.oracles
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_circuit_tracer_s_graph_offline_is_the_float64_definition_on_the_saved_model(tmp_path, family):
    folder, tcs = model_folder(tmp_path / "model", family), transcoder_folder(tmp_path / "transcoders")
    graph = circuit_tracer_graph(folder, tcs, IDS, tmp_path / "out")
    t = graph.tensors
    model, logits, seen = float64_pass(folder, family, IDS)
    assert t["input_tokens"].tolist() == IDS  # the first id is special: nothing prepended
    torch.testing.assert_close(t["logits"].double(), logits, atol=1e-5, rtol=0)

    # the logit targets: most probable first, until 0.95 of the mass (at most 10)
    probs = torch.softmax(logits[-1], -1)
    top = probs.sort(descending=True)
    n = min(10, int((top.values.cumsum(0) < 0.95).sum()) + 1)
    assert t["logit_token_ids"].tolist() == top.indices[:n].tolist()
    torch.testing.assert_close(t["logit_probabilities"].double(), top.values[:n], atol=1e-6, rtol=0)

    # the features: each transcoder on its MLP's input, position 0 left out
    layers = [load_file(tcs / f"layer_{i}.safetensors") for i in range(2)]
    acts = torch.stack([jumprelu(seen[i], layers[i]) for i in range(2)])
    acts[:, 0] = 0
    assert t["active_features"].tolist() == acts.nonzero().tolist()
    torch.testing.assert_close(t["activation_values"].double(), acts[acts != 0], atol=1e-5, rtol=0)

    # a last-block feature at the last position reaches each logit only through the frozen final norm
    _, norm, centred, unembed = parts(model, family)
    x = seen["final"][-1]
    scale = (x - x.mean() if centred else x).pow(2).mean().add(norm.eps if centred else norm.variance_epsilon).sqrt()
    n_feat, last = len(t["selected_features"]), len(IDS) - 1
    columns = [j for j, (layer, pos, _) in enumerate(t["active_features"].tolist()) if layer == 1 and pos == last]
    assert columns, "no feature of the last block at the last position: the check below would check nothing"
    features = t["active_features"][columns, 2]
    with torch.no_grad():
        directions = (unembed[t["logit_token_ids"]] - unembed.mean(0)) * norm.weight / scale  # [logits, d]
        directions = directions - directions.mean(1, keepdim=True) if centred else directions
        expected = directions @ (acts[1, last, features, None] * layers[1]["W_dec"][features].double()).T
    logit_rows = n_feat + (int(t["n_layers"]) + 1) * len(IDS)  # after the features, the error nodes and the tokens
    got = t["adjacency_matrix"][logit_rows:][:, columns]
    torch.testing.assert_close(got.double(), expected, atol=1e-6, rtol=1e-5)  # 3e-8 seen, edges up to 0.28


@pytest.mark.oracles
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_graph_entry_s_graph_equals_circuit_tracer_s_and_exports_to_its_json(tmp_path, family):
    """``hooks=[transcoder,graph]`` on the folder's model: its nodes are circuit-tracer's (order, kinds, tokens,
    activations), its edges its adjacency matrix, its pruning its ``prune_graph`` (kept nodes and edges,
    cumulative influence), and its tables' JSON the one circuit-tracer's ``create_graph_files`` writes."""
    pytest.importorskip("hooks.types.graph", reason="the graph hook type (branch graphs) is not merged in")
    from runner.analysis.graph_json import graph_json
    from runner.analysis.load import load_table

    folder, tcs = model_folder(tmp_path / "model", family), transcoder_folder(tmp_path / "transcoders")
    graph = circuit_tracer_graph(folder, tcs, IDS, tmp_path / "out")
    run = graph_run(folder, tcs, [IDS], tmp_path / "run")
    nodes, edges = (load_table(run, name).drop(columns=["run_dir"]) for name in ("graph_nodes.parquet", "graph_edges.parquet"))
    their_nodes, their_edges = tables_of(graph)
    nodes = nodes.sort_values("node").reset_index(drop=True)
    exact = ["node", "kind", "layer", "position", "feature", "token_id", "token", "kept"]
    for column in exact:
        assert nodes[column].tolist() == their_nodes[column].tolist(), column
    for column in ("activation", "influence", "probability"):
        torch.testing.assert_close(torch.tensor(nodes[column].astype(float).fillna(-1).to_numpy()),
                                   torch.tensor(their_nodes[column].astype(float).fillna(-1).to_numpy()),
                                   atol=1e-5, rtol=0, msg=column)
    adjacency = torch.zeros_like(graph.tensors["adjacency_matrix"], dtype=torch.float64)
    at = torch.tensor(edges.target.tolist()), torch.tensor(edges.source.tolist())
    adjacency[at] = torch.tensor(edges.weight.tolist(), dtype=torch.float64)
    # 3.2e-7 (GPT-2, edges up to 0.82) and 4.5e-7 (Llama, up to 3.1) measured
    torch.testing.assert_close(adjacency, graph.tensors["adjacency_matrix"].double(), atol=1e-5, rtol=0)
    kept = torch.zeros_like(graph.tensors["edge_mask"])
    kept[at] = torch.tensor(edges.kept.tolist())
    assert torch.equal(kept, graph.tensors["edge_mask"])

    ours = graph_json(nodes, edges, slug="oracle", scan="oracle", node_threshold=0.8,
                      prompt=graph.json["metadata"]["prompt"])
    assert ours["metadata"] == graph.json["metadata"]
    assert [n["node_id"] for n in ours["nodes"]] == [n["node_id"] for n in graph.json["nodes"]]
    assert [(l["source"], l["target"]) for l in ours["links"]] == [(l["source"], l["target"]) for l in graph.json["links"]]
    assert max(abs(a["weight"] - b["weight"]) for a, b in zip(ours["links"], graph.json["links"])) < 1e-5
