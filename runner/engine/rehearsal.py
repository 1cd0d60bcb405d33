"""One step rehearsed on the meta device, with the real hooks attached: shapes without compute.

The model is built on the meta device (``meta_model``: no weights are allocated or loaded) and one forward
(and, with a loss, backward) pass runs there on a batch of the planned shape. That resolves
every selector, gives every module's output shape and what each entry records per step
(``plan=true`` prints them), and turns mistakes that only show while a pass runs into one-line
``ConfigError``s before anything is built for real: a data shape that does not fit the model
(naming ``data.shape`` and the module where it failed), a residual across a shape change, a hook
returning a tensor of another shape, PyTorch's in-place error under ``mechanism: module``.

A model that cannot be built or run on the meta device (downloaded weights, data-dependent
control flow) is not rehearsed; the real run reports its own errors.

``runner.attach`` gets a model it cannot rebuild from a config: ``rehearse_first_call`` rehearses
the user's own model at its first call instead, before that call computes anything. The entries
are attached already; the pass runs through ``torch.func.functional_call`` with meta tensors in
place of the parameters, buffers and inputs (nothing of the model is copied or changed), outside
the run's records (``Recorder.aside``) and the random number generators, then the real call goes on.
A block whose entries are a kept plan's (``runner.engine.attach_plan``), called on the same model as it
was (``model_state``: its modules, their Python settings and hooks, its tensors' shapes) with inputs of
the same shapes, is not rehearsed again: that pass is what was rehearsed before (about 7 of an attach
block's 24 ms of CPU); anything else is rehearsed, and a refused rehearsal is never kept.
"""
from __future__ import annotations

import contextlib
import copy
import io
import re
import traceback
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.func import functional_call
from omegaconf import DictConfig
from torch import nn
from torch.nn.modules import module as nn_module

from common.errors import ConfigError
from hooks import HookSession
from hooks.mechanism.base import HookType, explanation
from hooks.mechanism.families import known_vocabulary
from hooks.mechanism.recorder import Recorder, walk
from hooks.mechanism.shards import is_sharded
from runner.engine.budget import check_budget
from runner.sources.data import DataSource
from runner.sources.losses import LossFn, first_tensor
from runner.engine.plan_cache import built_on_meta
from runner.sources.models import load_checkpoint

#: What the meta device says when it, not the config, is the limit (data-dependent code).
_META_LIMIT = re.compile(r"meta|data-dependent|item\(\)|nonzero", re.I)


@dataclass
class Rehearsal:
    """What one meta step showed: modules with their output shapes, matches, and per-step records."""

    model_class: str
    parameters: int
    input_shape: list[int]
    modules: list[tuple[str, str, str]] = field(default_factory=list)   # (name, class, output shapes)
    matches: dict[str, list[str]] = field(default_factory=dict)          # entry key -> module names
    records: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (entry, kind) -> [n, bytes, kept]
    held: dict[str, dict[str, int]] = field(default_factory=dict)  # entry name -> what holds bytes across steps -> bytes
    vocabulary: tuple[str, list[str], dict[str, str]] | None = None  # family, its quirks, canonical -> module (hooks.mechanism.families)


def meta_model(model_cfg: DictConfig) -> nn.Module | None:
    """The model built on the meta device (no weights allocated or read), with ``model.checkpoint``
    fitted to it (a missing key or a shape that does not fit is one line, before Hydra writes the
    run's directory); ``None`` when it cannot be built there (a weights name downloads; code the
    meta device cannot run): the real run reports its own errors."""
    if model_cfg.get("weights"):
        return None  # a weights name downloads: nothing to build on the meta device
    try:
        model = built_on_meta(model_cfg)  # a sweep's jobs of one model config share it (runner.engine.plan_cache)
    except ConfigError:
        raise
    except Exception:  # noqa: BLE001 - not buildable on meta: the real run reports its own errors
        return None
    if model_cfg.get("checkpoint"):
        load_checkpoint(model, Path(model_cfg.checkpoint), device="meta")
    return model


