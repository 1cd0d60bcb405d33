"""``compile_plan(cfg)``: a composed config, checked once and built into a frozen ``Plan``.

Every check a run makes before its first pass happens here, once, in one order (``GATE``, the list
of the check functions): the modules presets name (``_module_``), the config against the schema
(also for configs that did not come through Hydra), the run settings, the model target, whether
it can generate (``mode=generate``: before the data and epochs it would make fail) and its
checkpoint file, the data (built once: image files are read here), the loss, the optimizer, each
hook entry, the pictures asked for, the device, a rehearsal of one step on the meta device
(selectors, shapes, what each entry records), and what only the built model can say (the module
``stop_after`` names, parameters to train). ``runner.attach``'s own checks (its arguments, the
user's model, its first call on the meta device) are listed there too. ``run(plan, out_dir)`` then only loops;
``plan=true`` prints ``describe(plan)``; the sweep checks compile every job's plan before any
job runs. Each failure is one ``ConfigError`` naming the key.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from common.errors import ConfigError, choice_error
from common.records import GENERATE, GENERATIONS
from common.schema_merge import known_keys, merged, schema_template
from hooks import build_hooks
from hooks.kernels import native
from hooks.mechanism.base import HookType
from hooks.mechanism.compiled import compiled_problem
import runner.sources  # noqa: F401  (registers the built-in models, data kinds, losses and optimizers)
from runner.config.compose import compose_plain
from runner.config.generate_model import check_generate_model
from runner.config.registry import DATA_KINDS, MODELS, MODULE_KEY, OPTIMIZERS, PLOTS, import_named
from runner.config.schema import FsdpConfig, LossConfig, MemoryConfig, MetricConfig, NamedModel, OutputConfig, RunConfig, SampleConfig
from runner.engine.budget import DEVICE, check_budget, held, parse_size, size_text
from runner.engine.fsdp import check_fsdp
from runner.engine.metrics import check_metric, missing_metric
from runner.engine.rehearsal import Rehearsal, meta_model, rehearse, rehearse_call
from runner.engine import early_stop, generation, whole_pass
from runner.engine.train import EvalSchedule, check_optimizer, trainable
from runner.live import typed_loggers
from runner.sources.data import DataSource
from runner.sources.hf import check_hf
from runner.sources.losses import CLASSIFICATION_LOSSES, LossFn, get_loss
from runner.sources.models import check_target
from runner.sources.text import warn_of_pads

@dataclass(frozen=True)
class Plan:
    """Everything a run needs, checked: built hooks, loss, optimizer spec, data source, settings.

    ``settings`` is the typed run config (``RunConfig``: ``settings.steps``, ``settings.sample.every``);
    ``model`` and ``data`` are the checked model and data configs; ``rehearsal`` is what the meta
    step showed (``None`` when the model cannot run on the meta device). ``hooks`` are the checked
    entries (their specs, and the state the rehearsal gave them); every run attaches fresh ones
    (``HookType.fresh``), so a plan can be run again, or resumed, as it was compiled.
    """

    settings: RunConfig
    config_yaml: str
    overrides: tuple[str, ...]
    model: DictConfig
    data: DataSource
    loss_fn: LossFn | None
    optimizer: object  #: the optimizer's schema dataclass, filled (``runner.config.registry.OPTIMIZERS``)
    hooks: tuple[HookType, ...]
    schedule: EvalSchedule
    device: str
    row_group_bytes: int
    keep_input: bool
    rehearsal: Rehearsal | None
    classifies: bool = False  #: the loss is a classification loss: steps report ``accuracy``
    #: the clean batches of ``patch`` entries with ``source: clean`` (``runner.engine.side_by_side``)
    clean_data: DataSource | None = None


class Replaced(NamedTuple):
    """A sweep's job whose config is another job's with values replaced (``runner.cli.sweep_compile``):
    its config merged into the schema is that job's (``schema_merged``, never changed) with the same
    values replaced (OmegaConf's typed nodes check and convert each as the merge would), then resolved:
    a copy and a few updates where the merge was 15 ms a job."""

    merged: DictConfig
    values: tuple[tuple[str, Any], ...]


def compile_plan(cfg: DictConfig, overrides: Sequence[str] = (), *, check_device: bool = True,
                 replaced: Replaced | None = None) -> Plan:
    """Check ``cfg`` and build its plan; ``check_device=False`` leaves CUDA availability to the job's node;
    ``replaced``: ``cfg`` is another job's config with values replaced (a sweep's job, ``Replaced``).

    Every call below is a check of ``GATE`` (or builds only from what one passed): a check made
    here in line, or in a function outside ``GATE``, fails ``tests/test_gate.py``.

    Raises:
        ConfigError: the first mistake, naming its key, the valid choices and the closest one.
    """
    typed, settings = compile_settings(cfg, overrides, replaced)
    model = _model_config(typed.model)
    check_generate_model(settings.mode, model)  # the real cause, before the data and epochs it makes fail
    _check_checkpoint(model)
    data = _data(_data_config(typed.data), model)
    whole_pass.check(settings, data)
    _steps_of_epochs(settings, data)
    loss_fn = get_loss(typed.loss)
    optimizer = _optimizer(typed.optimizer)
    hooks = compile_hooks(typed)
    _check_hooks_against_run(hooks, loss_fn, optimizer, settings)
    generation.check_run(settings, data, hooks, optimizer)
    warn_of_pads(settings, data)
    early_stop.check(settings.stop_after, typed.loss.name, settings.metric)
    keep_input = _check_plots(settings, hooks, loss_fn)
    device = _device(settings.device.value, check_device)
    meta = meta_model(model)
    found = rehearse(meta, settings.mode.value == "train", data, hooks, loss_fn, settings.sample)
    check_budget(settings.memory.budget, found)
    _check_model(meta, settings, optimizer, hooks)
    _check_steps(hooks, settings.steps)
    clean_data = _clean_data(typed.data, model, data, hooks)
    return Plan(settings=settings, config_yaml=OmegaConf.to_yaml(typed, resolve=True), overrides=tuple(overrides),
                model=model, data=data, loss_fn=loss_fn, optimizer=optimizer, hooks=hooks,
                schedule=EvalSchedule(settings.eval_every, settings.eval_steps), device=device,
                row_group_bytes=max(1, int(settings.output.row_group_mb * (1 << 20))), keep_input=keep_input,
                rehearsal=found, classifies=typed.loss.name in CLASSIFICATION_LOSSES, clean_data=clean_data)


#: The run settings that mean something in ``runner.attach``'s user loop (the others describe the runner's own loop).
ATTACH_SETTINGS = ("seed", "on_nonfinite", "on_silent", "overwrite", "sample", "output", "memory")

#: Settings copied into ``Plan.settings`` (the groups are checked and built on their own).
SETTINGS = [name for name in RunConfig.__dataclass_fields__ if name not in ("model", "data", "optimizer", "hooks")]


def compile_settings(cfg: DictConfig, overrides: Sequence[str] = (), replaced: Replaced | None = None
                     ) -> tuple[DictConfig, RunConfig]:
    """``cfg`` merged into the schema and resolved, and its run settings, checked (also for ``runner.attach``);
    ``overrides`` are the command that composed it (a preset listed twice in ``hooks=[...]`` is refused)."""
    typed = _typed(cfg) if replaced is None else _typed(cfg, replaced)
    _steps_or_epochs(typed)
    settings = run_settings(typed)
    _check_settings(settings, {key: entry.get("type") for key, entry in typed.hooks.items()})
    check_metric(settings.metric, typed.model.get("num_classes"))
    _check_repeated_presets(overrides)
    return typed, settings


def run_settings(typed: DictConfig) -> RunConfig:
    """``typed``'s ``SETTINGS`` as a ``RunConfig``, each converted on its own: a masked copy of the config
    first was a deep copy of OmegaConf nodes, 3.5 ms of a 64-job sweep's 50 ms a job."""
    return RunConfig(**{name: OmegaConf.to_object(value) if isinstance(value := typed[name], (DictConfig, ListConfig))
                        else value for name in SETTINGS})


