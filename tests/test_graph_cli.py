"""``graph`` from the command line: a bad graph is one line with status 2 before the run, nothing written; a
sweep over ``data.shard`` merges into the tables the jobs wrote; the answer names each prompt's strongest path."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from common.records import GRAPH_EDGES_SCHEMA, GRAPH_NODES_SCHEMA
from transcoder_folders import saelens_transcoder

pytestmark = pytest.mark.statistics

pytest.importorskip("transformers")

FIXTURE = Path(__file__).parent / "fixtures" / "transcoders_gpt2_tiny"
GPT2 = ("model=gpt2_tiny", "data=tokens", "loss=none", "mode=eval")
GRAPH = ("hooks=[transcoder,graph]", f"hooks.transcoder.path={FIXTURE}")


@pytest.mark.parametrize("bad, message", [
    (("hooks=graph",),
     "error: hooks.graph: a graph is of the model's transcoders, and no transcoder entry is listed before it; list "
     "one: hooks=[transcoder,graph] with hooks.transcoder.path=DIR"),
    ((*GRAPH, "hooks.transcoder.layers=blocks.0.mlp"),
     "error: hooks.graph: no transcoder covers transformer.h.1.mlp (blocks.1.mlp); a graph needs one at every "
     "block's MLP, whose output would otherwise be no node: hooks.transcoder.layers=blocks.*.mlp"),
    ((*GRAPH, "hooks.graph.node_threshold=0"),
     "error: hooks.graph.node_threshold: 0.0 is not in (0, 1]; a fraction of probability or influence, e.g. "
     "hooks.graph.node_threshold=0.8"),
    ((*GRAPH, "hooks.graph.edge_threshold=1.5"),
     "error: hooks.graph.edge_threshold: 1.5 is not in (0, 1]; a fraction of probability or influence, e.g. "
     "hooks.graph.edge_threshold=0.98"),
    ((*GRAPH, "hooks.graph.desired_logit_prob=-0.1"),
     "error: hooks.graph.desired_logit_prob: -0.1 is not in (0, 1]; a fraction of probability or influence, e.g. "
     "hooks.graph.desired_logit_prob=0.95"),
    ((*GRAPH, "hooks.graph.layers=blocks.0.mlp"),
     "error: hooks.graph.layers: selects transformer.h.0.mlp; a graph is of every block's MLP: "
     "hooks.graph.layers=blocks.*.mlp"),
    ((*GRAPH, "hooks.transcoder.features=[1]", "hooks.transcoder.op=ablate"),
     "error: hooks.transcoder.op: 'ablate' edits the features after they are read, and the graph reads them as "
     "read; edit them with an entry on their module (hooks=[transcoder,ablate,graph], "
     "hooks.ablate.layers=blocks.0.mlp.transcoder)"),
    ((*GRAPH, "hooks.graph.units=/no/such/run"),
     "error: hooks.graph.units: no run at or under '/no/such/run' wrote units.parquet; name a units run over the same "
     "transcoders (hooks=[transcoder,units] hooks.units.layers=type:SaeFeatures)"),
    (("mode=train", *GRAPH),
     "error: hooks.graph: the model's dropout is on in training mode, and the graph's own passes would drop other "
     "parts than the step's; run mode=eval"),
    (("model.input_kind=tensor", "data=randn", "data.shape=[2,6]", *GRAPH),
     "error: hooks.graph: the model's input is torch.float32 [2, 6]; a graph is of a prompt's tokens [batch, "
     "positions]: data=text or data=tokens"),
])
def test_a_bad_graph_is_one_line_with_status_2_before_the_run(fault, bad, message):
    outcome = fault(*GPT2, *bad)
    assert (outcome.code, outcome.stderr) == (2, message)


def test_a_model_outside_the_families_vocabulary_is_one_line(fault, tmp_path):
    """A transcoder at a model's Linear layer (a SAELens folder fits any module) is no transformer's MLP."""
    folder = saelens_transcoder(tmp_path / "tc", 160, 5)
    outcome = fault("model=convnet", "data=randn", "loss=none", "mode=eval", "hooks=[transcoder,graph]",
                    f"hooks.transcoder.path={folder}", "hooks.transcoder.layers=fc", "hooks.graph.layers=fc")
    assert (outcome.code, outcome.stderr) == (2, (
        "error: hooks.graph: ConvNet (no Hugging Face config.model_type) is not a family the vocabulary knows; known: "
        "gpt2, gpt_neox, llama, mistral, qwen2, qwen3, gemma2, gemma3_text; declare one: a module named by "
        "model._module_ that registers a hooks.mechanism.families.Family with @FAMILIES.register "
        "(docs/how-to/model-families.md)"))


TOKENS = ("data.size=4", "data.shape=[2,6]", "epochs=1")


def without_job_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows as a job wrote them: no ``run_dir``, no override columns, no step (a shard numbers its own)."""
    schema = GRAPH_NODES_SCHEMA if "node" in frame.columns else GRAPH_EDGES_SCHEMA
    keep = [c for c in schema.names if c != "step"]
    frame = frame[keep].copy()
    for column in keep:  # a merged table holds repeated strings as categories
        if isinstance(frame[column].dtype, pd.CategoricalDtype):
            frame[column] = frame[column].astype(frame[column].cat.categories.dtype)
    return frame.sort_values(["sample", *keep[2:4]]).reset_index(drop=True)


