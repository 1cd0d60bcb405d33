"""circuit-tracer 0.5's attribution graphs, for the tests: a small random model saved as transformers saves it, random
circuit-tracer transcoders for it, and the graph, pruned graph and JSON circuit-tracer computes for one prompt,
by ``tests/circuit_tracer_graph.py`` run in circuit-tracer's own venv (``HOOK_RUNNER_CIRCUIT_TRACER_PYTHON``:
``python -m venv --system-site-packages DIR && DIR/bin/pip install "circuit-tracer==0.5.*"``), offline
(``HF_HUB_OFFLINE=1``, ``TRANSFORMERS_OFFLINE=1``). A test asking for a graph without that venv is skipped, saying so."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from transcoder_folders import circuit_tracer_transcoders

CT_PYTHON = os.environ.get("HOOK_RUNNER_CIRCUIT_TRACER_PYTHON")
UNSET = ("HOOK_RUNNER_CIRCUIT_TRACER_PYTHON is unset: circuit-tracer 0.5 lives in its own venv (python -m venv "
         "--system-site-packages DIR && DIR/bin/pip install 'circuit-tracer==0.5.*')")
SCRIPT = Path(__file__).with_name("circuit_tracer_graph.py")
TOKENIZER = Path(__file__).parent / "fixtures" / "tiny_tokenizer"
VOCAB = 61  # the tiny tokenizer's; its id 0, <|endoftext|>, is special: circuit-tracer then prepends nothing
SMALL = dict(num_hidden_layers=2, hidden_size=16, intermediate_size=32, vocab_size=VOCAB, max_position_embeddings=64,
             num_attention_heads=4, num_key_value_heads=2)


def model_config(family: str):
    """A 2-block model of ``family`` (``gpt2`` or ``llama``), d_model 16. GPT-2's carries ``n_ctx``, which
    transformers 5 no longer writes and TransformerLens 3 reads."""
    import transformers

    if family == "gpt2":
        return transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=64, n_ctx=64)
    return transformers.LlamaConfig(**SMALL)


def model_folder(folder: Path, family: str, seed: int = 0) -> Path:
    """A random ``family`` model (weights ~ N(0, 0.3)) and the tiny tokenizer, saved in ``folder``; the tokenizer's
    class is written as ``PreTrainedTokenizerFast``, which transformers 4 (circuit-tracer's) and 5 both read."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(model_config(family))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    model.save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(str(TOKENIZER), local_files_only=True).save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("backend", None)
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "PreTrainedTokenizerFast"}))
    return folder


def transcoder_folder(folder: Path, seed: int = 0, d_sae: int = 8) -> Path:
    """Skip JumpReLU transcoders for both blocks of a ``model_folder`` model, reading ``mlp.hook_in`` (the MLP's
    input) and writing ``hook_mlp_out``."""
    return circuit_tracer_transcoders(folder, blocks=2, d_model=16, d_sae=d_sae, skip=True, jumprelu=True, seed=seed)


def graph_run(folder: Path, tcs: Path, prompts: list[list[int]], out: Path) -> Path:
    """A run of ``hooks=[transcoder,graph]`` (every non-zero edge: ``keep_all``; tokens decoded by the folder's
    tokenizer) on the folder's model in float32, one pass of ``prompts``, with the transcoders spliced at every
    block's MLP; its directory."""
    import transformers

    import runner

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    entries = {"transcoder": {"type": "transcoder", "layers": "blocks.*.mlp", "path": str(tcs)},
               "graph": {"type": "graph", "layers": "blocks.*.mlp", "keep_all": True, "tokenizer": str(folder)}}
    with runner.attach(model, hooks=entries, out_dir=out) as attached:
        with torch.no_grad():
            model(torch.tensor(prompts))
        attached.step()
    return out


@dataclass
class OracleGraph:
    """What circuit-tracer computed: ``tensors`` (``adjacency_matrix`` rows targets and columns sources;
    ``active_features`` (layer, position, feature) rows; ``selected_features``; ``activation_values``;
    ``logit_token_ids``; ``logit_probabilities``; ``input_tokens``; ``prune_graph``'s ``node_mask``,
    ``edge_mask`` and ``cumulative_scores``; ``n_layers``; its model's ``logits``), the prompt's and the logit
    targets' decoded tokens, and the JSON ``create_graph_files`` wrote (slug and scan ``oracle``)."""

    tensors: dict[str, torch.Tensor]
    input_tokens: list[str]
    logit_tokens: list[str]
    json: dict


def circuit_tracer_graph(model_dir: Path, transcoder_dir: Path, ids: list[int], out_dir: Path,
                         batch_size: int = 8) -> OracleGraph:
    """circuit-tracer's ``attribute`` on ``ids`` (its defaults for the logit targets), skipping the test without its venv."""
    if not CT_PYTHON:
        pytest.skip(UNSET)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([CT_PYTHON, str(SCRIPT), str(model_dir), str(transcoder_dir), json.dumps(ids),
                           str(out_dir), str(batch_size)], capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
    assert proc.returncode == 0, proc.stderr[-2000:]
    decoded = json.loads((out_dir / "graph.json").read_text())
    return OracleGraph(load_file(out_dir / "graph.safetensors"), decoded["input_tokens"], decoded["logit_tokens"],
                       json.loads((out_dir / "oracle.json").read_text()))


def tables_of(graph: OracleGraph, hook: str = "graph", step: int = 0, sample: int = 0):
    """circuit-tracer's graph as ``graph_nodes`` and ``graph_edges`` rows (``common.records``' columns), one prompt:
    every node in its order, ``influence`` its cumulative score and ``kept`` its pruned node mask; every non-zero
    edge, ``kept`` its edge mask."""
    import pandas as pd

    t = graph.tensors
    n_layers, ids = int(t["n_layers"]), t["input_tokens"].tolist()
    n_pos, active = len(ids), t["active_features"][t["selected_features"]].tolist()
    values = t["activation_values"][t["selected_features"]].tolist()
    rows = [("feature", layer, pos, feature, ids[pos], graph.input_tokens[pos], value, None)
            for (layer, pos, feature), value in zip(active, values)]
    rows += [("error", layer, pos, -1, ids[pos], graph.input_tokens[pos], 0.0, None)
             for layer in range(n_layers) for pos in range(n_pos)]
    rows += [("embedding", -1, pos, -1, ids[pos], graph.input_tokens[pos], 0.0, None) for pos in range(n_pos)]
    last = t["logits"][-1]
    rows += [("logit", n_layers, n_pos - 1, -1, token, text, float(last[token]), float(p)) for token, text, p
             in zip(t["logit_token_ids"].tolist(), graph.logit_tokens, t["logit_probabilities"].tolist())]
    nodes = pd.DataFrame(rows, columns=["kind", "layer", "position", "feature", "token_id", "token", "activation",
                                        "probability"])
    nodes.insert(0, "node", range(len(nodes)))
    nodes = nodes.assign(influence=t["cumulative_scores"].tolist(), kept=t["node_mask"].tolist())
    target, source = t["adjacency_matrix"].nonzero(as_tuple=True)
    edges = pd.DataFrame({"source": source.tolist(), "target": target.tolist(),
                          "weight": t["adjacency_matrix"][target, source].tolist(),
                          "kept": t["edge_mask"][target, source].tolist()})
    return (frame.assign(hook=hook, step=step, sample=sample) for frame in (nodes, edges))
