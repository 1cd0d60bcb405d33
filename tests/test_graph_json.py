"""``runner.analysis.graph_json``: a prompt's ``graph_nodes`` / ``graph_edges`` rows as the graph JSON that
circuit-tracer's viewer and Neuronpedia read. A hand-made graph gives the JSON written out by hand; circuit-tracer
0.5's own reader (its pydantic ``Model``, in its venv) loads ours and its own ``Node`` constructors give the same
nodes; and for a graph circuit-tracer computed (``tests/graph_oracle.py``), our JSON of its tables equals the
one its ``create_graph_files`` writes, nodes and links, weights and influences to 1e-6. The command writes one
prompt's file and says a bad path or prompt in one line, status 2, writing nothing."""
from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from docs_text import blocks, section
from graph_oracle import CT_PYTHON, UNSET, circuit_tracer_graph, graph_run, model_folder, tables_of, transcoder_folder
from runner.analysis.graph_json import add_to_index, graph_json, main, select_prompt

PAGE = "how-to/graph-json.md"
NODE_COLUMNS = ["node", "kind", "layer", "position", "feature", "token_id", "token", "activation", "probability",
                "influence", "kept"]
#: A two-block graph over three tokens: three features, six error nodes, three embeddings, two logits
NODES = [(0, "feature", 0, 1, 4, 12, " cat", 1.25, None, 0.5, True),
         (1, "feature", 1, 1, 3, 12, " cat", 0.5, None, 0.9, False),  # pruned: its edge to node 2 goes
         (2, "feature", 1, 2, 7, 30, " sat", 2.0, None, 0.25, True),
         *[(3 + layer * 3 + pos, "error", layer, pos, -1, [0, 12, 30][pos], None, 0.0, None, 0.95, False)
           for layer in range(2) for pos in range(3)],
         (9, "embedding", -1, 0, -1, 0, "<|endoftext|>", 0.0, None, 1.0, True),
         (10, "embedding", -1, 1, -1, 12, " cat", 0.0, None, 0.75, True),
         (11, "embedding", -1, 2, -1, 30, None, 0.0, None, 0.8, True),  # no tokenizer's text: its id in brackets
         (12, "logit", 2, 2, -1, 5, " on", 3.5, 0.6, 1.0, True),
         (13, "logit", 2, 2, -1, 9, " down", 2.75, 0.3, 1.0, True)]
EDGES = [(10, 0, 0.5, True), (1, 2, 0.1, True), (0, 2, 0.25, True), (2, 12, 1.5, True), (8, 12, -0.75, True),
         (2, 13, 0.2, False), (11, 13, 0.05, True), (4, 12, 0.3, False)]  # pruned edges: 2 -> 13, 4 -> 12


