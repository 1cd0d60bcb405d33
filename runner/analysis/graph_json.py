"""A prompt's attribution graph as the JSON circuit-tracer's viewer and Neuronpedia read.

``graph_nodes.parquet`` and ``graph_edges.parquet`` (a ``graph`` entry's tables, ``common.records``) hold every
prompt's full graph; ``graph_json`` turns one prompt's rows into what circuit-tracer 0.5's
``create_graph_files`` writes for the same graph (its pydantic ``Model``, ``circuit_tracer/frontend/
graph_models.py``): ``metadata``, ``qParams``, the pruned graph's ``nodes`` and ``links``.

As circuit-tracer writes them: the nodes pruning keeps (``kept``), in node order, each an embedding, a logit or
a node some kept edge touches; the links are the kept edges between kept nodes, by target then source, ``weight``
the direct effect. Its ids: a feature ``{layer}_{feature}_{position}``, an error node ``0_{layer}_{position}``, an
embedding ``E_{token_id}_{position}``, a logit ``{n_layers + 1}_{token_id}_{position}``; ``influence`` is the
table's (circuit-tracer's cumulative influence; none for a logit), ``activation`` a feature's (none for the rest);
the most probable logit is the target logit. A row's ``token`` (decoded by the entry's tokenizer) names the
prompt's tokens and the logits' outputs; without a tokenizer, the id in brackets.

``python -m runner.graph_json RUN_DIR --sample N --out DIR/SLUG.json`` writes one prompt's file and lists it in
``DIR/graph-metadata.json``: ``DIR`` is then a folder circuit-tracer's viewer serves (``main``).
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import pandas as pd
import yaml

from common.durable import replaced
from common.errors import ConfigError, choice_error
from common.records import GRAPH_EDGES, GRAPH_NODES
from common.tokenizers import load_tokenizer

#: The list of graphs circuit-tracer's viewer shows, beside their files
INDEX = "graph-metadata.json"
#: circuit-tracer's ``feature_type`` of each kind of node (a per-layer transcoder's features too are "cross layer")
FEATURE_TYPES = {"feature": "cross layer transcoder", "error": "mlp reconstruction error", "embedding": "embedding",
                 "logit": "logit"}
#: The viewer's initial state, as circuit-tracer writes it
Q_PARAMS = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
PROMPT = ["hook", "step", "sample"]


def cantor(x: int, y: int) -> int:
    """circuit-tracer's ``feature`` number of a transcoder feature: the Cantor pairing of (layer, feature)."""
    return (x + y) * (x + y + 1) // 2 + y


def token_text(row) -> str:
    """A row's decoded token; its id in brackets where the entry had no tokenizer."""
    return row.token if isinstance(row.token, str) else f"[{row.token_id}]"


def node_json(row, n_layers: int, n_positions: int, target: bool) -> dict:
    """One node as circuit-tracer's ``Node`` dumps it (every field, in its order)."""
    layer, pos, kind = int(row.layer), int(row.position), row.kind
    influence = None if kind == "logit" else float(row.influence)
    if kind == "feature":
        feature = int(row.feature)
        own = dict(node_id=f"{layer}_{feature}_{pos}", feature=cantor(layer, feature), layer=str(layer),
                   jsNodeId=f"{layer}_{feature}-0", activation=float(row.activation))
    elif kind == "error":
        own = dict(node_id=f"0_{layer}_{pos}", feature=-1, layer=str(layer), jsNodeId=f"{layer}_{pos}-0")
    elif kind == "embedding":
        own = dict(node_id=f"E_{row.token_id}_{pos}", feature=pos, layer="E", jsNodeId=f"E_{row.token_id}-{pos}")
    else:
        pos, prob = n_positions - 1, float(row.probability)
        own = dict(node_id=f"{n_layers + 1}_{row.token_id}_{pos}", feature=int(row.token_id), layer=str(n_layers + 1),
                   jsNodeId=f"L_{row.token_id}-{pos}", token_prob=prob, is_target_logit=target,
                   clerp=f'Output "{token_text(row)}" (p={prob:.3f})')
    return {"node_id": own["node_id"], "feature": own["feature"], "layer": own["layer"], "ctx_idx": pos,
            "feature_type": FEATURE_TYPES[kind], "token_prob": own.get("token_prob", 0.0),
            "is_target_logit": own.get("is_target_logit", False), "run_idx": 0, "reverse_ctx_idx": 0,
            "jsNodeId": own["jsNodeId"], "clerp": own.get("clerp", ""), "influence": influence,
            "activation": own.get("activation")}