def rehearse(model: nn.Module | None, train_mode: bool, source: DataSource, hooks: Sequence[HookType],
             loss_fn: LossFn | None, sample=None) -> Rehearsal | None:
    """Run one meta step of ``model`` (``meta_model``'s); raise ``ConfigError`` for the config's mistakes,
    ``None`` if not rehearsable.

    ``hooks`` are the plan's specs: the step attaches fresh copies, so nothing it loads or counts stays in them.
    ``sample`` (``RunConfig.sample``) samples what the step records as the run will.
    """
    if model is None:
        return None
    hooks = [hook.fresh() for hook in hooks]
    model.train(train_mode)
    found = Rehearsal(type(model).__name__, sum(p.numel() for p in model.parameters()), list(source.input_shape))
    vocab = known_vocabulary(model)
    found.vocabulary = (vocab.family, vocab.quirks(), vocab.names) if vocab else None
    for hook in hooks:
        found.matches[hook.key] = [name or "(model)" for name, _ in hook.targets(model)]
    x = torch.empty(source.input_shape, dtype=source.input_dtype, device="meta")
    recorder = Recorder(*((sample.batch, sample.channels) if sample else ()), statistics=False)
    shapes = _ModuleShapes(model)
    try:
        with shapes, contextlib.redirect_stdout(io.StringIO()):  # ``print`` hooks print in the real run only
            _step(model, x, hooks, loss_fn, recorder)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - sorted below: the data's fault, a hook's, or meta's limits
        explained = _explain(exc, hooks, shapes, source)
        if explained is None:
            return None
        raise explained from None
    found.modules = [(name, type(m).__name__, shapes.seen.get(name, "-")) for name, m in model.named_modules()]
    found.records = {key: list(tally) for key, tally in recorder.tally().items()}
    found.held = {hook.name: held for hook in hooks if (held := hook.held_bytes())}
    return found


def _step(model: nn.Module, x: torch.Tensor, hooks: Sequence[HookType], loss_fn: LossFn | None,
          recorder: Recorder) -> None:
    with HookSession(model, hooks, recorder, lifetimes=False) as session:  # entries starting late too
        if loss_fn is None:
            with torch.no_grad():
                model(x)
            return
        out = model(x)
        targets = torch.zeros(x.shape[0], dtype=torch.long, device="meta")
        session.backward(loss_fn(first_tensor(out), targets))


def _explain(exc: BaseException, hooks: Sequence[HookType], shapes: _ModuleShapes,
             source: DataSource | None) -> ConfigError | None:
    """The one-line error for what failed in the rehearsal, or ``None`` when meta is to blame
    (or, without a ``source``, the user's input: the real call shows its own error)."""
    message = explanation(hooks, exc)
    if message:
        return ConfigError(message)
    text = " ".join(str(exc).split())
    if not isinstance(exc, (RuntimeError, ValueError, IndexError)) or _META_LIMIT.search(text):
        return None
    if shapes.failed is None or not _raised_by_torch(exc) or source is None:
        return None  # the model's or a hook's own code failed: the real run shows where
    name, cls = shapes.failed
    return ConfigError(f"data.shape: {list(source.input_shape)} does not fit the model: module "
                       f"'{name or '(model)'}' ({cls}) failed on it: {text[:240]}")


#: First-call rehearsals that passed, by what decides their outcome (``_first_call_key``), newest last:
#: each with its model (weakly: a model dropped is never matched again) and the kept entries it rehearsed.
_REHEARSED: dict[tuple, tuple[weakref.ref, tuple[HookType, ...], Rehearsal]] = {}
_REHEARSED_KEPT = 16


def model_state(model: nn.Module) -> tuple | None:
    """What a meta pass of ``model`` depends on besides its inputs: each module's class, its plain Python
    settings (``inplace``, ``training``, a flag its forward reads), a ``forward`` of its own and the hooks
    on it (by identity), the global module hooks, and every parameter's and buffer's shape, strides,
    dtype, device and ``requires_grad``; ``None`` when a module holds a setting that is not plain data.
    Taken before the run's own hooks are attached (``runner.attach``)."""
    modules = []
    for name, module in model.named_modules(remove_duplicate=False):
        settings = _plain_settings(module)
        if settings is None:
            return None
        modules.append((name, type(module), settings))
    tensors = tuple((name, tuple(t.shape), t.stride(), t.dtype, t.device, t.requires_grad)
                    for name, t in (*model.named_parameters(remove_duplicate=False), *model.named_buffers()))
    return tuple(modules), tensors, _hook_ids(vars(nn_module))


def _plain_settings(module: nn.Module) -> tuple | None:
    """``module``'s attributes other than its submodules, parameters and buffers: plain values as they are,
    hook dictionaries and a ``forward`` of its own by identity; ``None`` for anything else."""
    settings = []
    for attr, value in vars(module).items():
        if attr in ("_modules", "_parameters", "_buffers"):
            continue
        if "hook" in attr and isinstance(value, dict):
            settings.append((attr, tuple(map(id, value.values()))))
        elif attr == "forward":
            settings.append((attr, id(value)))
        else:
            plain = _plain(value)
            if plain is _NOT_PLAIN:
                return None
            settings.append((attr, plain))
    return tuple(settings)


