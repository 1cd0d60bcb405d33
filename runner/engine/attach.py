"""``runner.attach``: the runner's hook entries, tables and guarantees inside the user's own training loop.

One loop: ``open_run`` builds the one object every loop drives (``AttachedRun``: the hook
session, the run's outputs and the ``StepWriter``), from checked entries and settings and a
model. ``runner.attach`` gives it to the user's loop; the CLI's ``run(plan, out_dir)``
(``runner.engine.loop``) drives the same object with the runner's own data loop, and the
Lightning and Hugging Face callbacks (``runner.integrations``) with the framework's. So the
run directory is the one ``python -m runner`` writes, and ``runner.analysis`` reads it like any run.

``runner.attach`` composes the entries as the command line composes them (preset names,
``overrides``, or a mapping of entries), checks them before anything is attached or written,
and rehearses them at the model's first call on the meta device (``rehearse_first_call``), as
``compile_plan`` does for the CLI. What is recorded after backward is recorded whoever calls
``loss.backward()`` (``HookSession.flush``). Hooks leave the model on exit, also on an
exception; on an exception nothing final is written. Under ``torch.distributed`` each rank
records its own part of the run (``runner.store.ranks``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import torch
import yaml
from torch import nn
from torch.utils.data import Dataset

from common.errors import ConfigError, choice_error
from common.ranks import SAME_ON_EVERY_RANK
from hooks import HookSession
from hooks.mechanism.base import HookType
from hooks.mechanism.recorder import Recorder
from runner.config.schema import RunConfig
from runner.engine.metrics import step_measures
from runner.engine.attach_plan import attach_plan
from runner.engine.plan import check_attached_model
from runner.engine.python_errors import python_remedies
from runner.engine.rehearsal import Rehearsal, model_state, rehearse_first_call
from runner.engine.steps import StepWriter
from runner.live import LiveLoggers, RunContext
from runner.live.channel import Sink
from runner.sources.datasets import folder_names
from runner.store.claim import RunClaim
from runner.store.outputs import RunOutputs, write_tables
from runner.store.ranks import rank_part

Hooks = Sequence[str] | Mapping[str, Mapping]
#: A sample's name as the user knows it: a name (a file path, a caption), or ``(name, class)``.
Name = str | tuple[str, str]
#: ``attach(names=...)``: the names of the dataset ids ``run.samples`` gives, by id: a sequence, a function
#: of the id, or an ``ImageFolder`` itself (each id's file relative to its folder and its class folder's name).
Names = Sequence[Name] | Callable[[int], Name] | Dataset
#: Live loggers, as ``attach(logger=...)`` takes them: names, or settings by name.
Loggers = Sequence[str] | Mapping[str, Mapping]
#: YAML's safe loader, in C where PyYAML was built with libyaml (2.6 ms -> 0.3 ms for a block's config).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class EvalResult:
    """What ``AttachedRun.evaluating`` yields: ``set(loss, **metrics)`` gives the eval row its values."""

    def __init__(self, measures: Sequence[str]) -> None:
        self.measures = measures
        self.loss: float | None = None
        self.metrics: dict[str, float] = {}

    def set(self, loss: torch.Tensor | float | None = None, **metrics: float) -> None:
        """The eval passes' loss (their mean, as the CLI writes it) and ``metrics`` among the run's measures."""
        self.loss, self.metrics = _value(loss), _checked(metrics, self.measures, "set")


class SampleNames:
    """A sample id's ``(name, class)`` for the ``units`` entries' top inputs (``Recorder.sample_names``): the
    names ``run.samples(ids, names=...)`` gave the batch, else those ``attach(names=...)`` gives by id."""

    def __init__(self, names: Names | None = None) -> None:
        self.names = folder_names(names) or names  # an ImageFolder: its files and class folders, as the CLI's
        self.batch: dict[int, tuple[str, str]] = {}

    def given(self, ids: list[int], names: Sequence[Name] | None) -> None:
        """The batch's ids, and their ``names`` when the loop gives them (one per id); a name ``attach``'s
        sequence cannot give is refused here, before the batch runs."""
        if names is not None and len(names) != len(ids):
            raise ConfigError(f"run.samples(ids, names=...): {len(names)} names for {len(ids)} ids; give one name "
                              f"(or (name, class)) per id")
        if names is None and isinstance(self.names, Sequence) and ids and not 0 <= min(ids) <= max(ids) < len(self.names):
            raise ConfigError(f"run.samples(ids): id {max(ids) if max(ids) >= 0 else min(ids)} has no name in "
                              f"attach(names=...) (its {len(self.names)} names are ids 0..{len(self.names) - 1})")
        self.batch = {} if names is None else {i: _pair(name) for i, name in zip(ids, names)}

    def __call__(self, sample: int) -> tuple[str, str]:
        if sample in self.batch:
            return self.batch[sample]
        if self.names is None:
            return "", ""
        return _pair(self.names(sample) if callable(self.names) else self.names[sample])


def _pair(name: Name) -> tuple[str, str]:
    """``(name, class)`` of a name or a pair."""
    if isinstance(name, (str, Path)):
        return str(name), ""
    if isinstance(name, Sequence) and len(name) == 2:
        return str(name[0]), str(name[1])
    raise ConfigError(f"a sample's name is a str or a (name, class) pair, not {name!r}")


class AttachedRun:
    """What ``attach`` yields (and what the CLI's loop drives): ``backward(loss)`` (optional
    sugar for ``loss.backward()``), ``step(loss)`` after the step, ``evaluating()`` around eval
    passes between steps, ``samples(ids)`` before batches whose dataset ids ``units`` and ``store``
    keep. ``session`` holds the entries' hooks, ``outputs`` the run's files, ``writer`` the steps'
    bookkeeping; ``rehearsal`` is what the first call's meta pass showed."""

    def __init__(self, writer: StepWriter, first: int = 0, rehearsal: Rehearsal | None = None) -> None:
        self.writer = writer
        self.session = writer.session
        self.outputs = writer.outputs
        self.rehearsal = rehearsal
        #: The step being recorded (from 0, or a resumed run's first): rows written by the next ``step()`` carry it.
        self.index = first
        #: The entries' lifetimes over the steps that ran (the manifest's ``lifetimes``): taken at
        #: the end of each step, before the next one is begun for a loop that may not run it.
        self.lifetimes = self.session.lifetimes()
        self.begin_step()

    def samples(self, ids: torch.Tensor | Sequence[int], names: Sequence[Name] | None = None) -> None:
        """The dataset ids of the rows of the batches the model gets next (``units`` and ``store`` keep
        them beside each row), until the next call; without them a row is numbered by its place in the
        run, which under ``torch.distributed`` every rank would number from 0. ``names``: one per id, a
        name or ``(name, class)`` (a file path and its class): what ``top_units`` and the answer call the
        ``units`` entries' top inputs (else ``attach(names=...)``'s, else ``sample ID``)."""
        ids = torch.as_tensor(ids, dtype=torch.int64).view(-1)
        recorder = self.session.recorder
        if names is not None or recorder.sample_names is not None:
            if not isinstance(recorder.sample_names, SampleNames):  # the names the data give, if any, after these
                recorder.sample_names = SampleNames(recorder.sample_names)
            recorder.sample_names.given(ids.tolist(), names)
        recorder.samples = ids

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        """``loss.backward(**kwargs)`` through the session: checkpoint recomputes are labelled as
        such, and entries that record after backward (accumulated ``.grad``) record right after it
        (with a plain ``loss.backward()`` they record before the optimizer steps, or at ``step()``)."""
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
        ``metrics`` among ``outputs.measures``), its captures handed to the writer; the next step begins."""
        self.end_step(loss, **metrics)
        self.begin_step()

    def end_step(self, loss: torch.Tensor | float | None = None, **metrics: float | None) -> None:
        """``step`` without beginning the next step: a loop that knows its steps (the CLI's) begins
        it with ``begin_step`` after its eval passes, so they run with the lifetimes of the step they follow."""
        self.writer.finish(self.index, _value(loss), metrics=_checked(metrics, self.outputs.measures, "step"))
        self.lifetimes = self.session.lifetimes()
        self.index += 1

    def begin_step(self) -> None:
        """Begin step ``index``: the entries' lifetimes and sampling for it; its clock starts."""
        self.writer.begin(self.index)
        self.writer.start()

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
        result = EvalResult(self.outputs.measures)
        self.session.flush()  # the last training step's gradients are not the eval passes'
        self.writer.start()
        recorder.set_enabled(True)
        try:
            with recorder.relabel("eval"):
                yield result
            self.writer.finish(self.index - 1, result.loss, split="eval", metrics=result.metrics)
        finally:
            recorder.set_enabled(recording)
        self.writer.start()  # the next training step's clock starts after the eval passes


def _value(loss: torch.Tensor | float | None) -> float | None:
    return float(loss.detach()) if isinstance(loss, torch.Tensor) else None if loss is None else float(loss)


def _checked(metrics: dict[str, float], measures: Sequence[str], method: str) -> dict[str, float]:
    """``metrics`` if every name is one of the run's ``measures``; else a one-line error naming it."""
    unknown = sorted(set(metrics) - set(measures))
    if unknown:
        raise choice_error(f"{method}({unknown[0]}=...)", unknown[0], measures, "per-step measure")
    return metrics


@contextlib.contextmanager
@python_remedies
def attach(model: nn.Module, hooks: Hooks = (), overrides: Sequence[str] = (), out_dir: str | Path = "runs/attach",
           logger: Loggers = (), sinks: Mapping[str, Sink] | None = None, names: Names | None = None,
           **settings) -> Iterator[AttachedRun]:
    """Attach hook entries to ``model`` for the block and record them into ``out_dir``.

    ``hooks``: preset names (``["clip", "stats"]``, as ``hooks=[clip,stats]``) or a mapping of
    entries (``{"clip": {"type": "clamp", "layers": "**", "max": 0.1}}``); ``overrides``: command-line
    overrides (``"hooks.clip.max=0.1"``); ``logger``: live loggers by name (``["tensorboard", "wandb"]``,
    as ``logger=[tensorboard,wandb]``) or a mapping of their settings (``{"mlflow": {"tracking_uri": URI}}``);
    ``sinks``: some of those loggers already open, by name (the Lightning and Hugging Face callbacks pass
    the trainer's own: the run logs through them); ``settings``: ``seed``, ``on_nonfinite``, ``on_silent``,
    ``overwrite``, ``sample`` (a dict), ``output`` (a dict), ``memory`` (a dict: ``{"budget": "2GiB"}``
    refuses, at the model's first call and before it computes anything, entries that would hold more);
    ``names``: what the dataset ids ``run.samples(ids)`` gives are called (by id: a sequence or a function
    of the id, each a name or ``(name, class)``; or an ``ImageFolder``, whose files and classes name them), so that
    ``top_units`` and the run's answer name the ``units`` entries' top inputs as the user knows them.

    Raises:
        ConfigError: a bad entry, override or setting, in one line, before anything is attached or written.

    Example:
        >>> with runner.attach(model, hooks=["clip", "stats"], overrides=["hooks.clip.max=0.1"]) as run:
        ...     for x, y in loader:
        ...         loss = F.cross_entropy(model(x), y)
        ...         loss.backward()
        ...         opt.step(); opt.zero_grad()
        ...         run.step(loss)
    """
    plan = attach_plan(hooks, overrides, settings, logger)  # compiled once while its arguments and presets hold
    check_attached_model(model, plan.hooks)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    rehearsed_as = (plan.hooks, model_state(model)) if plan.kept else None  # before the run's hooks are on it
    with open_run(model, plan.hooks, plan.settings, plan.config_yaml, plan.overrides, Path(out_dir), device,
                  rehearse=True, sinks=sinks, rehearsed_as=rehearsed_as) as run:
        if names is not None:
            run.session.recorder.sample_names = SampleNames(names)
        yield run


@contextlib.contextmanager
def open_run(model: nn.Module, hooks: Sequence[HookType], settings: RunConfig, config_yaml: str,
             overrides: Sequence[str], out_dir: Path, device: torch.device, *, rehearse: bool = False,
             claim: RunClaim | None = None, extra: dict | None = None, first: int = 0,
             hooks_state: dict | None = None, group: str | None = None,
             sinks: Mapping[str, Sink] | None = None, rehearsed_as: tuple | None = None) -> Iterator[AttachedRun]:
    """The one run object every loop drives: ``hooks`` attached to ``model`` (fresh state, built from
    their specs), recorded into ``out_dir`` (this rank's part under ``torch.distributed``).

    ``rehearse``: rehearse the entries at the model's first call (``runner.attach``; the CLI's plan
    rehearsed them already). ``claim``, ``extra``: the CLI's claim of ``out_dir`` and manifest
    fields; ``first``, ``hooks_state``: where a resumed run goes on from; ``group``: the sweep's
    directory, by which live loggers group its jobs; ``sinks``: live loggers already open (a
    trainer's own, ``runner.integrations``) for some of ``settings.logger``'s; ``rehearsed_as``: a kept
    plan's entries and the model's state before they were attached (``rehearse_first_call``'s ``kept``
    and ``state``: a call rehearsed with both before is not rehearsed again). On exit the hooks leave
    the model and the run is committed (on an exception: nothing final is written), then the
    live loggers send their last lines.
    """
    s = settings
    recorder = Recorder(s.sample.batch, s.sample.channels, s.seed)
    with rank_part(out_dir, s.overwrite, config_yaml) as (part_dir, rank_extra), \
            HookSession(model, [hook.fresh() for hook in hooks], recorder) as session:
        if hooks_state is not None:
            session.restore_run_state(hooks_state)
        found = rehearse_first_call(model, session, s.memory.budget, *(rehearsed_as or ())) if rehearse else None
        context = RunContext(part_dir, yaml.load(config_yaml, Loader=SAFE_LOADER) or {}, tuple(overrides), group)
        with LiveLoggers(s.logger, context, {hook.name: hook.spec.type for hook in hooks}, sinks) as live, \
                RunOutputs(part_dir, config_yaml, overrides, max(1, int(s.output.row_group_mb * (1 << 20))),
                           s.overwrite, claim=claim, extra={"seed": s.seed, **(extra or {}), **rank_extra},
                           measures=step_measures(s.metric)) as outputs:
            live.start()  # the directory is the run's: nothing of a refused run reaches a tool
            run = AttachedRun(StepWriter(session, outputs, s, device, live), first, found)
            yield run
            outputs.extra["lifetimes"] = run.lifetimes
            if rank_extra:  # under torch.distributed: the rows a reader counts once (common.ranks)
                outputs.extra[SAME_ON_EVERY_RANK] = s.fsdp.enabled or sorted(map(list, recorder.same_on_every_rank))
            write_tables(session.hooks, outputs)  # run totals: units.parquet, a store's last shard
