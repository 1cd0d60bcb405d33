"""``runner.attach``: the runner's hook entries, tables and guarantees inside the user's own training loop.

The entries are composed as the command line composes them (preset names, ``overrides``, or a
mapping of entries), checked by the plan's own functions before anything is attached or
written, and recorded by the CLI loop's own ``StepWriter``: the run directory is the one
``python -m runner`` writes, and ``runner.analysis`` reads it like any run. Hooks leave the
model on exit, also on an exception; on an exception nothing final is written. Under
``torch.distributed`` each rank records its own part of the run (``runner.store.ranks``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch import nn

from hooks import HookSession
from hooks.errors import ConfigError, choice_error
from hooks.interventions import side_by_side
from hooks.recorder import Recorder
from runner.cli.commandline import compose_config
from runner.engine.plan import compile_hooks, compile_settings
from runner.engine.steps import StepWriter
from runner.store.outputs import STEP_METRICS, RunOutputs, write_tables
from runner.store.ranks import rank_part

#: The run settings that mean something in the user's loop (the others describe the runner's own loop).
ATTACH_SETTINGS = ("seed", "on_nonfinite", "on_silent", "overwrite", "sample", "output")

Hooks = Sequence[str] | Mapping[str, Mapping]


class EvalResult:
    """What ``AttachedRun.evaluating`` yields: ``set(loss, **metrics)`` gives the eval row its values."""

    def __init__(self) -> None:
        self.loss: float | None = None
        self.metrics: dict[str, float] = {}

    def set(self, loss: torch.Tensor | float | None = None, **metrics: float) -> None:
        """The eval passes' loss (their mean, as the CLI writes it) and ``metrics`` among ``STEP_METRICS``."""
        self.loss, self.metrics = _value(loss), _checked(metrics, "set")


class AttachedRun:
    """What ``attach`` yields: ``backward(loss)`` for the step's backward pass, ``step(loss)`` after it,
    ``evaluating()`` around eval passes between steps."""

    def __init__(self, steps: StepWriter) -> None:
        self._steps = steps
        self.session = steps.session
        #: The step being recorded (from 0): rows written by the next ``step()`` carry it.
        self.index = 0
        #: The entries' lifetimes over the steps that ran (the manifest's ``lifetimes``): taken at
        #: the end of each step, before the next one is begun for a loop that may not run it.
        self.lifetimes = self.session.lifetimes()

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        """``loss.backward(**kwargs)`` through the session: checkpoint recomputes are labelled as
        such, and entries that record after backward (accumulated ``.grad``) record."""
        self.session.backward(loss, **kwargs)

    @contextlib.contextmanager
    def backward_pass(self) -> Iterator[None]:
        """``backward`` for a framework that calls ``loss.backward()`` itself, inside the block
        (Lightning's, Hugging Face's): what ``backward`` does around it, done around the block."""
        with self.session.recorder.backward_pass():
            yield
        self.session.after_backward()

    def step(self, loss: torch.Tensor | float | None = None, **metrics: float) -> None:
        """End the step: one ``steps.parquet`` row (``loss``, wall time since the previous step,
        ``metrics`` among ``STEP_METRICS``), its captures handed to the writer; the next step begins."""
        self._steps.finish(self.index, _value(loss), metrics=_checked(metrics, "step"))
        self.lifetimes = self.session.lifetimes()
        self.index += 1
        self._steps.begin(self.index)
        self._steps.start()

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[EvalResult]:
        """Eval passes after the last ``step()``, as the CLI's ``eval_every`` runs them.

        Inside the block every capture is phase ``eval`` and recorded (whatever ``sample.every``
        says); when the block ends they are written with one ``split=eval`` row of
        ``steps.parquet`` for the step that just ended (its loss and metrics: ``result.set(...)``),
        and never mix with the next training step. Putting the model in eval mode and turning
        gradients off stay yours, as in your loop without the runner.
        """
        if self.index == 0:
            raise ConfigError("run.evaluating(): eval passes are written after a training step, and no run.step() "
                              "has ended one yet; evaluate after the first run.step()")
        for hook in self.session.hooks:
            if hook.eval_problem:
                raise ConfigError(f"run.evaluating(): {hook.key}: '{hook.spec.type}' {hook.eval_problem}; "
                                  f"evaluate in a run without the entry")
        recorder = self.session.recorder
        recording = recorder.enabled
        result = EvalResult()
        self._steps.start()
        recorder.set_enabled(True)
        try:
            with recorder.relabel("eval"):
                yield result
            self._steps.finish(self.index - 1, result.loss, split="eval", metrics=result.metrics)
        finally:
            recorder.set_enabled(recording)
        self._steps.start()  # the next training step's clock starts after the eval passes


