"""``mode=generate``: the model's own ``model.generate`` on each batch of prompts, under the run's hooks.

The run's loop (``runner.engine.loop``) reads the prompts of ``data=text`` in order (a dataset
pass: ``data.shard`` splits them, each sample keeps its dataset index) and, in place of a
training step, calls ``model.generate`` with the entries attached: every forward call it makes,
the prompt's and each new token's, goes through every hook (steer, ablate, patch, ``sae`` feature
edits), and the recorder writes each call's rows as for any step (``call`` counts the calls of a
step: call 0 is the prompt, call k the k-th new token). The prompts' pads move to the left
(``left_padded``), with the attention mask ``generate`` needs; the generated tokens and text
become ``generations.parquet`` (``common.records.GENERATIONS_SCHEMA``).

Positions during generation. With ``generate.use_cache: true`` (the default) the first call sees
the whole left-padded prompt and each later call one new position (the keys and values of the
earlier ones come from the cache, computed under the same hooks). An entry without an ``index``
on the position axis changes every position of every call: every prompt token and every
generated token. An ``index`` applies to the tensor each call sees: ``-1`` on the position axis
(``':, -1'``) is the newest token in every call; a fixed position ``p`` is the prompt's position
``p`` in call 0 and out of range in later calls. With ``generate.use_cache: false`` every call
sees the whole sequence so far, so positions count from the left-padded prompt's first column in
every call (slower: each call recomputes every position).

An entry taking a stored value of each call (a ``patch`` from a stored run: its spec's ``stored_run``) needs
a generation run there (``mode=generate`` with ``hooks=extract`` or ``capture``) of at least as many new
tokens. No loss, backward, optimizer or pass beside a step: refused before the run (``check_run``; the
refusal says what the entry's spec says turns its pass off, ``without_side_pass``).
"""
from __future__ import annotations

import torch
from torch import nn

from common.errors import ConfigError
from common.records import GENERATE, GENERATIONS_SCHEMA
from common.run_config import read_run_config
from runner.config.generate_model import CAUSAL_LM
from runner.config.schema import GenerateConfig, RunConfig
from runner.sources.batches import Batch
from runner.sources.data import DataSource
from runner.sources.text import prompt_set


def generating(settings: RunConfig) -> bool:
    return settings.mode.value == "generate"


def check_run(settings: RunConfig, data: DataSource, hooks, optimizer) -> None:
    """Refuse what ``mode=generate`` cannot do (its model is asked first: ``check_generate_model``): data without a tokenizer, settings of a training loop,
    entries that need a backward pass or a pass beside each step."""
    if not generating(settings):
        return
    if data.kind != "text":
        raise ConfigError(f"mode=generate: data={data.kind} has no tokenizer to make and decode text; use data=text "
                          f"(data.prompts=['...'] or data.path=FILE, data.tokenizer=DIR)")
    g = settings.generate
    for key, value, minimum in (("max_new_tokens", g.max_new_tokens, 1), ("top_k", g.top_k, 0)):
        if value < minimum:
            raise ConfigError(f"generate.{key}: {value} must be at least {minimum}")
    if not g.temperature > 0:
        raise ConfigError(f"generate.temperature: {g.temperature} must be > 0")
    for key, value, fix in (("optimizer", optimizer.name != "none", "optimizer=none"),
                            ("eval_every", settings.eval_every, "eval_every=0"),
                            ("compile", settings.compile, "compile=false"),
                            ("stop_after", settings.stop_after, "stop_after=null")):
        if value:
            raise ConfigError(f"{key}: mode=generate calls model.generate and nothing else; set {fix}")
    for hook in hooks:
        if hook.needs_backward:
            raise ConfigError(f"{hook.key}: '{hook.spec.type}' needs a backward pass; mode=generate runs none "
                              f"(record forward kinds only, or drop the entry)")
        if hook.side_data is not None:
            raise ConfigError(f"{hook.key}: '{hook.spec.type}' runs a pass beside each step, which mode=generate "
                              f"does not run; {hook.spec.without_side_pass(hook.key)}")
        stored = hook.spec.stored_run()
        if stored is not None:
            _check_stored_run(f"{hook.key}.{stored[0]}", stored[1], g.max_new_tokens)