def graph_json(nodes: pd.DataFrame, edges: pd.DataFrame, slug: str, scan: str, node_threshold: float | None = None,
               prompt: str | None = None) -> dict:
    """The graph JSON of one prompt's ``graph_nodes`` and ``graph_edges`` rows (``select_prompt`` picks them
    from a run's tables). ``slug`` names the graph, ``scan`` the transcoders (Neuronpedia's id of the set);
    ``node_threshold`` is recorded as the metadata's; ``prompt`` is the prompt's text (by default its tokens
    joined, which is the text for byte-level tokenizers such as GPT-2's and Llama 3's)."""
    prompts = pd.concat([nodes[PROMPT], edges[PROMPT]]).astype(object).drop_duplicates()
    if len(prompts) != 1:
        raise ValueError(f"graph_json takes one prompt's rows; these hold {len(prompts)} (hook, step, sample): "
                         "select one with select_prompt")
    nodes = nodes.sort_values("node")
    embeddings, logits = nodes[nodes.kind == "embedding"], nodes[nodes.kind == "logit"]
    if logits.empty or embeddings.empty:
        raise ValueError("a graph has embedding and logit nodes; these rows have "
                         f"{len(embeddings)} embeddings and {len(logits)} logits")
    n_layers, n_positions, target = int(logits.layer.iloc[0]), len(embeddings), int(logits.node.iloc[0])
    kept = nodes[nodes.kept.astype(bool)]
    ids = set(kept.node.tolist())
    linked = edges[edges.kept.astype(bool) & edges.source.isin(ids) & edges.target.isin(ids)]
    linked = linked.sort_values(["target", "source"])
    json_of = {int(row.node): node_json(row, n_layers, n_positions, int(row.node) == target)
               for row in kept.itertuples(index=False)}
    touched = set(linked.source.tolist()) | set(linked.target.tolist())
    tokens = [token_text(row) for row in embeddings.sort_values("position").itertuples(index=False)]
    metadata = {"slug": slug, "scan": scan, "transcoder_list": [], "prompt_tokens": tokens,
                "prompt": "".join(tokens) if prompt is None else prompt, "node_threshold": node_threshold,
                "schema_version": 1}
    used = [json_of[node] for node, kind in zip(kept.node.tolist(), kept.kind.tolist())
            if node in touched or kind in ("embedding", "logit")]
    links = [{"source": json_of[int(source)]["node_id"], "target": json_of[int(target)]["node_id"],
              "weight": float(weight)} for source, target, weight in zip(linked.source, linked.target, linked.weight)]
    return {"metadata": metadata, "qParams": copy.deepcopy(Q_PARAMS), "nodes": used, "links": links}


