"""``run(plan, out_dir)``: the loop, and nothing else; everything was checked when the plan was compiled.

Plain code, no Hydra globals: tests compile a config from Hydra's compose API and run it, the CLI
(``runner.cli``) runs the plan its checks compiled in the Hydra run directory.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from hooks import HookSession
from hooks.base import explanation
from hooks.errors import ConfigError
from hooks.interventions import side_by_side
from hooks.recorder import Recorder
from hooks.stats import COMPILE_MIN_NUMEL
from hooks.stats import prepare as prepare_statistics
from runner.engine.metrics import OutputMetrics
from runner.engine.plan import Plan
from runner.engine.progress import progress_bar
from runner.engine.side_by_side import clean_and_corrupted
from runner.engine.steps import StepWriter
from runner.engine import early_stop, whole_pass
from runner.engine.train import EVAL_SEED_OFFSET, build_optimizer, eval_passes, train_step
from runner.sources.models import build_model
from runner.store.claim import RunClaim
from runner.store.outputs import RunOutputs, check_output_dir, write_tables
from runner.store.provenance import provenance
from runner.store.resume import Resume, in_scheduler_job


def run(plan: Plan, out_dir: str | Path, claim: RunClaim | None = None) -> Path:
    """Run ``plan``'s steps (training or measurement passes) with its hooks; return ``out_dir``.

    ``claim`` is the caller's claim of ``out_dir`` (the CLI takes it before Hydra writes there);
    without one the directory is checked before the model is built and claimed for the run.
    Nothing is written when a step fails. ``plan.settings.on_nonfinite`` decides what NaN/Inf
    in a step does.
    """
    s = plan.settings
    device = _available(plan.device)
    out_dir = Path(out_dir)
    if claim is None:
        check_output_dir(out_dir, s.overwrite)
    torch.manual_seed(s.seed)
    model = build_model(plan.model).to(device).train(s.mode.value == "train")
    optimizer = build_optimizer(plan.optimizer, model)
    dataset_pass = whole_pass.applies(s, plan.data)
    data = whole_pass.batches(plan.data, s.seed, device) if dataset_pass else plan.data.batches(s.seed, device)
    gradients = not dataset_pass or whole_pass.needs_gradient(plan.optimizer.name, plan.hooks)
    clean_data = plan.clean_data.batches(s.seed, device) if plan.clean_data is not None else None
    held_out = plan.schedule.held_out(plan.data.batches(s.seed + EVAL_SEED_OFFSET, device, held_out=True))
    recorder = Recorder(s.sample.batch, s.sample.channels, s.seed)
    resume = Resume(out_dir, plan.config_yaml, model, optimizer, enabled=in_scheduler_job())
    first = resume.restore(data)  # a requeued job's run goes on from its last complete step
    for _ in range(first if clean_data is not None else 0):
        next(clean_data)
    compile_time_s = _warm_up_statistics(plan, device)
    with HookSession(model, plan.hooks, recorder) as session, OutputMetrics(model, s.metric) as measures, \
            early_stop.stopping(model, s.stop_after, plan.hooks):
        forward = _compiled(model) if s.compile else model
        extra = {"seed": s.seed, "compile_time_s": compile_time_s,
                 "provenance": provenance(plan),  # what a replay checks (runner.cli.replay)
                 **({"resumed_at_step": first} if first else {})}
        if resume.hooks_state is not None:
            session.restore_run_state(resume.hooks_state)
        with RunOutputs(out_dir, plan.config_yaml, plan.overrides, plan.row_group_bytes, s.overwrite, claim=claim,
                        extra=extra) as outputs, resume.keeping(outputs), progress_bar(s.steps, s.progress) as bar:
            steps = StepWriter(session, outputs, s, device)
            for step in range(first, s.steps):
                steps.begin(step)
                batch = next(data)
                recorder.samples = batch.samples
                if plan.keep_input and recorder.enabled:  # what Grad-CAM overlays, read back from the run
                    recorder.record(batch.x, hook="(input)", layer="", phase="forward", kind="model_input",
                                    slot="0", call=0, keep=True)
                steps.start()
                beside = {} if clean_data is None else _explained(
                    plan, clean_and_corrupted, forward, model, next(clean_data).x, batch.x,
                    side_by_side(plan.hooks), recorder, measures)
                loss, accuracy = _explained(plan, train_step, forward, model, batch, plan.loss_fn, session,
                                            optimizer, plan.classifies, gradients)
                steps.finish(step, loss, metrics={"accuracy": accuracy, **measures.take(), **beside})
                if plan.schedule.due(step):
                    recorder.set_enabled(True)  # eval passes are rare: always recorded
                    steps.start()
                    _eval(steps, step, eval_passes(forward, model, held_out, plan.loss_fn, recorder, plan.classifies),
                          measures.take())
                bar.set_postfix(loss=loss, refresh=False)
                bar.update()
                resume.mark(step + 1, session.run_state())
            outputs.extra["lifetimes"] = session.lifetimes()  # when each entry's hooks came and went
            write_tables(plan.hooks, outputs)
    resume.finish()
    return out_dir


def _eval(steps: StepWriter, step: int, result, measures: dict[str, float]) -> None:
    """Write the eval passes after training step ``step`` (their captures held by no local of ``run``)."""
    captures, loss, accuracy = result
    steps.finish(step, loss, captures, split="eval", metrics={"accuracy": accuracy, **measures})


def _warm_up_statistics(plan: Plan, device: torch.device) -> float:
    """Build the statistics kernel before step 0 when the run will use it; return the seconds it took.

    The first captured tensor would otherwise pay for the build (the C kernel on CPU, the first
    time on a machine; ``torch.compile`` on CUDA) inside step 0, and step 0's ``wall_time_s``
    would report it as the hooks' cost. The manifest keeps the time apart.
    """
    found = plan.rehearsal
    large = found is None or any(nbytes >= count * COMPILE_MIN_NUMEL * 2 for count, nbytes, _ in found.records.values()
                                 if count)
    if not plan.hooks or (device.type != "cpu" and not large):
        return 0.0
    start = time.perf_counter()
    prepare_statistics(device)
    return time.perf_counter() - start


def _available(name: str) -> torch.device:
    """The plan's device, checked where the job runs (a sweep's plan may come from a login node)."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but torch.cuda.is_available() is False on this node; "
                          "use device=cpu or auto")
    return torch.device(name)


def _explained(plan: Plan, fn, *args):
    """Call ``fn``; an error one of the plan's entries can explain becomes that entry's one-line error."""
    try:
        return fn(*args)
    except Exception as exc:
        message = explanation(plan.hooks, exc)
        if message:
            raise ConfigError(message) from None
        raise


def _compiled(model: nn.Module) -> nn.Module:
    """``torch.compile(model)``; called only after every hook is registered on ``model``.

    Compilation happens at the first call, and hooks added after it are silently ignored
    (``torch._dynamo.config.skip_nnmodule_hook_guards``). The hooks stay on ``model``'s own
    modules, so layer names carry no ``_orig_mod.`` prefix.
    """
    return torch.compile(model)