def compile_hooks(typed: DictConfig) -> tuple[HookType, ...]:
    """The hook entries of a typed config, built and checked against their types' schemas."""
    entries = _resolved(typed.hooks, "hooks")
    return tuple(build_hooks({name: {k: v for k, v in entry.items() if k != MODULE_KEY} if isinstance(entry, dict)
                              else entry for name, entry in entries.items()}))


def attach_config(hooks, overrides: Sequence[str], settings: dict, logger) -> tuple[DictConfig, list[str]]:
    """``runner.attach``'s arguments as the config and command lines they stand for: ``hooks`` (preset
    names, or a mapping of entries), ``overrides``, ``settings`` (``ATTACH_SETTINGS`` only) and
    ``logger`` (names, or a mapping of their settings), composed as the command line composes them."""
    for key in settings:
        if key not in ATTACH_SETTINGS:
            raise choice_error(key, key, ATTACH_SETTINGS, "setting of runner.attach")
    if isinstance(hooks, str) or not isinstance(hooks, (Sequence, Mapping)):
        raise ConfigError(f"hooks: {hooks!r} must be a list of preset names or a mapping of entries")
    if isinstance(logger, str) or not isinstance(logger, (Sequence, Mapping)):
        raise ConfigError(f"logger: {logger!r} must be a list of logger names or a mapping of their settings")
    entries = dict(hooks) if isinstance(hooks, Mapping) else {}
    loggers = {name: dict(node or {}) for name, node in logger.items()} if isinstance(logger, Mapping) else {}
    lines = attach_lines(hooks, overrides, logger)
    composed = OmegaConf.create(compose_plain(lines))  # composed once while its files are unchanged
    try:
        return OmegaConf.merge(composed, {"hooks": entries, "logger": loggers}, settings), lines
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{getattr(exc, 'full_key', '') or 'hooks'}: {str(exc).splitlines()[0]}") from None