def _value(loss: torch.Tensor | float | None) -> float | None:
    return float(loss.detach()) if isinstance(loss, torch.Tensor) else None if loss is None else float(loss)


def _checked(metrics: dict[str, float], method: str) -> dict[str, float]:
    """``metrics`` if every name is one of ``STEP_METRICS``; else a one-line error naming it."""
    unknown = sorted(set(metrics) - set(STEP_METRICS))
    if unknown:
        raise choice_error(f"{method}({unknown[0]}=...)", unknown[0], STEP_METRICS or ["(none)"], "per-step measure")
    return metrics


@contextlib.contextmanager
def attach(model: nn.Module, hooks: Hooks = (), overrides: Sequence[str] = (), out_dir: str | Path = "runs/attach",
           **settings) -> Iterator[AttachedRun]:
    """Attach hook entries to ``model`` for the block and record them into ``out_dir``.

    ``hooks``: preset names (``["clip", "stats"]``, as ``hooks=[clip,stats]``) or a mapping of
    entries (``{"clip": {"type": "clamp", "layers": "**", "max": 0.1}}``); ``overrides``: command-line
    overrides (``"hooks.clip.max=0.1"``); ``settings``: ``seed``, ``on_nonfinite``, ``on_silent``,
    ``overwrite``, ``sample`` (a dict), ``output`` (a dict).

    Raises:
        ConfigError: a bad entry, override or setting, in one line, before anything is attached or written.

    Example:
        >>> with runner.attach(model, hooks=["clip", "stats"], overrides=["hooks.clip.max=0.1"]) as run:
        ...     for x, y in loader:
        ...         loss = F.cross_entropy(model(x), y)
        ...         run.backward(loss)
        ...         run.step(loss)
        ...         opt.step(); opt.zero_grad()
    """
    config_yaml, hooks_built, s, lines = _compile(hooks, overrides, settings)
    for hook in hooks_built:
        hook.targets(model)  # a selector that matches none of the model's modules fails here, one line
    for hook in side_by_side(hooks_built):
        raise ConfigError(f"{hook.key}.source: clean needs the runner's loop, which runs the clean batch beside "
                          f"each step (python -m runner); in your own loop patch from a stored run: "
                          f"{hook.key}.source=RUN_DIR")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    recorder = Recorder(s.sample.batch, s.sample.channels, s.seed)
    with rank_part(Path(out_dir), s.overwrite, config_yaml) as (part_dir, rank_extra), \
            HookSession(model, hooks_built, recorder) as session:
        with RunOutputs(part_dir, config_yaml, lines, max(1, int(s.output.row_group_mb * (1 << 20))),
                        s.overwrite, extra={"seed": s.seed, **rank_extra}) as outputs:
            steps = StepWriter(session, outputs, s, device)
            steps.begin(0)
            steps.start()
            run = AttachedRun(steps)
            yield run
            outputs.extra["lifetimes"] = run.lifetimes
            write_tables(hooks_built, outputs)  # run totals: units.parquet, a store's last shard


def _compile(hooks: Hooks, overrides: Sequence[str], settings: dict):
    """The config, built entries, settings and command lines of an ``attach`` call, all checked."""
    for key in settings:
        if key not in ATTACH_SETTINGS:
            raise choice_error(key, key, ATTACH_SETTINGS, "setting of runner.attach")
    if isinstance(hooks, str) or not isinstance(hooks, (Sequence, Mapping)):
        raise ConfigError(f"hooks: {hooks!r} must be a list of preset names or a mapping of entries")
    entries = dict(hooks) if isinstance(hooks, Mapping) else {}
    lines = [f"hooks=[{','.join(map(str, hooks))}]" if not entries else "hooks=[]", *overrides]
    composed = OmegaConf.create(OmegaConf.to_container(compose_config(lines), enum_to_str=True))
    try:
        cfg = OmegaConf.merge(composed, {"hooks": entries}, settings)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{getattr(exc, 'full_key', '') or 'hooks'}: {str(exc).splitlines()[0]}") from None
    typed, s = compile_settings(cfg, lines)
    built = compile_hooks(typed)
    config_yaml = OmegaConf.to_yaml(OmegaConf.masked_copy(typed, [*ATTACH_SETTINGS, "hooks"]), resolve=True)
    return config_yaml, built, s, lines