def _hook_ids(namespace: dict) -> tuple:
    return tuple((attr, tuple(map(id, value.values()))) for attr, value in namespace.items()
                 if "hook" in attr and isinstance(value, dict))


_NOT_PLAIN = object()


def _plain(value: Any) -> Any:
    """``value`` as a comparable key when it is plain data (``None``, numbers, text, a dtype, sets and
    sequences of them), else ``_NOT_PLAIN``."""
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return type(value), value
    if isinstance(value, (tuple, list, set, frozenset)):
        items = tuple(map(_plain, sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value))
        return _NOT_PLAIN if any(item is _NOT_PLAIN for item in items) else (type(value), items)
    if isinstance(value, dict) and not value:
        return dict, ()
    return _NOT_PLAIN


def _first_call_key(kept: tuple, name: str, args: tuple, kwargs: dict, budget: str | None) -> tuple | None:
    """The key of a first call's rehearsal: the kept entries and model (``kept``), the module called, the
    inputs' shapes, strides, dtypes and ``requires_grad`` (other arguments as plain data), gradient mode,
    autocast and the default dtype; ``None`` when an argument is not plain data."""
    inputs = []
    for _, leaf in walk((args, kwargs)):
        inputs.append((tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device, leaf.requires_grad))
    plain = _plain([v for v in _leaves((args, kwargs)) if not isinstance(v, torch.Tensor)])
    if plain is _NOT_PLAIN:
        return None
    modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.get_default_dtype(),
             torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda"))
    return id(kept[0]), id(kept[1]), kept[2], name, tuple(inputs), plain, tuple(kwargs), modes, budget


