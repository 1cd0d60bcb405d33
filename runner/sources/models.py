"""Models by name: the tutorials' small networks, any torchvision classifier, or any ``_target_``."""
from __future__ import annotations

from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from common.errors import ConfigError

from runner.config.registry import MODELS, check_model_name
from runner.config.schema import MODEL_RUN_KEYS as RUN_KEYS
from runner.config.schema import HFModel, NamedModel
from runner.sources.hf import load_hf
from runner.sources.targets import builds, check_arguments, locate

#: Factories that build a model without saying so in an annotation, allowed by name.
ALLOWED_FACTORIES = ("torchvision.models.get_model",)


class MLP(nn.Module):
    """Linear(100, 200) -> ReLU -> Linear(200, 5), named ``fc1``, ``relu``, ``fc2``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(100, 200)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(200, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x)))


class ConvNet(nn.Module):
    """The tutorials' ``myNet``: Conv2d(3, 10, 2, stride=2) -> ReLU -> flatten -> Linear(160, 5)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 10, 2, stride=2)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(160, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.flatten(self.relu(self.conv(x))))


class DigitsCNN(nn.Module):
    """For ``data=digits`` ([N, 1, 8, 8], 10 classes): conv1 -> relu1 -> pool1 -> conv2 -> relu2 -> pool2
    -> flatten -> fc. Kept spatial (no global average pool): with it, plain SGD at lr 0.1 stayed near
    chance for 300 steps; this reaches ~95% held-out accuracy in as many."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(32 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.relu1(self.conv1(x)))
        return self.fc(self.flatten(self.pool2(self.relu2(self.conv2(x)))))


#: Registered models are built as ``build(cfg)``; they have no pretrained ``weights`` (the gate refuses them).
_SMALL = {"mlp": MLP, "convnet": ConvNet, "digits_cnn": DigitsCNN, "linear": lambda: nn.Linear(3, 3)}
for _name, _make in _SMALL.items():
    MODELS.register(_name, schema=NamedModel)(lambda cfg, make=_make: make())
MODELS.register("hf", schema=HFModel)(load_hf)


def gpt2_tiny(n_layer: int = 2, n_embd: int = 32, n_head: int = 2, vocab_size: int = 100,
              n_positions: int = 64) -> nn.Module:
    """A randomly initialised GPT-2 from ``transformers`` (the optional extra), built offline.

    Its blocks take keyword arguments and it returns a dict-like ``ModelOutput``: the real test of
    ``with_kwargs``, of walking non-tensor outputs and of pattern selectors.
    """
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        raise ConfigError("model=gpt2_tiny needs the 'transformers' package: pip install -e '.[transformers]'") from None
    config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab_size,
                        n_positions=n_positions, use_cache=False, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def check_target(cfg: DictConfig) -> None:
    """Refuse a ``_target_`` that does not build a model, before anything is called.

    It may name a subclass of ``nn.Module``, a callable whose return annotation is one
    (torchvision's builders, the user's own factory with ``-> nn.Module``),
    ``torchvision.models.get_model`` or a ``from_pretrained``; the keys must be arguments it takes.
    """
    path = str(cfg._target_)
    target = locate(path, "model._target_")
    if not (path in ALLOWED_FACTORIES or path.endswith(".from_pretrained") or builds(target, nn.Module)):
        raise ConfigError(f"model._target_: '{path}' is not an nn.Module class, nor a function annotated to "
                          f"return one (-> nn.Module), nor one of {', '.join(ALLOWED_FACTORIES)} or a "
                          f"from_pretrained; refused without calling it")
    check_arguments(target, path, [k for k in cfg.keys() if k not in RUN_KEYS and k != "_target_"], "model.")


def build_model(cfg: DictConfig) -> nn.Module:
    """Build the model a checked ``model`` config names (the gate checked it: ``check_target``,
    the checkpoint file), then load ``checkpoint`` if one is given.

    ``_target_`` wins over ``name``: every key except ``RUN_KEYS`` goes to Hydra's
    ``instantiate`` (``model=custom model._target_=pkg.Net +model.width=64``). ``name: hf`` loads
    a Hugging Face directory (``runner.sources.hf``). Otherwise ``name`` is registered in
    ``MODELS`` (``build(cfg)``) or a torchvision model, built with ``weights``
    (``null`` = random init; a weights name such as ``DEFAULT`` downloads).
    """
    if cfg.get("_target_"):
        kwargs = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k not in RUN_KEYS}
        try:
            model = instantiate(kwargs)
        except Exception as exc:  # Hydra wraps import and constructor errors alike
            raise ConfigError(f"model._target_: cannot build '{cfg._target_}': {str(exc).splitlines()[0]}") from None
    elif cfg.get("name") in MODELS:
        model = MODELS.get(cfg.name).build(cfg)
    else:
        model = _named_model(cfg.get("name"), cfg.get("weights"))
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model: built a {type(model).__name__}, not a torch.nn.Module")
    if cfg.get("checkpoint"):
        load_checkpoint(model, Path(cfg.checkpoint))
    return model


def _named_model(name: str | None, weights: str | None) -> nn.Module:
    import torchvision  # 1.7 s of CPU (it imports torch._dynamo): only for a model of its own

    check_model_name(name, MODELS, torchvision.models.list_models())
    try:
        return torchvision.models.get_model(name, weights=weights)
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"model.weights: '{weights}' is not a weights name of {name}: {exc}") from None
    except OSError as exc:  # urllib's URLError is an OSError: no network for the download
        raise ConfigError(f"model.weights={weights}: download failed ({exc}); "
                          f"use model.checkpoint=PATH to load a local state_dict") from None


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file  # the gate checked that it is installed

    return load_file(path, device="cpu")


def load_checkpoint(model: nn.Module, path: Path, device: str = "cpu") -> None:
    """A state_dict from ``.safetensors`` or (anything else) ``torch.load(weights_only=True)``, all keys fitting.

    ``device="meta"`` (the meta-device rehearsal, on a model built there) checks that it fits without
    reading a ``torch.save`` file's tensor data: a checkpoint that does not fit is refused before any
    directory is written.
    """
    try:
        state = _read_safetensors(path) if path.suffix == ".safetensors" else \
            torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - empty, truncated, corrupt, TorchScript or unsafe pickles
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ConfigError(f"model.checkpoint: cannot read '{path}' as a weights-only state_dict: {detail}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ConfigError(f"model.checkpoint: '{path}' holds a {type(state).__name__}, not a state_dict")
    if device == "meta":  # safetensors are read on the CPU; copied into meta parameters they would warn
        state = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError(f"model.checkpoint: '{path}' does not fit the model: {detail[:300]}") from None
