"""``run(plan, out_dir)``: the runner's own data loop driving the one run object ``runner.attach`` gives.

The recipe is a user of the library (as torchtune's recipes are): it builds the model, data and
optimizer from the checked plan, opens the run with ``open_run`` (the session, outputs and
``StepWriter`` every loop uses) and drives it step by step as a user's loop drives
``runner.attach``: ``run.step(loss, ...)``, ``run.evaluating()``. What only this loop does: the
passes beside each step that entries ask for (``HookType.side_data``), keeping the input image
for Grad-CAM, resuming a requeued job, starting a dataset pass after the batches its stores hold
already (``whole_pass.held_steps``), ``torch.compile``. Everything was checked when the plan
was compiled. Plain code, no Hydra globals: tests compile a config from Hydra's compose API and
run it, the CLI (``runner.cli``) runs the plan its checks compiled in the Hydra run directory.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from common.errors import ConfigError
from common.records import EXPLAINED_CLASSES, GENERATE, GENERATIONS
from hooks.mechanism.base import explanation
from hooks.mechanism.session import prepare_recording
from runner.engine import early_stop, fsdp, whole_pass
from runner.engine.attach import AttachedRun, open_run
from runner.engine.generation import Generation, generating
from runner.engine.metrics import OutputMetrics
from runner.engine.plan import Plan
from runner.engine.progress import progress_bar
from runner.engine.side_by_side import clean_and_corrupted
from runner.engine.train import EVAL_SEED_OFFSET, build_optimizer, eval_passes, train_step
from runner.sources.hf import placed
from runner.sources.losses import ClassScore
from runner.sources.models import build_model
from runner.store.claim import RunClaim
from runner.store.outputs import check_output_dir
from runner.store.provenance import provenance
from runner.store.resume import Resume, in_scheduler_job


def run(plan: Plan, out_dir: str | Path, claim: RunClaim | None = None, group: str | None = None) -> Path:
    """Run ``plan``'s steps (training or measurement passes) with its hooks; return ``out_dir``.

    ``claim`` is the caller's claim of ``out_dir`` (the CLI takes it before Hydra writes there);
    without one the directory is checked before the model is built and claimed for the run.
    ``group``: the sweep's directory, for live loggers to group its jobs by.
    Nothing is written when a step fails. ``plan.settings.on_nonfinite`` decides what NaN/Inf
    in a step does.
    """
    device = _available(plan.device)
    if plan.settings.fsdp.enabled:  # one rank of a torchrun launch: its part of the run (runner.engine.fsdp)
        with fsdp.process_group(device):
            return _run(plan, Path(out_dir), None, device, group)
    return _run(plan, Path(out_dir), claim, device, group)


def _run(plan: Plan, out_dir: Path, claim: RunClaim | None, device: torch.device, group: str | None) -> Path:
    s = plan.settings
    if claim is None and not s.fsdp.enabled:  # under FSDP2 rank 0 claims the run for every rank (rank_part)
        check_output_dir(out_dir, s.overwrite)
    torch.manual_seed(s.seed)
    model = placed(build_model(plan.model), device).train(s.mode.value == "train")
    if s.fsdp.enabled:
        model = fsdp.shard(model, list(s.fsdp.blocks), device)
    optimizer = build_optimizer(plan.optimizer, model)
    dataset_pass = whole_pass.applies(s, plan.data)
    resume = Resume(out_dir, plan.config_yaml, model, optimizer, enabled=in_scheduler_job())
    held = whole_pass.held_steps(plan.data, plan.hooks, model) if dataset_pass and not resume.found else 0
    data = (whole_pass.batches(plan.data, s.seed, device, held) if dataset_pass
            else plan.data.batches(s.seed, device))
    gradients = not dataset_pass or whole_pass.needs_gradient(plan.optimizer.name, plan.hooks)
    clean_data = plan.clean_data.batches(s.seed, device) if plan.clean_data is not None else None
    held_out = plan.schedule.held_out(plan.data.batches(s.seed + EVAL_SEED_OFFSET, device, held_out=True))
    first = resume.restore(data) or held  # a requeued job's run goes on from its last complete step
    for _ in range(first if clean_data is not None else 0):
        next(clean_data)
    start = time.perf_counter()
    prepare_recording(device, plan.rehearsal.records if plan.rehearsal is not None else None, bool(plan.hooks))
    extra = {"compile_time_s": time.perf_counter() - start,  # kept apart from step 0's wall time
             "provenance": provenance(plan),  # what a replay checks (runner.cli.replay)
             **({"resumed_at_step": first} if first else {})}
    with open_run(model, plan.hooks, s, plan.config_yaml, plan.overrides, out_dir, device, claim=claim, extra=extra,
                  first=first, hooks_state=resume.hooks_state, group=group) as run, \
            early_stop.stopping(model, s.stop_after, plan.hooks), OutputMetrics(model, s.metric) as measures, \
            resume.keeping(run.outputs), progress_bar(s.steps, s.progress) as bar:
        forward = _compiled(model) if s.compile else model
        breaks = graph_breaks() if s.compile else 0
        beside_entries = [hook for hook in run.session.hooks if hook.side_data is not None]
        recorder = run.session.recorder
        recorder.sample_names = plan.data.sample_names  # what units names its examples' dataset indices by
        generation = Generation(plan.data, s.generate, (resume.hooks_state or {}).get(GENERATE)) \
            if generating(s) else None  # mode=generate's steps (a requeued job's rows of the steps it ran)
        for step in range(first, s.steps):
            batch = next(data)
            recorder.samples = batch.samples
            if plan.keep_input and recorder.enabled:  # what Grad-CAM overlays, read back from the run
                recorder.record(batch.x, hook="(input)", layer="", phase="forward", kind="model_input",
                                slot="0", call=0, keep=True)
            run.writer.start()
            beside = {} if clean_data is None else _explained(
                run, clean_and_corrupted, forward, model, next(clean_data).x, batch.x, beside_entries, recorder,
                measures)
            loss, accuracy = _explained(run, generation.step, model, batch, step) if generation else \
                _explained(run, train_step, forward, model, batch, plan.loss_fn, run.session, optimizer,
                           plan.classifies, gradients)
            run.end_step(loss, accuracy=accuracy, **measures.take(), **beside)
            if plan.schedule.due(step):
                with run.evaluating() as result:
                    eval_loss, eval_accuracy = eval_passes(forward, model, held_out, plan.loss_fn, plan.classifies,
                                                           recorder)
                    result.set(eval_loss, accuracy=eval_accuracy, **measures.take())
            bar.set_postfix(loss=loss, refresh=False)
            bar.update()
            resume.mark(step + 1, {**run.session.run_state(), **({GENERATE: generation.kept()} if generation else {})})
            if step + 1 < s.steps:
                run.begin_step()
        if generation is not None:
            run.outputs.write_table(GENERATIONS, generation.rows)
        if s.compile:  # the hooks' (and the model's) graph breaks, met while compiling it
            run.outputs.extra["graph_breaks"] = graph_breaks() - breaks
        if first == 0 and isinstance(plan.loss_fn, ClassScore) and plan.loss_fn.chosen is not None:
            run.outputs.extra[EXPLAINED_CLASSES] = plan.loss_fn.chosen  # what the Grad-CAM title names
    resume.finish()
    return out_dir


def _available(name: str) -> torch.device:
    """The plan's device, checked where the job runs (a sweep's plan may come from a login node)."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but torch.cuda.is_available() is False on this node; "
                          "use device=cpu or auto")
    return torch.device(name)


def _explained(run: AttachedRun, fn, *args):
    """Call ``fn``; an error one of the run's entries can explain becomes that entry's one-line error."""
    try:
        return fn(*args)
    except Exception as exc:
        message = explanation(run.session.hooks, exc)
        if message:
            raise ConfigError(message) from None
        raise


def graph_breaks() -> int:
    """The graph breaks ``torch.compile`` met in this process so far (PyTorch has no public counter:
    ``torch._dynamo.utils.counters``, which ``torch._dynamo.explain`` reads too)."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def _compiled(model: nn.Module) -> nn.Module:
    """``torch.compile(model)``; called only after every hook is registered on ``model``.

    Compilation happens at the first call, and hooks added after it are silently ignored
    (``torch._dynamo.config.skip_nnmodule_hook_guards``). The hooks stay on ``model``'s own
    modules, so layer names carry no ``_orig_mod.`` prefix.
    """
    return torch.compile(model)