def attach_lines(hooks, overrides: Sequence[str], logger) -> list[str]:
    """The command lines ``runner.attach``'s ``hooks``, ``overrides`` and ``logger`` stand for: preset names
    as ``hooks=[...]`` and ``logger=[...]`` (a mapping of entries or settings is merged after composing)."""
    lines = [f"hooks=[{','.join(map(str, hooks))}]" if not isinstance(hooks, Mapping) else "hooks=[]", *overrides]
    if logger and not isinstance(logger, Mapping):
        lines.insert(1, f"logger=[{','.join(map(str, logger))}]")
    return lines


def check_attached_model(model: nn.Module, hooks: Sequence[HookType]) -> None:
    """``runner.attach``'s model can serve its entries: not compiled already (compiled code never runs
    hooks added after it), each selector matching some module, each entry servable by a user's own loop."""
    if problem := compiled_problem(model):
        raise ConfigError(problem)
    for hook in hooks:
        hook.targets(model)  # a selector that matches none of the model's modules fails here, one line
    for hook in hooks:
        if hook.own_loop_problem:
            raise ConfigError(hook.own_loop_problem)


def _typed(cfg: DictConfig, replaced: Replaced | None = None) -> DictConfig:
    """``cfg`` merged into the schema: a key or type Hydra did not see (``+typo=1``, a config built in
    code) fails here. ``replaced``: ``cfg`` is another job's config with values replaced (``Replaced``)."""
    known_keys(RunConfig, cfg, "", "setting")
    _import_modules(cfg)
    for group, schema in (("sample", SampleConfig), ("output", OutputConfig), ("loss", LossConfig),
                          ("metric", MetricConfig), ("fsdp", FsdpConfig), ("memory", MemoryConfig)):
        if isinstance(cfg.get(group), DictConfig):
            known_keys(schema, cfg[group], f"{group}.", f"key for {group}")
    typed = None if replaced is None else _with_values(replaced)
    if typed is None:
        try:
            typed = OmegaConf.merge(schema_template(RunConfig), cfg)
        except OmegaConfBaseException as exc:
            raise _one_line(exc) from None
    try:
        OmegaConf.resolve(typed)  # interpolations such as ${model.head} resolve once, here
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{_unresolvable(typed) or 'config'}: {str(exc).splitlines()[0]}") from None
    for group in ("model", "data", "optimizer"):
        if OmegaConf.is_missing(typed, group):
            raise ConfigError(f"{group}: not set; pick a preset ({group}=NAME)")
    return typed


