"""``graph``: for each prompt, the attribution graph of the transcoders a ``transcoder`` entry splices at every
block's MLP (Ameisen et al. 2025, "Circuit tracing"; circuit-tracer 0.5's ``attribute``).

The nodes, in circuit-tracer's order: the active transcoder features (by layer, position, feature; none at
position 0, circuit-tracer's ``zero_positions``), an error node per layer and position (the MLP's output minus
its transcoder's reconstruction, zero at position 0), the token embedding at each position, and the logit
targets (the most probable tokens at the last position, at most ``max_n_logits``, until their probability
reaches ``desired_logit_prob``). The edge from a source to a target is

    weight = source's activation x the gradient of the target's pre-activation at the source's write point,

in the local replacement model: attention patterns and norm scales frozen (``hooks.types.graph_linear``), each
MLP's output a constant (its features' activations frozen, so an edge is a direct effect, not through another
feature) but for a skip transcoder's linear term, through which gradients pass as in circuit-tracer. A
feature writes ``a W_dec[f]`` into its MLP's output, an error node its vector there, an embedding its vector at
the embedding's output; a feature's pre-activation is its MLP's input times its encoder row, a logit's the
logit minus the mean logit. The gradients are taken in one pass of the prompt copied ``batch_size`` times (fewer
when the prompt has fewer targets: its logits and its features active in the step's pass), one target per copy,
one backward per that many targets.

The prompt's graph is pruned as circuit-tracer's ``prune_graph`` prunes (``hooks.types.graph_prune``) and
written to ``graph_nodes.parquet`` (every node, ``kept`` and ``influence`` from the pruning) and
``graph_edges.parquet`` (the kept edges; ``keep_all``: every non-zero one), ``common.records``. The graph is
computed in the model's forward hook of each step's pass, beside it: its own passes record nothing else
(``Recorder.aside``). It needs token ids (``data=text``, ``data=tokens``), a model of the families vocabulary
(``hooks.mechanism.families``) whose logits are not capped, and a transcoder at every block's MLP, listed
before it (``hooks=[transcoder,graph]``); anything else is one line before the run.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from common.errors import ConfigError
from common.records import GRAPH_EDGES, GRAPH_EDGES_SCHEMA, GRAPH_NODES, GRAPH_NODES_SCHEMA, UNITS
from common.tokenizers import load_tokenizer
from hooks.mechanism.families import vocabulary
from hooks.mechanism.recorder import walk
from hooks.mechanism.registry import register
from hooks.specs.graph import GraphSpec
from hooks.types.graph_linear import freezing_hooks
from hooks.types.graph_prune import prune
from hooks.types.samples import SampleOutputs
from hooks.types.transcoder import FEATURES, Transcoder

#: circuit-tracer's positions without feature or error nodes (its ``zero_positions``: the first token, which
#: collects attention whatever it is)
ZERO_POSITIONS = slice(0, 1)


def logit_targets(logits: torch.Tensor, max_n: int, desired: float) -> tuple[torch.Tensor, torch.Tensor]:
    """circuit-tracer's salient logits: the most probable tokens of ``logits`` (the last position's), at most
    ``max_n``, until their cumulative probability reaches ``desired``; their ids and probabilities."""
    probs = torch.softmax(logits, dim=-1)
    top_p, top_ids = torch.topk(probs, min(max_n, probs.shape[-1]))
    cutoff = int(torch.searchsorted(torch.cumsum(top_p, 0), desired)) + 1
    return top_ids[:cutoff], top_p[:cutoff]


def encoder_rows(tc: Any, d_in: int) -> torch.Tensor:
    """The transcoder's encoder as ``[d_in, d_sae]`` (``W_enc`` is held either way; a square one as SAELens
    holds it)."""
    w, d_sae = tc.W_enc, tc.W_dec.shape[0]
    return w if tuple(w.shape) == (d_in, d_sae) else w.T


def skip_term(tc: Any, read: torch.Tensor) -> torch.Tensor | None:
    skip = getattr(tc, "W_skip", None)
    return None if skip is None else read.to(skip.dtype) @ skip.T


@register("graph")
class AttributionGraph(SampleOutputs):
    """Per prompt, the attribution graph of the transcoders spliced before it (see the module docstring)."""

    spec_class = GraphSpec
    writes = (GRAPH_NODES, GRAPH_EDGES)
    pytorch_hooks = ("register_forward_pre_hook + register_forward_hook (the model: its token ids, then the graph "
                     "of each prompt); register_forward_hook on the embedding, each block's MLP and its "
                     "transcoder's features, the attention's query and key projections and the norms, acting only "
                     "in the graph's own passes")
    compile_problem = "runs passes of its own with gradients in the model's forward hook, not checked under compilation"

    def __init__(self, name: str, spec: GraphSpec) -> None:
        super().__init__(name, spec)
        self._nodes: dict[str, list] = {column: [] for column in GRAPH_NODES_SCHEMA.names}
        self._edges: dict[str, list] = {column: [] for column in GRAPH_EDGES_SCHEMA.names}
        self._tracing = False
        self._pass: dict[Any, torch.Tensor] = {}  # what the graph's own pass saw
        self._ids: torch.Tensor | None = None
        self._samples: torch.Tensor | None = None
        self._active: dict[int, torch.Tensor] = {}  # block -> the step's active features per prompt

    def check_spec(self) -> None:
        """The ``units`` run the answer reads examples from wrote ``units.parquet`` (at or under it: a sweep)."""
        units = self.spec.units
        if units is not None and not any(Path(units).rglob(UNITS)):
            raise ConfigError(f"{self.key}.units: no run at or under '{units}' wrote {UNITS}; name a units run over "
                              f"the same transcoders (hooks=[transcoder,units] hooks.units.layers=type:SaeFeatures)")

    @classmethod
    def check_with(cls, hooks: list) -> None:
        for place, hook in enumerate(hooks):
            if isinstance(hook, cls):
                splicers = [h for h in hooks[:place] if isinstance(h, Transcoder)]
                if not splicers:
                    raise ConfigError(f"{hook.key}: a graph is of the model's transcoders, and no transcoder entry is "
                                      f"listed before it; list one: hooks=[transcoder,{hook.name}] with "
                                      f"hooks.transcoder.path=DIR")
                edited = next((h for h in splicers if h.spec.op is not None), None)
                if edited is not None:
                    raise ConfigError(f"{edited.key}.op: '{edited.spec.op}' edits the features after they are read, "
                                      f"and the graph reads them as read; edit them with an entry on their module "
                                      f"(hooks=[transcoder,ablate,{hook.name}], "
                                      f"hooks.ablate.layers=blocks.0.mlp.{FEATURES})")

    def attach(self, model: nn.Module, session) -> None:
        vocab = vocabulary(model, self.key)
        if vocab.softcap:
            raise ConfigError(f"{self.key}: this {vocab.family} model caps its logits ({vocab.table.softcap}="
                              f"{vocab.softcap}); a graph's logit targets are of a model without the cap")
        if model.training and any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
            raise ConfigError(f"{self.key}: the model's dropout is on in training mode, and the graph's own passes "
                              f"would drop other parts than the step's; run mode=eval")
        self._model, self._vocab = model, vocab
        self._blocks = [vocab.names[f"blocks.{i}.mlp"] for i in range(len(vocab.blocks()))]
        self._check_layers(model)
        splicers = [h for h in session.hooks[:session.hooks.index(self)] if isinstance(h, Transcoder)]
        self._dictionaries = {}
        for splicer in splicers:
            self._dictionaries.update(splicer.dictionaries())
        missing = [f"{name} (blocks.{i}.mlp)" for i, name in enumerate(self._blocks) if name not in self._dictionaries]
        if missing:
            raise ConfigError(f"{self.key}: no transcoder covers {', '.join(missing)}; a graph needs one at every "
                              f"block's MLP, whose output would otherwise be no node: "
                              f"{splicers[0].key}.layers=blocks.*.mlp")
        for module, hook in freezing_hooks(vocab, self.key, lambda: self._tracing):
            session.add(module.register_forward_hook(hook))
        session.add(vocab.modules["embed"].register_forward_hook(self._at_embedding))
        for i, name in enumerate(self._blocks):
            mlp = model.get_submodule(name)
            session.add(mlp.register_forward_hook(functools.partial(self._at_mlp, i)))
            session.add(mlp.get_submodule(FEATURES).register_forward_hook(functools.partial(self._at_features, i)))
        session.add(model.register_forward_pre_hook(self._on_input, with_kwargs=True))
        session.add(model.register_forward_hook(self._on_output))
        super().attach(model, session)

    def _check_layers(self, model: nn.Module) -> None:
        """``layers`` must select every block's MLP, the modules the graph's transcoders splice."""
        selected = {name for name, _ in self.targets(model)}
        if selected != set(self._blocks):
            raise ConfigError(f"{self.key}.layers: selects {', '.join(sorted(selected)) or 'nothing'}; a graph is of "
                              f"every block's MLP: {self.key}.layers=blocks.*.mlp")

    # the graph's own pass -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _traced(self) -> Iterator[None]:
        self._tracing, self._pass = True, {}
        try:
            with self.session.recorder.aside(), torch.enable_grad():
                yield
        finally:
            self._tracing, self._pass = False, {}  # the pass's tensors and their graph go with it

    def _observe(self, layer: str, output: Any) -> None:
        if not self._tracing:
            super()._observe(layer, output)

    def _at_embedding(self, module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
        """The token embeddings as a leaf: their gradient is the embedding nodes' write point's."""
        if not self._tracing:
            return None
        self._pass["embed"] = leaf = out.detach().requires_grad_()
        return leaf

    def _at_features(self, i: int, module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        if self._tracing:
            self._pass["features", i] = out.detach()
        elif not out.is_meta:  # the step's pass: each prompt's active features, which bound its targets
            self._active[i] = (out[:, ZERO_POSITIONS.stop:] != 0).flatten(1).sum(1)

    def _at_mlp(self, i: int, module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
        """The MLP's output as a leaf (its nodes' write point), plus the skip term's gradient where there is one."""
        if not self._tracing:
            return None
        read = args[0]
        self._pass["read", i] = read
        self._pass["out", i] = leaf = out.detach().requires_grad_()
        skip = skip_term(self._dictionaries[self._blocks[i]], read)
        return leaf if skip is None else leaf + (skip - skip.detach()).to(leaf.dtype)

    # at the model's input and output ------------------------------------------------------------------------

    def _on_input(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self._tracing:
            return
        ids = args[0] if args else kwargs.get("input_ids")
        if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.dim() != 2:
            what = f"{ids.dtype} {list(ids.shape)}" if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise ConfigError(f"{self.key}: the model's input is {what}; a graph is of a prompt's tokens "
                              f"[batch, positions]: data=text or data=tokens")
        self._ids = ids

    def take(self, layer: str, x: torch.Tensor, samples: torch.Tensor) -> None:
        self._samples = samples

    def _on_output(self, module: nn.Module, args: tuple, output: Any) -> None:
        if self._tracing:
            return
        ids, samples, self._samples = self._ids, self._samples, None
        if ids is None or ids.is_meta or samples is None or not self.session.recorder.enabled:
            return  # the rehearsal, a pass aside, a step ``sample.every`` leaves out
        active, self._active = sum(self._active.values()), {}
        for row, sample, features in zip(ids, samples.tolist(), active.tolist()):
            self._graph(row, sample, min(self.spec.batch_size, self.spec.max_n_logits + features))

    def _graph(self, ids: torch.Tensor, sample: int, copies: int) -> None:
        """One prompt's graph, pruned, as rows: one target per copy of the prompt, ``copies`` at a time."""
        with self._traced():
            logits = next(t for _, t in walk(self._model(ids.expand(copies, -1))))
            nodes = self._nodes_of(ids, logits)
            adjacency = self._adjacency(nodes, logits, copies)
        kept = prune(adjacency, nodes["probabilities"], len(nodes["features"]), len(ids),
                     self.spec.node_threshold, self.spec.edge_threshold)
        self._write(sample, ids, nodes, adjacency, kept)

    def _nodes_of(self, ids: torch.Tensor, logits: torch.Tensor) -> dict[str, Any]:
        """The prompt's nodes from the first copy: active features ``[K, 3]`` (layer, position, feature) and their
        activations, error vectors ``[layers, positions, d]``, token vectors, logit targets."""
        layers = range(len(self._blocks))
        acts = torch.stack([self._pass["features", i][0] for i in layers]).detach()
        acts[:, ZERO_POSITIONS] = 0
        active = acts.nonzero()
        errors = []
        for i in layers:
            tc, read = self._dictionaries[self._blocks[i]], self._pass["read", i][0].detach()
            reconstruction = tc.decode(self._pass["features", i][0])
            skip = skip_term(tc, read)
            error = self._pass["out", i][0].detach() - (reconstruction if skip is None else reconstruction + skip)
            error[ZERO_POSITIONS] = 0
            errors.append(error)
        targets, probabilities = logit_targets(logits[0, -1].detach(), self.spec.max_n_logits,
                                               self.spec.desired_logit_prob)
        return {"features": active, "activations": acts[tuple(active.T)], "errors": torch.stack(errors),
                "tokens": self._pass["embed"][0].detach(), "targets": targets,
                "logits": logits[0, -1, targets].detach(), "probabilities": probabilities.double()}

    def _adjacency(self, nodes: dict, logits: torch.Tensor, copies: int) -> torch.Tensor:
        """Rows targets, columns sources, float64: the logits' rows, then the features'."""
        features, acts = nodes["features"], nodes["activations"]
        n_layers, n_pos = nodes["errors"].shape[:2]
        n_features, n_logits = len(features), len(nodes["targets"])
        logit_offset = n_features + (n_layers + 1) * n_pos
        adjacency = torch.zeros(logit_offset + n_logits, logit_offset + n_logits, dtype=torch.float64)
        decoders = torch.stack([self._dictionaries[self._blocks[int(l)]].W_dec[int(f)] for l, _, f in features]) \
            if n_features else nodes["tokens"].new_zeros(0, nodes["tokens"].shape[-1])
        decoders = decoders.double() * acts.double()[:, None]
        # targets: (row, kind, layer, position, direction)
        rows = [(logit_offset + j, "logit", n_layers, n_pos - 1, int(t)) for j, t in enumerate(nodes["targets"])]
        rows += [(k, "feature", int(l), int(p), int(f)) for k, (l, p, f) in enumerate(features)]
        leaves = [self._pass["embed"], *(self._pass["out", i] for i in range(n_layers))]
        for start in range(0, len(rows), copies):
            chunk = rows[start:start + copies]
            grads = torch.autograd.grad(self._chunk_value(chunk, logits), leaves, retain_graph=True,
                                        allow_unused=True)
            grads = [torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, grads)]
            embed, outs = grads[0].double(), torch.stack(grads[1:]).double()  # [copies, P, d], [L, copies, P, d]
            n = len(chunk)
            at = [row for row, *_ in chunk]
            if n_features:
                adjacency[at, :n_features] = torch.einsum(
                    "bkd,kd->bk", outs[features[:, 0], :n, features[:, 1]].transpose(0, 1), decoders)
            adjacency[at, n_features:n_features + n_layers * n_pos] = torch.einsum(
                "lbpd,lpd->blp", outs[:, :n], nodes["errors"].double()).reshape(n, -1)
            adjacency[at, n_features + n_layers * n_pos:logit_offset] = torch.einsum(
                "bpd,pd->bp", embed[:n], nodes["tokens"].double())
        return adjacency

    def _chunk_value(self, chunk: list, logits: torch.Tensor) -> torch.Tensor:
        """The sum over the chunk of each target's pre-activation, target ``j`` read in copy ``j``."""
        total = logits.new_zeros(())
        for j, (_, kind, layer, position, which) in enumerate(chunk):
            if kind == "logit":
                total = total + logits[j, position, which] - logits[j, position].mean()
            else:
                tc = self._dictionaries[self._blocks[layer]]
                read = self._pass["read", layer][j, position]
                total = total + read.to(tc.W_dec.dtype) @ encoder_rows(tc, read.shape[-1])[:, which]
        return total

    # rows -------------------------------------------------------------------------------------------------

    def _decoded(self, token_ids: list[int]) -> list[str | None]:
        tokenizer = self._tokenizer
        return [None] * len(token_ids) if tokenizer is None else [tokenizer.decode([t]) for t in token_ids]

    @functools.cached_property
    def _tokenizer(self) -> Any:
        if self.spec.tokenizer is None:
            return None
        return load_tokenizer(self.spec.tokenizer, f"{self.key}.tokenizer")

    def _write(self, sample: int, ids: torch.Tensor, nodes: dict, adjacency: torch.Tensor, kept) -> None:
        features, (n_layers, n_pos) = nodes["features"].tolist(), nodes["errors"].shape[:2]
        prompt = ids.tolist()
        targets = nodes["targets"].tolist()
        kinds = [("feature", l, p, f, prompt[p], float(a), None)
                 for (l, p, f), a in zip(features, nodes["activations"].tolist())]
        kinds += [("error", l, p, -1, prompt[p], 0.0, None) for l in range(n_layers) for p in range(n_pos)]
        kinds += [("embedding", -1, p, -1, prompt[p], 0.0, None) for p in range(n_pos)]
        kinds += [("logit", n_layers, n_pos - 1, -1, t, float(v), float(q))
                  for t, v, q in zip(targets, nodes["logits"].tolist(), nodes["probabilities"].tolist())]
        n = len(kinds)
        columns = ("kind", "layer", "position", "feature", "token_id", "activation", "probability")
        nodes_rows = self._nodes
        for column, values in zip(columns, zip(*kinds)):
            nodes_rows[column] += list(values)
        nodes_rows["token"] += self._decoded([k[4] for k in kinds])
        nodes_rows["hook"] += [self.name] * n
        nodes_rows["step"] += [self.session.step] * n
        nodes_rows["sample"] += [sample] * n
        nodes_rows["node"] += list(range(n))
        nodes_rows["influence"] += kept.influence.tolist()
        nodes_rows["kept"] += kept.nodes.tolist()
        written = adjacency != 0
        if not self.spec.keep_all:
            written &= kept.edges
        target, source = written.nonzero(as_tuple=True)
        m = len(target)
        edges = self._edges
        edges["hook"] += [self.name] * m
        edges["step"] += [self.session.step] * m
        edges["sample"] += [sample] * m
        edges["source"] += source.tolist()
        edges["target"] += target.tolist()
        edges["weight"] += adjacency[target, source].tolist()
        edges["kept"] += kept.edges[target, source].tolist()

    def tables(self) -> dict[str, dict[str, list]]:
        return {GRAPH_NODES: self._nodes, GRAPH_EDGES: self._edges} if self._nodes["hook"] else {}
