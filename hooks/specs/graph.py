"""``graph`` (``hooks.types.graph``): an attribution graph per prompt over the transcoders a ``transcoder`` entry
splices: its logit targets, pruning thresholds, backward batch and the files it writes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from common.errors import ConfigError
from hooks.specs.base import HOOK_TYPES, Answers, check_finite
from hooks.specs.samples import SampleOutputsSpec


@dataclass
class GraphSpec(SampleOutputsSpec):
    answers = Answers("runner.analysis.answers.graph:graph_answer")
    pictures = ("attribution_graph",)  # runner.analysis.graph: one prompt's pruned graph, nodes by layer and position

    max_n_logits: int = 10  #: at most this many logit targets, the most probable tokens at the last position
    desired_logit_prob: float = 0.95  #: ... until their cumulative probability reaches this (circuit-tracer's)
    node_threshold: float = 0.8  #: keep the nodes holding this fraction of the cumulative influence on the logits
    edge_threshold: float = 0.98  #: keep the edges holding this fraction of the edges' influence
    batch_size: int = 64  #: targets per backward: copies of the prompt in one forward (at most its targets)
    keep_all: bool = False  #: write every non-zero edge (``kept`` says which pruning keeps), not only the kept ones
    tokenizer: Optional[str] = None  #: a ``save_pretrained`` folder decoding ``token`` (the preset: ``data.tokenizer``)
    units: Optional[str] = None  #: a ``units`` run of the same transcoders: its top examples beside each feature

    def check(self, key: str) -> None:
        check_finite(key, self)
        for name in ("desired_logit_prob", "node_threshold", "edge_threshold"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(f"{key}.{name}: {value} is not in (0, 1]; a fraction of probability or influence, "
                                  f"e.g. {key}.{name}={getattr(GraphSpec, name)}")
        for name in ("max_n_logits", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{key}.{name}: {getattr(self, name)} must be at least 1")


HOOK_TYPES.declare("graph", "hooks.types.graph", GraphSpec)