def schema_merged(cfg: DictConfig) -> DictConfig | None:
    """``cfg`` merged into the schema, unresolved, for ``Replaced``; ``None`` where the merge fails (the job's
    own compile says why)."""
    try:
        return OmegaConf.merge(schema_template(RunConfig), cfg)
    except OmegaConfBaseException:
        return None


def _with_values(replaced: Replaced) -> DictConfig | None:
    """``replaced.merged`` copied, with its values replaced; ``None`` where a value is refused (the merge
    of the job's own config says why, in its own words)."""
    typed = copy.deepcopy(replaced.merged)
    try:
        for key, value in replaced.values:
            OmegaConf.update(typed, key, value, merge=True)
    except (OmegaConfBaseException, ValueError, TypeError):
        return None
    return typed


def _import_modules(cfg: DictConfig) -> None:
    """Import each module a preset names (``_module_``), so the choices it registers are known."""
    for group in ("model", "data", "loss", "optimizer", "metric"):
        import_named(cfg.get(group), group)
    for name, entry in (cfg.get("hooks") or {}).items():
        import_named(entry, f"hooks.{name}")


def _unresolvable(node, prefix: str = "") -> str | None:
    """The full key of the first value whose interpolation does not resolve."""
    for key in node.keys():
        full = f"{prefix}{key}"
        try:
            value = node[key]
        except OmegaConfBaseException:
            return full
        if isinstance(value, (DictConfig, ListConfig)):
            found = _unresolvable(value, f"{full}.") if isinstance(value, DictConfig) else None
            if found:
                return found
    return None


def _one_line(exc: OmegaConfBaseException) -> ConfigError:
    key = getattr(exc, "full_key", "") or ""
    message = str(exc).splitlines()[0]
    return ConfigError(f"{key}: {message}" if key else message)


def _resolved(node, key: str):
    try:
        return OmegaConf.to_container(node, resolve=True) if node is not None else {}
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{key}: {str(exc).splitlines()[0]}") from None


def _steps_or_epochs(typed: DictConfig) -> None:
    """``steps`` or ``epochs``, never both; neither is one step (kept as ``steps: 1`` in config.yaml), or under
    ``mode=generate`` one pass over the prompts."""
    if typed.steps is not None and typed.epochs is not None:
        raise ConfigError(f"epochs: {typed.epochs} and steps: {typed.steps} both given; set one of them "
                          f"(epochs counts passes over the dataset)")
    if typed.epochs is None and typed.steps is None and typed.mode == "generate":
        typed.epochs = 1  # every prompt once
    if typed.epochs is None:
        typed.steps = 1 if typed.steps is None else typed.steps
    elif typed.epochs < 1:
        raise ConfigError(f"epochs: {typed.epochs} must be at least 1")


def _check_settings(s: RunConfig, entry_types: dict[str, str]) -> None:
    """The run's settings, the kernels' switch (``HOOK_RUNNER_NATIVE``: read again by every statistic, so
    a bad value is said here, before anything is written), and its loggers (made typed:
    ``runner.live.typed_loggers``) against its hook entries."""
    native.enabled()
    steps = 1 if s.steps is None else s.steps  # None: epochs, counted once the data is built
    for key, value, minimum in (("steps", steps, 1), ("eval_every", s.eval_every, 0), ("eval_steps", s.eval_steps, 1),
                                ("sample.every", s.sample.every, 1)):
        if value < minimum:
            hint = " (1 = every step)" if key == "sample.every" else ""
            raise ConfigError(f"{key}: {value} must be at least {minimum}{hint}")
    for key in ("batch", "channels"):
        value = getattr(s.sample, key)
        if value is not None and value < 1:
            raise ConfigError(f"sample.{key}: {value} must be at least 1, or null for all of them")
    if not s.output.row_group_mb > 0:
        raise ConfigError(f"output.row_group_mb: {s.output.row_group_mb!r} must be a positive number of MiB")
    if s.mode == GENERATE and GENERATE in entry_types:  # its rows, resume state and answer are the generation's
        raise ConfigError(f"hooks.{GENERATE}: in mode={GENERATE} the name '{GENERATE}' is the generation's own (its "
                          f"rows in {GENERATIONS}, its answer); rename the entry, e.g. hooks.{GENERATE}_edit")
    check_fsdp(s)
    if s.memory.budget is not None:
        parse_size(s.memory.budget, "memory.budget")  # a bad size fails with the settings, before any work
    s.logger = typed_loggers(s.logger, entry_types)