def test_a_sweep_over_shards_merges_into_the_jobs_tables_and_the_unsharded_run_s(tmp_path, monkeypatch, capsys):
    """``data.shard=0,1`` over 4 prompts: the sweep's merged tables are its two jobs' own, side by side, and the
    same rows (but the step numbers) as one run over the 4 prompts."""
    from conftest import run_main
    from runner.analysis.graph import load_graphs
    from runner.analysis.load import run_dirs

    sweep = run_main(monkeypatch, capsys, *GPT2, *GRAPH, *TOKENS, "data.num_shards=2", "data.shard=0,1",
                     "--multirun", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    whole = run_main(monkeypatch, capsys, *GPT2, *GRAPH, *TOKENS, f"hydra.run.dir={tmp_path / 'whole'}")
    assert (sweep.code, whole.code) == (0, 0), sweep.stderr + whole.stderr
    jobs = run_dirs(tmp_path / "sweep")
    assert len(jobs) == 2
    for merged, *own in zip(load_graphs(tmp_path / "sweep"), *(load_graphs(job) for job in jobs)):
        assert sorted(set(merged["sample"])) == [0, 1, 2, 3]
        pd.testing.assert_frame_equal(without_job_columns(merged), without_job_columns(pd.concat(own)))
    for merged, alone in zip(load_graphs(tmp_path / "sweep"), load_graphs(tmp_path / "whole")):
        pd.testing.assert_frame_equal(without_job_columns(merged), without_job_columns(alone))


def every_path(nodes: pd.DataFrame, edges: pd.DataFrame) -> list[tuple[float, list[int]]]:
    """Every path over kept edges from an embedding to the most probable logit, with its product of shares
    (each edge's |weight| over the sum of |weight| of its target's kept incoming edges), enumerated."""
    kept = edges[edges.kept]
    into = kept.groupby("target").weight.apply(lambda w: w.abs().sum()).to_dict()
    sources = {}
    for edge in kept.itertuples():
        sources.setdefault(edge.target, []).append((edge.source, abs(edge.weight) / into[edge.target]))
    kinds = dict(zip(nodes.node, nodes.kind))
    logits = nodes[nodes.kind == "logit"]
    top = int(logits.node[logits.probability.idxmax()])

    def back(node):
        if kinds[node] == "embedding":
            return [(1.0, [node])]
        return [(product * share, path + [node]) for source, share in sources.get(node, [])
                for product, path in back(source)]
    return back(top)


def test_the_answer_names_each_prompt_s_strongest_path_as_enumerating_every_path_finds_it(tmp_path, monkeypatch,
                                                                                            capsys):
    from conftest import run_main
    from runner.analysis.graph import label, load_graphs

    ran = run_main(monkeypatch, capsys, *GPT2, *GRAPH, *TOKENS, f"hydra.run.dir={tmp_path / 'run'}")
    assert ran.code == 0, ran.stderr
    nodes, edges = load_graphs(tmp_path / "run")
    lines = [line.strip() for line in ran.stdout.splitlines() if line.strip().startswith("sample ")]
    assert len(lines) == 3  # the first three prompts of four
    for line in lines:
        sample = int(line.split()[1])
        own_nodes = nodes[nodes["sample"] == sample].set_index("node", drop=False)
        paths = every_path(own_nodes, edges[edges["sample"] == sample])
        product, path = max(paths)
        assert len(paths) > 1
        said = " -> ".join(label(own_nodes.loc[n]) for n in path)
        assert line.endswith(f": {said} (product {product:.3g})"), (line, said)


def test_the_answer_puts_each_feature_s_top_examples_from_a_units_run_beside_it(tmp_path, monkeypatch, capsys):
    """``hooks.graph.units`` names a ``units`` run over the same transcoders' features: a feature ``L<l> F<f>`` on a
    path is followed by unit ``f`` of block ``l``'s features module's top samples there, in order, with values."""
    from conftest import run_main
    from runner.analysis.units import load_units

    units = run_main(monkeypatch, capsys, *GPT2, "data.size=8", "data.shape=[4,6]", "epochs=1",
                     "hooks=[transcoder,units]", f"hooks.transcoder.path={FIXTURE}",
                     "hooks.units.layers=type:SaeFeatures",
                     f"hydra.run.dir={tmp_path / 'units'}")
    ran = run_main(monkeypatch, capsys, *GPT2, *GRAPH, *TOKENS, f"hooks.graph.units={tmp_path / 'units'}",
                   f"hydra.run.dir={tmp_path / 'run'}")
    assert (units.code, ran.code) == (0, 0), units.stderr + ran.stderr
    table = load_units(tmp_path / "units").set_index(["layer", "unit"])
    beside = [part for line in ran.stdout.splitlines() for part in line.split(" -> ") if "[top: " in part]
    assert beside  # a path of these prompts goes through a feature
    for part in beside:
        layer, feature = (int(word[1:]) for word in part.split()[:2])
        row = table.loc[(f"transformer.h.{layer}.mlp.transcoder", feature)]
        said = part.split("[top: ", 1)[1].rstrip("]").split("; ")
        assert [s.split(":")[0] for s in said] == [f"sample {s}" for s in row.top_sample[:3]]
        assert [s.rsplit("(", 1)[1].rstrip(")") for s in said] == [f"{v:.3g}" for v in row.top_value[:3]]