def hand_made(sample: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    nodes = pd.DataFrame(NODES, columns=NODE_COLUMNS).assign(hook="graph", step=0, sample=sample)
    nodes.loc[[4, 8], "kept"] = True  # error nodes (0, 1) and (1, 2): no kept edge touches the first
    edges = pd.DataFrame(EDGES, columns=["source", "target", "weight", "kept"]).assign(hook="graph", step=0, sample=sample)
    return nodes, edges


def feature(node_id, number, layer, pos, js, influence, activation) -> dict:
    return dict(node_id=node_id, feature=number, layer=layer, ctx_idx=pos, feature_type="cross layer transcoder",
                token_prob=0.0, is_target_logit=False, run_idx=0, reverse_ctx_idx=0, jsNodeId=js, clerp="",
                influence=influence, activation=activation)


def test_a_hand_made_graph_s_json_is_circuit_tracer_s_format_to_the_letter():
    got = graph_json(*hand_made(), slug="cat", scan="gpt2-tiny", node_threshold=0.8)
    assert got["metadata"] == {"slug": "cat", "scan": "gpt2-tiny", "transcoder_list": [],
                               "prompt_tokens": ["<|endoftext|>", " cat", "[30]"], "prompt": "<|endoftext|> cat[30]",
                               "node_threshold": 0.8, "schema_version": 1}
    assert got["qParams"] == {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    nodes = {node["node_id"]: node for node in got["nodes"]}
    # kept nodes in node order; the error node no kept edge touches is left out, as circuit-tracer leaves it
    assert list(nodes) == ["0_4_1", "1_7_2", "0_1_2", "E_0_0", "E_12_1", "E_30_2", "3_5_2", "3_9_2"]
    assert nodes["0_4_1"] == feature("0_4_1", 14, "0", 1, "0_4-0", 0.5, 1.25)  # (0 + 4)(0 + 5) / 2 + 4
    assert nodes["1_7_2"] == feature("1_7_2", 43, "1", 2, "1_7-0", 0.25, 2.0)  # (1 + 7)(1 + 8) / 2 + 7
    assert nodes["0_1_2"] == {**feature("0_1_2", -1, "1", 2, "1_2-0", 0.95, None),
                              "feature_type": "mlp reconstruction error"}
    assert nodes["E_12_1"] == {**feature("E_12_1", 1, "E", 1, "E_12-1", 0.75, None), "feature_type": "embedding"}
    assert nodes["3_5_2"] == {**feature("3_5_2", 5, "3", 2, "L_5-2", None, None), "feature_type": "logit",
                              "token_prob": 0.6, "is_target_logit": True, "clerp": 'Output " on" (p=0.600)'}
    assert nodes["3_9_2"]["is_target_logit"] is False and nodes["3_9_2"]["clerp"] == 'Output " down" (p=0.300)'
    # kept edges between kept nodes, by target then source
    assert got["links"] == [{"source": "E_12_1", "target": "0_4_1", "weight": 0.5},
                            {"source": "0_4_1", "target": "1_7_2", "weight": 0.25},
                            {"source": "1_7_2", "target": "3_5_2", "weight": 1.5},
                            {"source": "0_1_2", "target": "3_5_2", "weight": -0.75},
                            {"source": "E_30_2", "target": "3_9_2", "weight": 0.05}]


def test_rows_of_several_prompts_are_refused_and_select_prompt_names_the_valid_samples():
    nodes, edges = (pd.concat(pair) for pair in zip(hand_made(0), hand_made(3)))
    with pytest.raises(ValueError, match=r"one prompt's rows; these hold 2 \(hook, step, sample\)"):
        graph_json(nodes, edges, slug="s", scan="s")
    chosen = select_prompt(nodes, edges, 3)
    assert graph_json(*chosen, slug="s", scan="s") == graph_json(*hand_made(3), slug="s", scan="s")
    with pytest.raises(ValueError, match=r"^--sample: unknown sample '2'; valid: 0, 3"):
        select_prompt(nodes, edges, 2)
    later = [frame.assign(step=1) for frame in hand_made(3)]
    nodes, edges = pd.concat([nodes, later[0]]), pd.concat([edges, later[1]])
    with pytest.raises(ValueError, match=r"^--step: sample 3 has graphs at several; choose one of 0, 1$"):
        select_prompt(nodes, edges, 3)
    assert graph_json(*select_prompt(nodes, edges, 3, step=1), slug="s", scan="s") == \
           graph_json(*later, slug="s", scan="s")


READER = """
import json, sys
from circuit_tracer.frontend.graph_models import Model, Node
text = open(sys.argv[1]).read()
model = Model.model_validate_json(text)
ours = json.loads(text)
assert model.model_dump() == ours, "the reader changed what it read"
n_layers = int(sys.argv[2])
rebuilt = []
for node in model.nodes:  # each node as circuit-tracer's own constructor makes it from its coordinates
    kind, layer, pos = node.feature_type, node.layer, node.ctx_idx
    if kind == "cross layer transcoder":
        feature = int(node.node_id.split("_")[1])
        rebuilt.append(Node.feature_node(int(layer), pos, feature, influence=node.influence, activation=node.activation))
    elif kind == "mlp reconstruction error":
        rebuilt.append(Node.error_node(int(layer), pos, influence=node.influence))
    elif kind == "embedding":
        rebuilt.append(Node.token_node(pos, int(node.node_id.split("_")[1]), influence=node.influence))
    else:
        token = node.clerp.split('"')[1]
        rebuilt.append(Node.logit_node(pos, node.feature, token, n_layers, node.is_target_logit, node.token_prob))
print(json.dumps([node.model_dump() for node in rebuilt]))
"""


@pytest.mark.oracles
@pytest.mark.skipif(not CT_PYTHON, reason=UNSET)
def test_circuit_tracer_s_reader_loads_our_json_and_its_constructors_make_the_same_nodes(tmp_path):
    got = graph_json(*hand_made(), slug="cat", scan="gpt2-tiny", node_threshold=0.8)
    (tmp_path / "graph.json").write_text(json.dumps(got))
    proc = subprocess.run([CT_PYTHON, "-c", READER, str(tmp_path / "graph.json"), "2"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == got["nodes"]


@pytest.mark.oracles
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_our_json_of_circuit_tracer_s_graph_equals_the_json_its_create_graph_files_writes(tmp_path, family):
    graph = circuit_tracer_graph(model_folder(tmp_path / "model", family), transcoder_folder(tmp_path / "tc"),
                                 [0, 5, 9, 3, 17, 2, 40, 11], tmp_path / "out")
    theirs = graph.json
    ours = graph_json(*tables_of(graph), slug="oracle", scan="oracle", node_threshold=0.8,
                      prompt=theirs["metadata"]["prompt"])  # the word-level tokenizer joins its words with spaces
    assert ours["metadata"] == theirs["metadata"] and ours["qParams"] == theirs["qParams"]
    index = add_to_index(ours["metadata"], tmp_path)  # the viewer's list of graphs
    assert json.loads(index.read_text()) == json.loads((tmp_path / "out" / "graph-metadata.json").read_text())
    assert len(theirs["links"]) > 20 and {n["feature_type"] for n in theirs["nodes"]} >= {"embedding", "logit",
                                                                                           "cross layer transcoder"}
    assert [n["node_id"] for n in ours["nodes"]] == [n["node_id"] for n in theirs["nodes"]]
    for mine, its in zip(ours["nodes"], theirs["nodes"]):
        for key in ("influence", "activation", "token_prob"):
            assert (mine[key] is None) == (its[key] is None) and abs((mine[key] or 0) - (its[key] or 0)) < 1e-6, key
        assert {k: v for k, v in mine.items() if k not in ("influence", "activation", "token_prob")} == \
               {k: v for k, v in its.items() if k not in ("influence", "activation", "token_prob")}
    assert [(l["source"], l["target"]) for l in ours["links"]] == [(l["source"], l["target"]) for l in theirs["links"]]
    assert max(abs(a["weight"] - b["weight"]) for a, b in zip(ours["links"], theirs["links"])) < 1e-6


@pytest.mark.parametrize("out, said", [("graph.json", "no-run"), ("graph.txt", "is not a .json file")])
def test_a_bad_path_or_out_is_one_line_status_2_and_nothing_written(tmp_path, capsys, out, said):
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path / "no-run"), "--sample", "0", "--out", str(tmp_path / "graphs" / out)])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err, err
    assert list(tmp_path.iterdir()) == []


def test_the_command_writes_a_run_s_prompts_into_a_viewer_s_folder_and_says_a_missing_sample_in_one_line(tmp_path, capsys):
    pytest.importorskip("hooks.types.graph", reason="the graph hook type (branch graphs) is not merged in")
    from runner.analysis.load import load_table

    run = graph_run(model_folder(tmp_path / "model", "gpt2"), transcoder_folder(tmp_path / "tc"),
                    [[0, 5, 9, 3], [0, 7, 7, 30]], tmp_path / "run")
    viewer = tmp_path / "viewer"
    viewer.mkdir()
    for sample, slug in ((1, "second"), (0, "first"), (1, "second")):
        main([str(run), "--sample", str(sample), "--out", str(viewer / f"{slug}.json")])
        assert capsys.readouterr().out.strip() == f"wrote {viewer / slug}.json"
    written = json.loads((viewer / "second.json").read_text())
    chosen = select_prompt(load_table(run, "graph_nodes.parquet"), load_table(run, "graph_edges.parquet"), 1)
    # the entry's tokenizer decodes the prompt; the entry gave no node_threshold
    assert written == graph_json(*chosen, slug="second", scan="second", prompt="<|endoftext|> but but tree")
    listed = json.loads((viewer / "graph-metadata.json").read_text())["graphs"]
    assert [graph["slug"] for graph in listed] == ["first", "second"]  # written again: listed once, last
    assert listed[1] == written["metadata"]
    assert written["metadata"]["prompt_tokens"] == ["<|endoftext|>", "but", "but", "tree"]  # the tokenizer's words
    assert written["links"] and all(link["weight"] for link in written["links"])

    with pytest.raises(SystemExit) as exited:
        main([str(run), "--sample", "7", "--out", str(viewer / "other.json")])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip() == "error: --sample: unknown sample '7'; valid: 0, 1"
    assert sorted(p.name for p in viewer.iterdir()) == ["first.json", "graph-metadata.json", "second.json"]


def test_the_how_to_s_commands_run_as_written_and_give_what_it_says(tmp_path, monkeypatch, capsys):
    pytest.importorskip("hooks.types.graph", reason="the graph hook type (branch graphs) is not merged in")
    from conftest import run_main
    from runner.analysis.load import load_table

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "fixtures").symlink_to(Path(__file__).parent / "fixtures")
    run_command, export_command = blocks(section(PAGE, "Write a prompt's graph"), "bash")[0].strip().splitlines()
    ran = run_main(monkeypatch, capsys, *shlex.split(run_command)[3:])
    assert ran.code == 0, ran.stderr
    main(shlex.split(export_command)[3:])
    assert capsys.readouterr().out.strip() == "wrote graphs/dog.json"
    written = json.loads(Path("graphs/dog.json").read_text())
    chosen = select_prompt(load_table("runs/two_graphs", "graph_nodes.parquet"), load_table("runs/two_graphs", "graph_edges.parquet"), 1)
    assert written == graph_json(*chosen, slug="dog", scan="dog", node_threshold=0.8, prompt="a dog sees the king")
    assert written["metadata"]["prompt_tokens"] == ["a", "dog", "sees", "the", "king"] and written["links"]
    assert json.loads(Path("graphs/graph-metadata.json").read_text()) == {"graphs": [written["metadata"]]}

    shown, = blocks(section(PAGE, "Mistakes are one line"), "text")
    with pytest.raises(SystemExit) as exited:
        main(["runs/two_graphs", "--sample", "7", "--out", "graphs/other.json"])
    assert (exited.value.code, capsys.readouterr().err.strip()) == (2, shown.strip())
    assert sorted(p.name for p in Path("graphs").iterdir()) == ["dog.json", "graph-metadata.json"]