def _check_repeated_presets(overrides: Sequence[str]) -> None:
    """``hooks=[clip,clip]`` composes one ``clip`` entry: the second is silently lost."""
    try:
        parsed = OverridesParser.create().parse_overrides([o for o in overrides if o.lstrip("+~").startswith("hooks=")])
    except HydraException:
        return  # not an override Hydra accepts: composing it fails with its own message
    for override in parsed:
        value = None if override.is_sweep_override() else override.value()
        if not isinstance(value, list):
            continue
        seen: set[str] = set()
        for name in map(str, value):
            if name in seen:
                raise ConfigError(f"hooks: preset '{name}' is listed twice in {override.input_line}; each preset "
                                  f"adds the one entry hooks.{name}: list it once, or add a second entry under a "
                                  f"new name (+hooks.{name}_2.type=...)")
            seen.add(name)


def _model_config(model: DictConfig) -> DictConfig:
    if "_target_" in model.keys():
        if OmegaConf.is_missing(model, "_target_"):
            raise ConfigError("model._target_: required for model=custom, e.g. model._target_=mypkg.MyNet")
        check_target(model)
        return model
    name = model.get("name")
    schema = MODELS.get(name).schema if name in MODELS else NamedModel  # other names: torchvision's
    merged = _merged(schema, model, "model", f"key for model '{name}'")
    if name in MODELS and merged.weights:
        raise ConfigError(f"model.weights: '{name}' has no pretrained weights; use model.checkpoint=PATH")
    return check_hf(merged) if name == "hf" else merged


def _check_checkpoint(model: DictConfig) -> None:
    """``model.checkpoint`` names a file (its loading, .pt or .safetensors, is the build's)."""
    path = model.get("checkpoint")
    if not path:
        return
    if not Path(path).is_file():
        raise ConfigError(f"model.checkpoint: no file at '{path}'")


def _data(data: DictConfig, model: DictConfig) -> DataSource:
    """The data source, built once: its kind checks its keys and reads what must be read (image files)."""
    return DataSource(data, model)


def _steps_of_epochs(settings: RunConfig, data: DataSource) -> None:
    """``epochs=N``: the steps of N passes over the data (which must have a length), in ``settings.steps``."""
    if settings.epochs is not None:
        settings.steps = whole_pass.epoch_steps(settings, data, settings.epochs)


def _check_model(model: nn.Module | None, settings: RunConfig, optimizer, hooks: Sequence[HookType]) -> None:
    """What only the built model can say, asked of the one built on the meta device (``None``: the run's
    build says it): the module ``stop_after`` names (or, for ``auto``, finds), the parameters the
    optimizer would train, and each entry's own (``HookType.check_built``)."""
    if model is None:
        return
    if settings.stop_after is not None:
        early_stop.stop_module(model, settings.stop_after, hooks)
    trainable(optimizer, model)
    if generation.generating(settings):
        generation.check_model(model)
    for hook in hooks:
        hook.check_built(model)


def _check_steps(hooks: Sequence[HookType], steps: int) -> None:
    """Each entry can serve a run of ``steps`` steps (``patch``: its source run kept them)."""
    for hook in hooks:
        hook.check_steps(steps)