def select_prompt(nodes: pd.DataFrame, edges: pd.DataFrame, sample: int, step: int | None = None,
                  hook: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows of one prompt of a run's tables: ``sample``, and ``step`` and ``hook`` where the sample has
    graphs at several; a ``ConfigError`` (one line, the valid choices) when there is no such prompt or it is
    ambiguous."""
    chosen = nodes
    for key, value in (("sample", sample), ("step", step), ("hook", hook)):
        if value is None:
            if chosen[key].nunique() > 1:
                raise ConfigError(f"--{key}: sample {sample} has graphs at several; choose one of "
                                  f"{', '.join(map(str, sorted(chosen[key].unique())))}")
            continue
        if value not in set(chosen[key].tolist()):
            raise choice_error(f"--{key}", value, map(str, sorted(chosen[key].unique())), key)
        chosen = chosen[chosen[key] == value]
    prompt = chosen[PROMPT].drop_duplicates()
    return chosen, edges.merge(prompt, on=PROMPT)


def decoded(nodes: pd.DataFrame, tokenizer: str | None) -> str | None:
    """The prompt's text as circuit-tracer's metadata holds it (its tokenizer's ``decode`` of the prompt's ids),
    by the entry's tokenizer; ``None`` without one."""
    if tokenizer is None:
        return None
    ids = nodes[nodes.kind == "embedding"].sort_values("position").token_id.tolist()
    return load_tokenizer(tokenizer, "the graph entry's tokenizer").decode(ids)


def add_to_index(metadata: dict, folder: Path) -> Path:
    """Record a graph's ``metadata`` in ``folder``'s ``graph-metadata.json``, the list circuit-tracer's viewer
    shows (replacing a graph of the same slug), as circuit-tracer's ``add_graph_metadata`` does."""
    index = Path(folder) / INDEX
    graphs = json.loads(index.read_text())["graphs"] if index.exists() else []
    graphs = [graph for graph in graphs if graph["slug"] != metadata["slug"]] + [metadata]
    with replaced(index) as tmp:
        tmp.write_text(json.dumps({"graphs": graphs}, indent=2))
    return index


def export(run_dir: str | Path, sample: int, out: str | Path, step: int | None = None, hook: str | None = None,
           scan: str | None = None) -> Path:
    """Write the graph JSON of one prompt of the run at ``run_dir`` to ``out`` (whole or not at all), record it in
    ``graph-metadata.json`` beside it, and return ``out``. The graph's slug is ``out``'s name without ``.json``
    (the viewer opens ``<slug>.json``); ``scan`` defaults to the slug; the metadata's ``node_threshold`` is the
    entry's and the prompt's text its tokenizer's decoding, where the run saved its config."""
    from runner.analysis.load import config_of, load_table, run_dirs

    out = Path(out)
    if out.suffix != ".json":
        raise ConfigError(f"--out: '{out}' is not a .json file (the viewer opens <slug>.json)")
    runs = run_dirs(run_dir)
    if len(runs) != 1:
        raise ConfigError(f"{run_dir}: holds {len(runs)} runs; give one run's directory, e.g. {runs[0]}")
    nodes, edges = select_prompt(load_table(runs[0], GRAPH_NODES), load_table(runs[0], GRAPH_EDGES), sample, step, hook)
    entry = (yaml.safe_load(config_of(runs[0]) or "{}").get("hooks") or {}).get(nodes.hook.iloc[0], {})
    graph = graph_json(nodes, edges, out.stem, scan or out.stem, entry.get("node_threshold"),
                       decoded(nodes, entry.get("tokenizer")))
    out.parent.mkdir(parents=True, exist_ok=True)
    with replaced(out) as tmp:
        tmp.write_text(json.dumps(graph, indent=2))
    add_to_index(graph["metadata"], out.parent)
    return out


def main(argv: list[str] | None = None) -> None:
    """``python -m runner.graph_json RUN_DIR --sample N --out FILE``: a bad path or prompt is one line, status 2."""
    parser = argparse.ArgumentParser(prog="python -m runner.graph_json", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a run directory with graph_nodes.parquet and graph_edges.parquet")
    parser.add_argument("--sample", type=int, required=True, help="the prompt's sample id")
    parser.add_argument("--out", required=True, help="the JSON file to write: <slug>.json")
    parser.add_argument("--step", type=int, help="the step, where the sample has graphs at several")
    parser.add_argument("--hook", help="the graph entry's name, where the run has several")
    parser.add_argument("--scan", help="the transcoders' id on Neuronpedia (default: the slug)")
    args = parser.parse_args(argv)
    try:
        written = export(args.run_dir, args.sample, args.out, args.step, args.hook, args.scan)
    except (FileNotFoundError, ConfigError) as exc:
        parser.exit(2, f"error: {exc}\n")
    print(f"wrote {written}", file=sys.stdout)