def _check_stored_run(key: str, source: str, new_tokens: int) -> None:
    """An entry taking a stored value at every call during generation (the prompt's, then each new token's):
    only a stored generation run of as many new tokens or more holds them all."""
    config = read_run_config(source)
    if config.get("mode") != GENERATE:
        raise ConfigError(f"{key}: run '{source}' is a forward pass (mode={config.get('mode')}) holding the "
                          f"prompt's call only; mode=generate patches every call: store the source with mode=generate")
    stored = int((config.get("generate") or {}).get("max_new_tokens", 0))
    if stored < new_tokens:
        raise ConfigError(f"{key}: run '{source}' generated {stored} new tokens, fewer than "
                          f"generate.max_new_tokens={new_tokens}")


def check_model(model: nn.Module) -> None:
    """The model can generate: a ``transformers`` model whose ``can_generate()`` is true (a causal LM)."""
    if not (callable(getattr(model, "can_generate", None)) and model.can_generate()):
        raise ConfigError(f"mode=generate: the model ({type(model).__name__}) cannot generate text; {CAUSAL_LM}")


def left_padded(x: torch.Tensor, lengths: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded prompts ``x`` (row i's first ``lengths[i]`` tokens its own) as ``generate`` takes them:
    pads on the left, as wide as the longest row, and the attention mask (1 on a prompt's own tokens)."""
    lengths = lengths.to(x.device)
    width = int(lengths.max())
    positions = torch.arange(width, device=x.device)
    mask = positions[None] >= (width - lengths)[:, None]
    ids = torch.full((len(x), width), pad_id, dtype=x.dtype, device=x.device)
    ids[mask] = x[:, :width][positions[None] < lengths[:, None]]
    return ids, mask.long()


def generation_kwargs(settings: GenerateConfig, pad_id: int) -> dict:
    """``model.generate``'s settings: greedy, or sampled with ``temperature`` and ``top_k`` (0: every token)."""
    kwargs = {"max_new_tokens": settings.max_new_tokens, "do_sample": settings.do_sample,
              "use_cache": settings.use_cache, "pad_token_id": pad_id}
    if settings.do_sample:
        kwargs.update(temperature=settings.temperature, top_k=settings.top_k)
    return kwargs


class Generation:
    """The run's generation: ``step`` generates one batch of prompts; ``rows`` are ``generations.parquet``'s."""

    def __init__(self, data: DataSource, settings: GenerateConfig, kept: dict[str, list] | None = None) -> None:
        """``kept``: the rows of the steps a requeued job ran already (``kept()`` at its resume point)."""
        self.prompts = prompt_set(data.data, data.model)
        self.settings = settings
        self.rows: dict[str, list] = kept or {name: [] for name in GENERATIONS_SCHEMA.names}

    def kept(self) -> dict[str, list]:
        """A copy of the rows so far, for a resume point (``runner.store.resume``): the rows are written once,
        at the end of the run, so a requeued job's earlier steps must come back with its state."""
        return {name: list(values) for name, values in self.rows.items()}

    def step(self, model: nn.Module, batch: Batch, step: int) -> tuple[None, None]:
        """Generate from ``batch``'s prompts (a sampled batch after ``torch.manual_seed(seed + step)``);
        keep a row per prompt. No loss, no accuracy."""
        prompts = self.prompts
        ids, mask = left_padded(batch.x, prompts.lengths[batch.samples], prompts.pad_id)
        if self.settings.do_sample:
            torch.manual_seed(self.settings.seed + step)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, **generation_kwargs(self.settings, prompts.pad_id))
        self._add_rows(step, batch.samples.tolist(), out[:, ids.shape[1]:].cpu(), _end_ids(model))
        return None, None

    def _add_rows(self, step: int, samples: list[int], new: torch.Tensor, ends: set[int]) -> None:
        decode = self.prompts.tokenizer.decode
        for sample, tokens in zip(samples, new.tolist()):
            end = next((i + 1 for i, token in enumerate(tokens) if token in ends), len(tokens))
            tokens = tokens[:end]  # what generate put after the end-of-text token is padding
            length = int(self.prompts.lengths[sample])
            self.rows["hook"].append(GENERATE)
            self.rows["step"].append(step)
            self.rows["sample"].append(sample)
            self.rows["prompt"].append(self.prompts.texts[sample])
            self.rows["prompt_ids"].append(self.prompts.ids[sample, :length].tolist())
            self.rows["generated_ids"].append(tokens)
            self.rows["generated_text"].append(decode(tokens, skip_special_tokens=True))


def _end_ids(model: nn.Module) -> set[int]:
    """The end-of-text token ids at which ``generate`` stops a sequence (none: it runs to ``max_new_tokens``)."""
    ends = model.generation_config.eos_token_id
    return set() if ends is None else {ends} if isinstance(ends, int) else set(ends)