def _clean_data(data: DictConfig, model: DictConfig, corrupted: DataSource, hooks) -> DataSource | None:
    """The batches of the pass the entries ask to run beside each step (``HookType.side_data``:
    ``patch`` with ``source: clean``): the run's data with the entries' keys over it. The entries
    must agree, and that batch must have the step's batch's shape (the patched layers' outputs
    would not fit otherwise)."""
    entries = [hook for hook in hooks if hook.side_data is not None]
    if not entries:
        return None
    first = entries[0]
    for other in entries[1:]:
        if other.side_data != first.side_data:
            raise ConfigError(f"{other.key}.clean: {other.side_data} differs from {first.key}.clean "
                              f"{first.side_data}; one clean pass serves every entry")
    key = f"{first.key}.clean"
    try:
        plain = OmegaConf.create(OmegaConf.to_container(data, enum_to_str=True))  # open to the keys checked below
        clean = DataSource(_data_config(OmegaConf.merge(plain, first.side_data)), model)
    except ConfigError as exc:  # the data checks name data.KEY: here the key is the entry's
        message = str(exc)
        raise ConfigError(key + message[len("data"):] if message.startswith("data.") else f"{key}: {message}") from None
    if (clean.input_shape, clean.input_dtype) != (corrupted.input_shape, corrupted.input_dtype):
        raise ConfigError(f"{key}: the clean batch is {clean.input_dtype} {clean.input_shape}, the run's batch "
                          f"{corrupted.input_dtype} {corrupted.input_shape}; patching needs the same shape")
    return clean


def _data_config(data: DictConfig) -> DictConfig:
    kind = data.get("kind")
    return _merged(DATA_KINDS.get(kind).schema, data, "data", f"key for data kind '{kind}'")


def _optimizer(node: DictConfig):
    name = node.get("name")
    spec = OmegaConf.to_object(_merged(OPTIMIZERS.get(name).schema, node, "optimizer", f"key for optimizer '{name}'"))
    check_optimizer(spec)
    return spec


def _merged(schema: type, node: DictConfig, key: str, what: str) -> DictConfig:
    """``node`` merged into ``schema`` (``common.schema_merge.merged``), without ``_module_`` (the module
    registering the choice, imported by ``_typed``)."""
    if MODULE_KEY in node:
        node = OmegaConf.masked_copy(node, [k for k in node.keys() if k != MODULE_KEY])
    return merged(schema, node, key, what)


def _check_hooks_against_run(hooks: Sequence[HookType], loss_fn: LossFn | None, optimizer, settings: RunConfig) -> None:
    if loss_fn is None:
        for hook in hooks:
            if hook.needs_backward:
                forward = _forward_only(hook, lambda lighter: lighter.needs_backward)
                instead = f", record the forward pass only ({forward})," if forward else ""
                raise ConfigError(f"{hook.key}: '{hook.spec.type}' needs a backward pass but loss=none; "
                                  f"choose a loss (e.g. loss=sum){instead} or drop the entry")
        if optimizer.name != "none":
            raise ConfigError(f"optimizer: '{optimizer.name}' needs a loss to train on but loss=none")
    for hook in hooks:
        lacking = hook.side_metric and missing_metric(settings.metric, hook.side_metric)
        if lacking:
            raise ConfigError(f"{hook.key}.metric: {lacking}")
    for hook in hooks if settings.eval_every else ():
        if hook.eval_problem:
            raise ConfigError(f"{hook.key}: '{hook.spec.type}' {hook.eval_problem}; set eval_every=0 or drop the entry")
    if settings.compile:
        for hook in hooks:
            if hook.compile_problem:
                forward = _forward_only(hook, lambda lighter: lighter.compile_problem)
                instead = f"record the forward pass only ({forward}), " if forward else ""
                raise ConfigError(f"{hook.key}: hook type '{hook.spec.type}' {hook.compile_problem}, which "
                                  f"torch.compile does not support; {instead}use compile=false or drop the entry")


def _forward_only(hook: HookType, problem: Callable[[HookType], object]) -> str:
    """The override keeping only the entry's forward kinds (``hooks.stats.kinds=[output]``), when the entry
    so narrowed has no ``problem``; ``""`` when it records no forward kind or the narrowing does not help."""
    kinds = list(getattr(hook.spec, "kinds", None) or ())
    forward = [kind for kind in kinds if kind in ("input", "output")]
    if not forward or forward == kinds:
        return ""
    lighter = type(hook)(hook.name, dataclasses.replace(hook.spec, kinds=forward))
    return "" if problem(lighter) else f"{hook.key}.kinds=[{','.join(forward)}]"