def _leaves(obj: Any) -> Iterator[Any]:
    if isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _leaves(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _leaves(item)
    else:
        yield obj


def rehearse_first_call(model: nn.Module, session: HookSession, budget: str | None = None,
                        kept: tuple[HookType, ...] | None = None, state: tuple | None = None) -> Rehearsal:
    """Rehearse ``session``'s attached entries at the first call of any module of ``model`` (the
    outermost one called: the model, or the part a framework calls), before that call computes anything.

    Returns the ``Rehearsal`` that call fills in (``input_shape``, ``modules``, and what one step
    records and holds, which the gate's ``check_budget`` bounds by ``budget``, ``memory.budget``).
    A mistake is a one-line ``ConfigError`` raised from that call; a model the meta device cannot
    run is left to the real call. Entries whose lifetime starts later are not attached yet, and not
    rehearsed; neither is a sharded model (FSDP2: with a ``budget`` it is refused, as nothing plans
    what its entries hold), nor a model whose first call ``torch.compile`` traces (a meta pass cannot
    be traced; the hooks would break the graph), whose real first call reports its own errors; with
    a ``budget`` that call is rehearsed outside the graph, at the cost of one graph break there.
    The one-shot hooks belong to ``session``, and leave at that call. ``kept``: the kept plan's entries
    the session's are fresh copies of, and ``state`` the model's ``model_state`` before they were
    attached: a call rehearsed before with both and inputs of the same shapes is not rehearsed again.
    """
    found = Rehearsal(type(model).__name__, sum(p.numel() for p in model.parameters()), [])
    if not session.hooks:
        return found  # nothing to rehearse: the model's calls stay free of one-shot hooks (a compiled bare model)
    if any(is_sharded(p) for p in model.parameters()):
        check_budget(budget, None, "a sharded (FSDP2) model is not rehearsed on the meta device")
        return found  # FSDP2's pre-forward gathers the shards: a meta stand-in would break its state
    names = {id(m): name for name, m in model.named_modules()}
    handles = []

    def first_call(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if torch.compiler.is_compiling() and budget is None:
            return  # traced by torch.compile: a meta pass cannot be traced; the compiled call reports its own errors
        rehearse_now(module, args, kwargs)

    @torch.compiler.disable  # traced, with a budget: one graph break, at the first call, for a rehearsal outside the graph
    def rehearse_now(module: nn.Module, args: tuple, kwargs: dict) -> None:
        for handle in handles:
            handle.remove()
        name = names[id(module)]
        key = None if kept is None or state is None else _first_call_key((model, kept, state), name, args, kwargs, budget)
        held = _REHEARSED.pop(key, None) if key is not None else None
        if held is not None and held[0]() is model and held[1] is kept:
            _REHEARSED[key] = held  # the newest again
            vars(found).update(copy.deepcopy(vars(held[2])))
            check_budget(budget, found)
            return
        ran = rehearse_call(module, name, args, kwargs, session, found)
        check_budget(budget, found if ran else None)
        if key is not None and ran:
            _REHEARSED[key] = (weakref.ref(model), kept, copy.deepcopy(found))
            while len(_REHEARSED) > _REHEARSED_KEPT:
                del _REHEARSED[next(iter(_REHEARSED))]

    for module in model.modules():
        handles.append(session.add(module.register_forward_pre_hook(first_call, prepend=True, with_kwargs=True)))
    return found


def rehearse_call(module: nn.Module, name: str, args: tuple, kwargs: dict, session: HookSession,
                   found: Rehearsal) -> bool:
    """One meta pass (and, with gradients on, a backward of its outputs' sum) of ``module`` on
    ``args``' shapes, through the session's entries; fills ``found`` and returns ``True``, returns
    ``False`` where the meta device cannot run it, or raises ``ConfigError``."""
    recorder = session.recorder
    shapes = _ModuleShapes(module, prefix=name)
    try:
        with torch.random.fork_rng(devices=[]), recorder.tallied_aside() as tally, shapes, \
                contextlib.redirect_stdout(io.StringIO()):
            state = {n: _meta(t) for n, t in [*module.named_parameters(), *module.named_buffers()]}
            out = functional_call(module, state, _meta(args), _meta(kwargs))
            outputs = [t for _, t in walk(out) if t.requires_grad and t.is_floating_point()]
            if torch.is_grad_enabled() and outputs:
                with recorder.backward_pass():
                    torch.stack([t.float().sum() for t in outputs]).sum().backward()
                session.after_backward()  # a hook PyTorch dropped is named here, as in the CLI's rehearsal
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - a hook's mistake is one line; the rest is left to the real call
        explained = _explain(exc, session.hooks, shapes, None)
        if explained is not None:
            raise explained from None
        return False
    found.input_shape = [list(t.shape) for _, t in walk((args, kwargs))]
    found.modules = [(full, type(m).__name__, shapes.seen.get(full, "-"))
                     for m, full in ((m, shapes.names[id(m)]) for m in module.modules())]
    found.records = {key: list(counts) for key, counts in tally.items()}
    found.held = {hook.name: held for hook in session.hooks if (held := hook.held_bytes())}
    return True


def _meta(obj: Any) -> Any:
    """``obj`` with every tensor (inside tuples, lists and dicts) replaced by an empty meta tensor
    of its shape, dtype and ``requires_grad``."""
    if isinstance(obj, torch.Tensor):
        return torch.empty_like(obj, device="meta").requires_grad_(obj.requires_grad)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_meta(item) for item in obj)
    if isinstance(obj, dict):
        return {key: _meta(value) for key, value in obj.items()}
    return obj


def _raised_by_torch(exc: BaseException) -> bool:
    """Whether the innermost Python frame is PyTorch's own (a layer refusing its input), not user code."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and Path(frames[-1].filename).resolve().is_relative_to(_TORCH_DIR)


_TORCH_DIR = Path(torch.__file__).resolve().parent


class _ModuleShapes:
    """Global module hooks recording each module's output shapes and the innermost module that raised."""

    def __init__(self, model: nn.Module, prefix: str = "") -> None:
        self.names = {id(m): f"{prefix}.{n}" if prefix and n else prefix or n for n, m in model.named_modules()}
        self.seen: dict[str, str] = {}
        self.failed: tuple[str, str] | None = None
        self._stack: list[nn.Module] = []
        self._handles: list = []

    def __enter__(self) -> _ModuleShapes:
        self._handles = [nn_module.register_module_forward_pre_hook(self._pre),
                         nn_module.register_module_forward_hook(self._post, always_call=True)]
        return self

    def __exit__(self, *exc_info) -> None:
        for handle in self._handles:
            handle.remove()

    def _pre(self, module, args) -> None:
        self._stack.append(module)

    def _post(self, module, args, output) -> None:
        if self._stack and self._stack[-1] is module:
            self._stack.pop()
        name = self.names.get(id(module))
        if name is None:
            return
        if output is None and self.failed is None:  # always_call: forward raised inside this module
            self.failed = (name, type(module).__name__)
        elif name not in self.seen and output is not None:
            self.seen[name] = " ".join(str(list(t.shape)) for _, t in walk(output)) or "-"