def _check_plots(settings: RunConfig, hooks: Sequence[HookType], loss_fn: LossFn | None) -> bool:
    """Each picture asked for is registered and has the records it is drawn from (its ``missing``);
    return whether to store the input image."""
    if not settings.plots:
        return False
    import runner.analysis.plots  # noqa: F401  (registers the pictures; matplotlib only when they are asked for)
    pictures = []
    for index, name in enumerate(settings.plots):
        pictures.append(PLOTS.get(name, key=f"plots[{index}]").build)
        problem = pictures[-1].missing(hooks, loss_fn)
        if problem:
            raise ConfigError(f"plots: '{name}' needs {problem}")
    return any(picture.keeps_input for picture in pictures)


def _device(name: str, check_available: bool) -> str:
    """``auto`` is CUDA when available, else CPU; ``cuda`` without a GPU is a config error where it is checked."""
    if name == "cuda" and check_available and not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but torch.cuda.is_available() is False; use device=cpu or auto")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def describe(plan: Plan) -> str:
    """The plan as ``plan=true`` prints it: modules, each entry's matches and hooks, records per step."""
    found = plan.rehearsal
    if found is None:
        return "\n".join([f"{hook.key} (type {hook.spec.type}): {hook.pytorch_hooks}" for hook in plan.hooks]
                         + ["(the model cannot run on the meta device: no module table, no capture sizes)"])
    lines = [f"model: {found.model_class}, {len(found.modules)} modules ({found.parameters:,} parameters); "
             f"input {found.input_shape}"]
    lines += [f"  {name or '(model)':<32} {cls:<20} {shape}" for name, cls, shape in found.modules]
    if found.vocabulary:
        family, quirks, names = found.vocabulary
        lines.append(f"vocabulary ({family} family: {', '.join(quirks)}; canonical -> module):")
        lines += [f"  {canonical:<32} {real}" for canonical, real in names.items()]
    for hook in plan.hooks:
        names = found.matches.get(hook.key, [])
        lines.append(f"{hook.key} (type {hook.spec.type}): {hook.pytorch_hooks}")
        lines.append(f"  {len(names)} module(s): {', '.join(names[:12])}{', ...' if len(names) > 12 else ''}")
    if plan.hooks:
        lines.append("per step:")
        for (key, kind), (count, nbytes, kept) in sorted(found.records.items()):
            lines.append(f"  hooks.{key}: {count} {kind} tensor(s), {size_text(nbytes)} seen"
                         + (f", {size_text(kept)} kept in tensors.parquet" if kept else ""))
    kept = held(found)
    if kept:
        budget = plan.settings.memory.budget
        lines.append(f"held by the entries on {DEVICE} (the host; under torchrun, on each rank)"
                     f"{f', memory.budget={budget}' if budget else ''}:")
        lines += [f"  hooks.{key}: {size_text(nbytes)} of {what}" for key, what, nbytes in kept]
        lines.append(f"  total: {size_text(sum(nbytes for _, _, nbytes in kept))}")
    return "\n".join(lines)


#: The gate: every check a config passes before anything runs, whether it came from the command line,
#: ``runner.attach``, a replay or a test, in the order they are made, each made once per compile
#: (``tests/test_gate.py`` counts their calls, and fails on a check made outside them: in
#: ``compile_plan`` or ``runner.attach`` itself, or in the run). On the command line they all run in
#: ``check_command_line``, before Hydra writes anything. Builders (``build_model``, the data kinds,
#: ``build_optimizer``) trust what passed.
GATE = (
    attach_config, _typed, _import_modules, _steps_or_epochs, _check_settings, check_fsdp, check_metric,
    _check_repeated_presets, _model_config, check_target, check_hf, check_generate_model, _check_checkpoint, _data_config, _data,
    whole_pass.check, _steps_of_epochs, get_loss, _optimizer, check_optimizer, compile_hooks, build_hooks,
    _check_hooks_against_run, generation.check_run, warn_of_pads, early_stop.check, _check_plots, _device, meta_model, rehearse, check_budget,
    _check_model, _check_steps, _clean_data,
    check_attached_model, rehearse_call,  # runner.attach: the user's model, and its first call on the meta device
)
